"""Emulated spot replay, end to end (EMULATED: fake GPUs, real CPU compute on this machine's shared cores).

An elastic job (the one controller, TrainJob(elastic=True)) trains on an emulated Ray cluster whose GPU-type
pools follow measured AWS spot traces (shared/traces/: one trace per pool, scaled to the pool's nodes, from
`--start-s`, each shifted by its own offset), on a clock compressed `--compression` trace seconds per wall
second. Nodes leave by `remove_node(allow_graceful=False)` mid-step and join by `add_node`; with
`--notice-s S` each removal is announced S trace seconds before on that node's fake AWS metadata endpoint.
Ops are paced to the emulated devices (one predicted iteration of the first plan lasts `--iteration-wall-s`).
The model that runs is small (float64, real text prepared with `autohet data prepare`); plans are priced as
`--priced-as` (same layer count). After the replay the record is checked against a single-process run of the
same steps on the same sample order. Ends with one JSON line.

    python -m benchmarks run spot-replay-emulated -- [--events 20] [--compression 10] [--notice-s 120]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACES = os.path.join(os.path.dirname(REPO), "shared", "traces")

CLUSTER = {"name": "spot-replay-3-type", "nodes": [
    {"name": "a10-0", "device": "A10", "count": 1}, {"name": "a10-1", "device": "A10", "count": 1},
    {"name": "l20-0", "device": "L20", "count": 1}, {"name": "l20-1", "device": "L20", "count": 1},
    {"name": "v100-0", "device": "V100", "count": 1}]}
# the busiest trace for the cheapest type; the g4dn-1d trace shifted so its busy hours overlap the 1c trace's
DEFAULT_TRACES = [f"A10={TRACES}/aws-g4dn-us-east-1c.csv@0", f"L20={TRACES}/aws-g4dn-us-east-1d.csv@14033",
                  f"V100={TRACES}/aws-p2-us-east-1e.csv@0"]
MODEL = {"name": "replay-gpt", "family": "gpt", "num_layers": 4, "hidden": 32, "num_heads": 4, "num_kv_heads": 4,
         "ffn_hidden": 128, "vocab_size": 512, "max_seq_len": 16}
PRICED_AS = {"name": "priced-gpt-4l", "family": "gpt", "num_layers": 4, "hidden": 2048, "num_heads": 16,
             "num_kv_heads": 16, "ffn_hidden": 8192, "vocab_size": 32000, "max_seq_len": 2048}
# A removed node's raylet refuses connections at once (the controller's probe settles the loss); Ray's own health
# checks only back it up, lenient enough that a node stalled by the shared cores is not declared dead.
HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_failure_threshold": 15,
                 "health_check_initial_delay_ms": 1000}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cluster", help="cluster file (YAML/JSON); default: 2 A10 + 2 L20 + 1 V100 nodes, 1 GPU each")
    p.add_argument("--model", help="model that runs (preset or YAML); default: a 4-layer GPT, vocabulary 512")
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--trace", action="append", metavar="TYPE=FILE[@OFFSET_S]",
                   help="the trace a GPU type's pool follows (repeat per type); default: the three shared traces")
    p.add_argument("--start-s", type=float, default=2000.0, help="trace second the replay starts at")
    p.add_argument("--events", type=int, default=20, help="consecutive events to replay")
    p.add_argument("--tail-s", type=float, default=60.0, help="trace seconds replayed after the last event")
    p.add_argument("--compression", type=float, default=10.0, help="trace seconds per wall second")
    p.add_argument("--notice-s", type=float, default=0.0, help="spot notice lead before each removal (trace s)")
    p.add_argument("--iteration-wall-s", type=float, default=1.0)
    p.add_argument("--data", help="a prepared dataset (default: prepare Python's stdlib sources)")
    p.add_argument("--plan-time-limit", type=float, default=3.0)
    p.add_argument("--out", help="write the full log (JSON) here")
    return p.parse_args(argv)


def load_inputs(args):
    from autohet_ray.cluster.spec import cluster_from_dict, load_cluster
    from autohet_ray.model.spec import load_model, model_from_dict
    cluster = load_cluster(args.cluster) if args.cluster else cluster_from_dict(CLUSTER)
    model = load_model(args.model) if args.model else model_from_dict(MODEL)
    return cluster, model, model_from_dict(PRICED_AS | {"num_layers": model.num_layers})


def build_schedule(cluster, traces: list[str], start_s: float, events: int, tail_s: float, notice_s: float):
    """The pools' timeline from `start_s`, cut after `events` events (+ tail); the start nodes and actions."""
    from autohet_ray import ConfigError
    from autohet_ray.replay.emulated import node_actions, pool_node_names
    from autohet_ray.replay.timeline import build_timeline
    from autohet_ray.replay.traces import PoolTrace, load_trace
    pools = []
    for spec in traces:
        device, _, rest = spec.partition("=")
        path, _, offset = rest.partition("@")
        count = sum(1 for n in cluster.nodes if n.device == device)
        if not count:
            raise ConfigError(f"--trace {spec}: the cluster has no {device} nodes")
        pools.append(PoolTrace(pool=device, nodes=count, trace=load_trace(path),
                               offset_s=start_s + float(offset or 0)))
    full = build_timeline(pools, 10 * 24 * 3600.0)
    if len(full.events) < events:
        raise ConfigError(f"only {len(full.events)} events after --start-s {start_s}; asked for {events}")
    end_s = full.events[events - 1].time_s + tail_s
    timeline = build_timeline(pools, end_s)
    names = pool_node_names(cluster, timeline.pools)
    alive, actions = node_actions(timeline, names, notice_s)
    return timeline, alive, actions, end_s


def prepare_data(out_dir: str) -> str:
    """Python's own stdlib sources, tokenized on the running Ray cluster (a trained 512-id BPE)."""
    from autohet_ray.orchestrate.data_prepare import prepare_dataset
    corpus = os.path.join(out_dir, "corpus")
    os.makedirs(corpus)
    stdlib = sorted((e for e in os.scandir(sysconfig.get_paths()["stdlib"]) if e.name.endswith(".py")),
                    key=lambda e: e.name)
    for entry in [e for e in stdlib if 4_000 < e.stat().st_size < 40_000][:40]:
        shutil.copy(entry.path, corpus)
    data = os.path.join(out_dir, "data")
    prepare_dataset([corpus], data, train_vocab=512, workers=1, shard_bytes=256 << 10)
    return data


def make_job(args, cluster, model, priced, data: str, storage: str):
    from autohet_ray.storage.spec import storage_spec
    from autohet_ray.job.config import TrainJob
    return TrainJob(model=model.to_dict(), priced_as=priced.to_dict(), priced_seq_len=priced.max_seq_len,
                    cluster=cluster.to_dict(), global_batch=args.global_batch, data=data,
                    storage=storage_spec(storage), elastic=True, dtype="float64", checkpoint_every=10,
                    iteration_wall_s=args.iteration_wall_s, baselines=False, plan_time_limit_s=args.plan_time_limit,
                    collective_timeout_s=30, detect_timeout_s=30, setup_timeout_s=180)


def progress(metrics: dict, replay) -> None:
    rec = " (recovered)" if "recovery" in metrics else ""
    print(f"  trace {replay.trace_now():7.0f} s  step {metrics['step']:4d}  loss {metrics['loss']:.4f}  "
          f"{metrics['wall_s']:.2f} s{rec}  alive {sorted(replay.alive)}", flush=True)


def run(args) -> dict:
    from autohet_ray.emulate.replay import Replay, ReplayCluster
    from autohet_ray.orchestrate.controller import Controller
    cluster, model, priced = load_inputs(args)
    timeline, alive, actions, end_s = build_schedule(cluster, args.trace or DEFAULT_TRACES, args.start_s,
                                                     args.events, args.tail_s, args.notice_s)
    print(f"replaying {len(timeline.events)} events over {end_s:.0f} trace s at {args.compression:g}x "
          f"(~{end_s / args.compression:.0f} wall s); start {dict(zip(timeline.pools, timeline.initial))}",
          flush=True)
    work = tempfile.mkdtemp(prefix="spot-replay-")
    started = time.perf_counter()
    with ReplayCluster(cluster, alive, system_config=HEALTH_CHECKS) as rc:
        data = args.data or prepare_data(work)
        ctl = Controller(make_job(args, cluster, model, priced, data, os.path.join(work, "storage")))
        try:
            launch = ctl.start()
            replay = Replay(ctl, rc, actions, compression=args.compression, alive=alive)
            log = replay.run(end_s, progress=progress)
        finally:
            secured = ctl.close()
            stop_watchers(ctl.job_id)
        wall_s = time.perf_counter() - started
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"log": log.__dict__, "history": ctl.history}, f, default=str)
        out = summarize(args, ctl, log, timeline, cluster, model, priced, data, launch, secured)
    out["wall_s"] = wall_s
    shutil.rmtree(work, ignore_errors=True)
    return out


def stop_watchers(job_id: str) -> None:
    import ray

    from autohet_ray.elastic.spot import stop_watching
    try:
        stop_watching(job_id)
    except ray.exceptions.RayError as err:       # the board's node is gone: the cluster shutdown ends the rest
        print(f"stopping the spot watchers failed: {err}", file=sys.stderr)


def summarize(args, ctl, log, timeline, cluster, model, priced, data, launch, secured) -> dict:
    from autohet_ray.metrics.reference_check import reference_check
    from autohet_ray.replay.emulated import change_phases, committed_lost, emulated_goodput, phase_medians, step_record
    from autohet_ray.replay.planning import real_planner
    phases = [change_phases(c) for c in log.changes]
    removals = [a for a in log.applied if a["kind"] == "remove"]
    check = reference_check(ctl.history, data_dir=data, model=model, global_batch=args.global_batch,
                            seq_len=ctl.seq_len, seed=ctl.job.seed, optimizer=ctl.job.optimizer)
    planner = real_planner(cluster=cluster, pools=timeline.pools, model=priced, profile=ctl.profile,
                           global_batch=args.global_batch, seq_len=priced.max_seq_len,
                           time_limit_s=args.plan_time_limit)
    goodput = emulated_goodput(log.segments, cluster=cluster, pools=timeline.pools,
                               steps_committed=len(step_record(ctl.history)), global_batch=args.global_batch,
                               time_scale=ctl.time_scale, planner=planner)
    lost_work = [p["lost_steps"] for p in phases]
    return {"emulated": True, "events": len(timeline.events), "notice_s": args.notice_s,
            "compression": args.compression, "start_s": args.start_s, "pools": list(timeline.pools),
            "removals": len(removals), "removals_in_plan": sum(1 for a in removals if a.get("in_plan")),
            "joins": sum(1 for a in log.applied if a["kind"] == "add"),
            "notices": sum(1 for a in log.applied if a["kind"] == "notice"),
            "lost_steps": committed_lost(log.changes),
            "lost_work_steps": sum(lost_work), "changes": len(phases), "phases": phases,
            "phase_medians": phase_medians(phases), "time_scale": ctl.time_scale,
            "goodput_emulated": goodput["goodput"], "goodput_detail": {k: v for k, v in goodput.items()
                                                                       if k != "goodput"},
            "checks": check, "secured_step": secured.get("step"), "first_plan": launch["plan"]}


def main(argv=None) -> int:
    args = parse_args(argv)
    out = run(args)
    c = out["checks"]
    print(f"events {out['events']}, removals {out['removals']} ({out['removals_in_plan']} in the plan), joins "
          f"{out['joins']}, notices {out['notices']}; committed steps lost {out['lost_steps']}, work steps lost "
          f"{out['lost_work_steps']}; sample ids equal {c['sample_ids_equal']}, losses equal {c['losses_equal']} "
          f"(max rel {c['max_rel_loss_diff']:.2e}); goodput {out['goodput_emulated']:.3f} (emulated)")
    print(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
