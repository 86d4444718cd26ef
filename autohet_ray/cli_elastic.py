"""`autohet train --elastic`: train with tiered checkpoints and local-first recovery (the elastic controller).

Every step is snapshotted into two nodes' stores; every --cloud-every steps also into --storage (a directory or
s3://bucket/prefix). Between steps the controller acts on spot notices (`--spot-watch`: a watcher per node
polls the cloud's instance metadata) and Ray drain signals, and re-plans onto nodes of the cluster file that
(re)joined; a lost node is recovered from the cheapest copies. `autohet resume --storage` continues a stopped
job. With `--emulate`, every op is stretched to its emulated device's predicted time (`--time-scale`; auto: a
predicted iteration lasts about AUTO_ITERATION_WALL_S), where this machine's compute is fast enough.
"""
from __future__ import annotations

import json
import sys
import time

from autohet_ray import ConfigError
from autohet_ray.cluster.spec import load_cluster
from autohet_ray.model.spec import load_model
from autohet_ray.plan.schema import load_plan

AUTO_ITERATION_WALL_S = 2.0


def elastic_job_of(args) -> dict:
    """ElasticJob fields from the `autohet train --elastic` arguments."""
    from autohet_ray.orchestrate.elastic_tiers import check_storage, storage_spec
    if not args.storage:
        raise ConfigError("--elastic needs --storage DIR|s3://bucket/prefix (the cloud tier and resume point)")
    check_storage(storage_spec(args.storage, endpoint_url=args.endpoint_url))
    cluster, model = load_cluster(args.cluster), load_model(args.model)
    clock = {}
    if args.emulate:                    # the emulated devices' clock, as `autohet train --emulate` runs it
        clock = ({"iteration_wall_s": AUTO_ITERATION_WALL_S} if args.time_scale == "auto"
                 else {"time_scale": float(args.time_scale)})
    return {"model": model.to_dict(), "cluster": cluster.to_dict(), "global_batch": args.global_batch,
            "storage": storage_spec(args.storage, endpoint_url=args.endpoint_url), "seq_len": args.seq_len,
            "micro_batch": args.micro_batch, "schedule": args.schedule,
            "plan": load_plan(args.plan).to_dict() if args.plan else None,
            "cloud_every": args.cloud_every, "seed": args.seed, "plan_time_limit_s": args.plan_time_limit, **clock}


def _describe(report: dict) -> str:
    what = report.get("reason", "")
    return (f"recovered ({what}) onto {report['plan']} from step {report['restored_step']}: "
            f"{report.get('bytes_by_tier', {})} bytes, {report.get('total_s', 0.0):.1f} s")


def _between_steps(ctl, board) -> list[dict]:
    """Spot notices / drains first (flush, then re-plan without those nodes), then nodes that joined."""
    events = []
    for check in (lambda: ctl.check_notices(board), ctl.check_joins):
        report = check()
        if report is not None and report.get("plan"):
            events.append(report)
            print(f"re-planned: {report.get('reason', '')} -> {report['plan']}", file=sys.stderr)
    return events


def cmd_train_elastic(args) -> int:
    from autohet_ray.orchestrate.elastic_config import elastic_job_from_dict
    from autohet_ray.orchestrate.recovery import ElasticController
    from autohet_ray.orchestrate.session import ray_session

    job = elastic_job_from_dict(elastic_job_of(args))
    events: list[dict] = []
    with ray_session(load_cluster(args.cluster), address=args.address, emulate=args.emulate):
        ctl = ElasticController(job)
        try:
            start = time.perf_counter()
            launch = ctl.start()
            clock = f", time scale {launch['time_scale']:.3g} (emulated)" if launch.get("time_scale") else ""
            print(f"plan {launch['plan']}{clock}  [{time.perf_counter() - start:.1f} s]", file=sys.stderr)
            board = _spot_board(ctl) if args.spot_watch else None
            while ctl.step_index < args.steps:
                events += _between_steps(ctl, board)
                metrics = ctl.step()
                if "recovery" in metrics:
                    events.append(metrics["recovery"])
                    print(_describe(metrics["recovery"]), file=sys.stderr)
                print(f"step {metrics['step']}/{args.steps}: loss {metrics['loss']:.4f}  {metrics['wall_s']:.2f} s",
                      file=sys.stderr)
            ctl.flush()
        finally:
            ctl.close()
    out = {"steps": [{"step": m["step"], "loss": m["loss"], "wall_s": m["wall_s"]} for m in ctl.history],
           "launch": launch, "events": events, "committed": ctl.committer.committed[-1:],
           "cloud_committed": ctl.committer.cloud_committed[-1:]}
    print(f"done: step {ctl.step_index}, newest committed step {out['committed']} (cloud {out['cloud_committed']})")
    if args.json:
        print(json.dumps(out, default=str))
    return 0


def _spot_board(ctl):
    """Start a spot-notice watcher on every node of the job; the notice board they post to."""
    from autohet_ray.orchestrate.spot import watch_nodes
    return watch_nodes([n.node_id for n in ctl.found.nodes])
