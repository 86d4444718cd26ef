"""Losing a node that runs no worker but holds node-store copies (its keeper only) on a 3-node emulated Ray
cluster: the job goes on, the newest committed step is restored whole, the copies that were on the lost node
get a second live copy on the survivors, and the losses equal the uninterrupted single-process run's."""
from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from autohet_ray.checkpoint import find_manifest  # noqa: E402
from autohet_ray.elastic.keeper import get_keeper  # noqa: E402
from autohet_ray.job.config import TrainJob  # noqa: E402
from autohet_ray.model.spec import load_model  # noqa: E402
from autohet_ray.orchestrate.controller import Controller  # noqa: E402
from autohet_ray.storage.spec import storage_spec  # noqa: E402
from ray_helpers import FAST_HEALTH_CHECKS, THREE_NODES, reference_losses, stage  # noqa: E402
from shared_clusters import shared_cluster  # noqa: E402

pytestmark = pytest.mark.timeout(400)
SPEC = load_model("tiny-gpt")


cluster = shared_cluster(THREE_NODES, system_config=FAST_HEALTH_CHECKS, changes_nodes=True)


def plan_without_b() -> dict:
    """One pipeline, H20 TP2 on c [0,2) -> H800 on a [2,4): node b runs no worker, its keeper takes copies."""
    return {"schema_version": 1, "model": "tiny-gpt", "global_batch": 4, "micro_batch": 1, "seq_len": 16,
            "pipelines": [{"num_microbatches": 4, "stages": [stage((0, 2), 2, "H20", "c", (0, 1)),
                                                             stage((2, 4), 1, "H800", "a", (0,))]}]}


def _holders(ctl: Controller, step: int) -> dict[str, set[str]]:
    """Chunk key -> the live nodes whose store holds it (asked of each keeper), for the records of `step`."""
    manifest = find_manifest(list(ctl.committer.keepers.values()), step)
    out = {}
    for record in manifest.records:
        out[record.key] = {node for node, spec in ctl.committer.keeper_specs.items()
                           if ray.get(get_keeper(ctl.job_id, spec["node_id"]).has.remote(record.key), timeout=30)}
    return out


def test_losing_a_node_with_only_store_copies_keeps_training_and_every_committed_step(cluster, tmp_path):
    job = TrainJob(model=SPEC.to_dict(), cluster=THREE_NODES, global_batch=4, storage=storage_spec(str(tmp_path)),
                   elastic=True, dtype="float64", checkpoint_every=100, collective_timeout_s=30,
                   detect_timeout_s=30, plan=plan_without_b(), baselines=False)
    ctl = Controller(job)
    try:
        ctl.start()
        losses = [ctl.step()["loss"] for _ in range(3)]
        committed = ctl.committer.committed[-1]
        manifest = find_manifest(list(ctl.committer.keepers.values()), committed)
        on_b = [r.key for r in manifest.records if "keeper-b" in r.replicas]
        assert on_b, "the test needs copies on node b"
        victim = next(n for n in cluster.list_all_nodes() if n.node_id == ctl.found.node_ids["b"])
        cluster.remove_node(victim, allow_graceful=False)
        steps = [ctl.step()]
        while "recovery" not in steps[-1] and len(steps) < 3:  # the next snapshot's push to b fails
            steps.append(ctl.step())
        rec = steps[-1].get("recovery")
        assert rec is not None, "the loss of b never surfaced"
        restored = rec["restored_step"]
        ray.get(ctl.committer.copies, timeout=60)          # the re-replication after the loss
        holders = _holders(ctl, restored)
        steps += [ctl.step() for _ in range(2)]
        outcome = ctl.close()
    finally:
        ctl.close()
    assert rec["lost_nodes"] == ["b"] and rec["dead_ranks"] == [] and "node b" in rec["message"]
    assert restored >= committed                            # nothing committed before the loss is lost
    assert rec["rereplicated_chunks"] > 0
    assert set(holders) >= set(on_b)
    assert all(len(nodes) >= 2 for nodes in holders.values()), holders   # two live copies again
    assert not [s for s in steps if "recovery" in s][1:]
    first = next(i for i, s in enumerate(steps) if "recovery" in s)
    after = [s["loss"] for s in steps[first:]]                # steps restored+1, restored+2, ...
    assert outcome["step"] == restored + len(after)           # the newest step reached the storage at close
    ref = reference_losses(restored + len(after))
    assert losses == pytest.approx(ref[:3], rel=1e-6)
    assert after == pytest.approx(ref[restored:], rel=1e-6)
