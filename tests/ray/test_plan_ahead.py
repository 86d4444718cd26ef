"""Plan-ahead and the snapshot rate the replay prices, on a real emulated Ray cluster:
- each rank snapshots exactly the bytes the replay's model (benchmarks/spot_replay_snapshot.py, the runtime's
  writer assignment) says, and data-parallel copies are not all written;
- a node that joins is prepared while the job trains (its state planned, its worker and node store started)
  and the switch at a step boundary plans nothing and starts no process."""
from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from autohet_ray.job.config import TrainJob  # noqa: E402
from autohet_ray.model.spec import load_model  # noqa: E402
from autohet_ray.orchestrate.controller import Controller  # noqa: E402
from autohet_ray.storage.spec import storage_spec  # noqa: E402
from ray_helpers import FAST_HEALTH_CHECKS, THREE_NODES, asymmetric_plan  # noqa: E402
from shared_clusters import shared_cluster  # noqa: E402

from benchmarks.spot_replay_join_cost import NODES, measure_join  # noqa: E402
from benchmarks.spot_replay_snapshot import snapshot_bytes  # noqa: E402

pytestmark = pytest.mark.timeout(600)
assert NODES == THREE_NODES


cluster = shared_cluster(THREE_NODES, system_config=FAST_HEALTH_CHECKS, changes_nodes=True)


def test_each_rank_snapshots_the_bytes_the_replay_prices(cluster, tmp_path):
    import torch

    from autohet_ray.plan.schema import plan_from_dict
    spec = load_model("tiny-gpt")
    job = TrainJob(model=spec.to_dict(), cluster=THREE_NODES, global_batch=4, dtype="float64", elastic=True,
                   storage=storage_spec(str(tmp_path / "cloud")), checkpoint_every=0, plan=asymmetric_plan(),
                   baselines=False, collective_timeout_s=60)
    ctl = Controller(job)
    try:
        ctl.start()
        for _ in range(2):
            ctl.step()
        records = ctl.group.call("fast_records", 2, timeout_s=120)
        node_gpu = {n.name: n.device_type for n in ctl.found.nodes}
    finally:
        ctl.close()
    model = snapshot_bytes(plan_from_dict(asymmetric_plan()), spec, node_gpu, master_dtype=torch.float64)
    for rank, recs in enumerate(records):
        assert {(r.name, r.chunk) for r in recs} == model.owned[rank]        # what each rank snapshots
        blobs = sum(r.nbytes for r in recs)                                 # payload + a small header per chunk
        assert model.copied[rank] < blobs <= model.copied[rank] + 128 * len(recs)
    assert sum(model.copied.values()) < model.held / 1.9   # pipeline 1 holds every layer again: not all written
    stored = {(r.name, r.chunk): len(r.replicas) for recs in records for r in recs}
    assert set(stored) == {(n, c) for items in model.owned.values() for n, c in items}
    assert sum(len(r.replicas) for recs in records for r in recs) == 2 * len(stored)   # 2 node-store copies each


def test_a_joined_node_is_prepared_while_the_job_trains(cluster, tmp_path):
    row = measure_join(cluster, str(tmp_path / "cloud"), prepare=True, iteration_wall_s=0.5)
    assert row["plan_source"] == "planned ahead" and row["prepared_workers"] == 1
    assert row["steps_trained_while_preparing"] >= 1
    assert any(stage.startswith("b:") for pipeline in row["plan"] for stage in pipeline)   # b is used
    assert row["reused_actors"] == row["num_ranks"]        # no process started at the switch
    assert row["replan_s"] < 0.05 and row["keepers_s"] < 1.0
