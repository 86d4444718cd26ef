"""A short emulated spot replay: a 3-type cluster of one node per type whose pools follow small traces (one node
leaves unannounced, one after a spot notice through its own fake AWS metadata endpoint; both come back), through the one
controller with real text. The final record holds every step once with the samples and losses of a
single-process run on the same sample order; the announced removal costs no step of work."""
from __future__ import annotations

import os
import shutil
import sysconfig

import pytest

ray = pytest.importorskip("ray")

from autohet_ray.cluster.spec import cluster_from_dict  # noqa: E402
from autohet_ray.storage.spec import storage_spec  # noqa: E402
from autohet_ray.metrics.reference_check import reference_check  # noqa: E402
from autohet_ray.emulate.replay import Replay, ReplayCluster  # noqa: E402
from autohet_ray.replay.emulated import change_phases, committed_lost, node_actions, pool_node_names  # noqa: E402
from autohet_ray.model.spec import model_from_dict  # noqa: E402
from autohet_ray.orchestrate.controller import Controller  # noqa: E402
from autohet_ray.job.config import TrainJob  # noqa: E402
from autohet_ray.replay.timeline import build_timeline  # noqa: E402
from autohet_ray.replay.traces import PoolTrace, trace_from_rows  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]
CLUSTER = {"name": "replay-3", "nodes": [{"name": "a10-0", "device": "A10", "count": 1},
                                         {"name": "l20-0", "device": "L20", "count": 1},
                                         {"name": "v100-0", "device": "V100", "count": 1}]}
MODEL = {"name": "replay-gpt", "family": "gpt", "num_layers": 4, "hidden": 32, "num_heads": 4, "num_kv_heads": 4,
         "ffn_hidden": 128, "vocab_size": 512, "max_seq_len": 16}
PRICED = MODEL | {"name": "priced-gpt", "hidden": 2048, "num_heads": 16, "num_kv_heads": 16, "ffn_hidden": 8192,
                  "vocab_size": 32000, "max_seq_len": 2048}
HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_failure_threshold": 15,
                 "health_check_initial_delay_ms": 1000}
COMPRESSION, NOTICE_S = 3.0, 24.0        # trace s per wall s; the notice lead (8 wall s)


def stage(layers, device, node) -> dict:
    return {"layers": list(layers), "tp": 1, "device_type": device, "node": node, "devices": [0]}


# the first plan runs on every node (re-plans are the planner's): [a10-0 -> l20-0], [v100-0]
FIRST_PLAN = {"schema_version": 1, "model": "priced-gpt", "global_batch": 8, "micro_batch": 1, "seq_len": 2048,
              "pipelines": [{"num_microbatches": 4, "stages": [stage((0, 2), "A10", "a10-0"),
                                                               stage((2, 4), "L20", "l20-0")]},
                            {"num_microbatches": 4, "stages": [stage((0, 4), "V100", "v100-0")]}]}


def schedule():
    """A10: 1 -> 0 (t=30, unannounced) -> 1 (t=100); L20: 1 -> 0 (t=60, after a notice) -> 1 (t=130); V100 stays."""
    cluster = cluster_from_dict(CLUSTER)
    pools = [PoolTrace(pool="A10", nodes=1, trace=trace_from_rows("a10", [(0, 1), (30, 0), (100, 1)]), cycle=False),
             PoolTrace(pool="L20", nodes=1, trace=trace_from_rows("l20", [(0, 1), (60, 0), (130, 1)]), cycle=False),
             PoolTrace(pool="V100", nodes=1, trace=None)]
    timeline = build_timeline(pools, 150.0)
    alive, actions = node_actions(timeline, pool_node_names(cluster, timeline.pools), NOTICE_S)
    actions = [a for a in actions if not (a.kind == "notice" and a.node == "a10-0")]   # a10-0 goes unannounced
    return cluster, timeline, alive, actions


def test_schedule_follows_the_traces():
    _, timeline, alive, actions = schedule()
    assert len(timeline.events) == 4 and alive == ["a10-0", "l20-0", "v100-0"]
    assert [(a.time_s, a.kind, a.node) for a in actions] == [
        (30.0, "remove", "a10-0"), (36.0, "notice", "l20-0"), (60.0, "remove", "l20-0"), (100.0, "add", "a10-0"),
        (130.0, "add", "l20-0")]


def prepare(out_dir) -> str:
    from autohet_ray.orchestrate.data_prepare import prepare_dataset
    corpus = out_dir / "corpus"
    corpus.mkdir()
    stdlib = sorted((e for e in os.scandir(sysconfig.get_paths()["stdlib"]) if e.name.endswith(".py")),
                    key=lambda e: e.name)
    for entry in [e for e in stdlib if 2_000 < e.stat().st_size < 20_000][:12]:
        shutil.copy(entry.path, corpus / entry.name)
    prepare_dataset([str(corpus)], str(out_dir / "data"), train_vocab=512, workers=1, shard_bytes=64 << 10)
    return str(out_dir / "data")


def test_replay_reads_each_sample_once_matches_the_reference_and_a_notice_loses_no_work(tmp_path):
    cluster, timeline, alive, actions = schedule()
    with ReplayCluster(cluster, alive, system_config=HEALTH_CHECKS) as rc:
        data = prepare(tmp_path)
        job = TrainJob(model=MODEL, priced_as=PRICED, priced_seq_len=2048, cluster=CLUSTER, global_batch=8,
                       plan=FIRST_PLAN, data=data, storage=storage_spec(str(tmp_path / "storage")), elastic=True, dtype="float64",
                       checkpoint_every=5, iteration_wall_s=0.5, baselines=False, plan_time_limit_s=2.0,
                       collective_timeout_s=30, detect_timeout_s=30)
        ctl = Controller(job)
        ctl.prepare_joins = False     # joins switch at once: the 50 s window leaves a prepared join no time
        try:
            ctl.start()
            log = Replay(ctl, rc, actions, compression=COMPRESSION, alive=alive).run(timeline.window_s)
        finally:
            ctl.close()
    applied = [(a["kind"], a["node"]) for a in log.applied]
    assert applied == [(a.kind, a.node) for a in actions]                      # every action, in order
    kinds = [c["kind"] for c in log.changes]
    assert kinds.count("recovery") >= 1 and "notice" in kinds and kinds.count("join") >= 1, kinds
    notice = next(c for c in log.changes if c["kind"] == "notice")
    assert notice["nodes"] == ["l20-0"] and notice["lost_steps"] == 0
    recovery = next(c for c in log.changes if c["kind"] == "recovery")
    assert recovery["lost_nodes"] == ["a10-0"], recovery["message"]
    assert committed_lost(log.changes) == 0
    assert all(change_phases(c)["replan_s"] > 0 for c in log.changes)
    check = reference_check(ctl.history, data_dir=data, model=model_from_dict(MODEL), global_batch=8,
                            seq_len=16, seed=0, optimizer=job.optimizer)
    assert check["steps"] >= 10 and check["steps_present"]
    assert check["sample_ids_equal"] and check["samples_once"]                 # exactly once
    assert check["losses_equal"], check["max_rel_loss_diff"]                   # within 1e-5 relative
