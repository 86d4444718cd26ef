"""`autohet train` and `autohet profile` through Ray: console UI over the orchestrate driver actor."""
from __future__ import annotations

import json
import sys
import time

from autohet_ray import ConfigError
from autohet_ray.cluster.spec import load_cluster
from autohet_ray.model.spec import load_model
from autohet_ray.plan.schema import load_plan

BAR_WIDTH = 20
AUTO_ITERATION_WALL_S = 10.0      # --time-scale auto: one emulated iteration takes about this long on the wall


def _bar(done: int, total: int) -> str:
    filled = BAR_WIDTH * done // total
    return "[" + "#" * filled + "." * (BAR_WIDTH - filled) + f"] {done}/{total}"


def _job(args, cluster, model) -> dict:
    return {"model": model.to_dict(), "global_batch": args.global_batch, "steps": args.steps,
            "cluster": cluster.to_dict(), "plan": load_plan(args.plan).to_dict() if args.plan else None,
            "seq_len": args.seq_len, "micro_batch": args.micro_batch, "schedule": args.schedule,
            "emulate": args.emulate,
            "time_scale": 1.0 if args.time_scale == "auto" else float(args.time_scale),
            "iteration_wall_s": AUTO_ITERATION_WALL_S if args.time_scale == "auto" else None,
            "profile": args.profile, "profile_cache": args.profile_cache,
            "storage": args.storage, "endpoint_url": args.endpoint_url, "seed": args.seed,
            "plan_time_limit_s": args.plan_time_limit,
            "placement_timeout_s": args.placement_timeout}


def _print_phase(report: dict, tag: str) -> None:
    phase, secs = report["phase"], report["seconds"]
    if phase == "discover":
        nodes = ", ".join(f"{n['name']} {n['gpus']}x {n['device']}" for n in report["nodes"])
        print(f"discover: {nodes}{' (emulated GPUs)' if report['emulated'] else ''}  [{secs:.1f} s]")
    elif phase == "profile":
        print(f"profile: {report['entries']} entries, {report['profile_kind']}  [{secs:.1f} s]")
    elif phase == "plan":
        plan = report["plan"]
        shape = " | ".join("+".join(f"{s['device_type']}x{s['tp']}[{s['layers'][0]},{s['layers'][1]})"
                                    for s in p["stages"])
                          + f" m={p['num_microbatches']}x{p.get('micro_batch') or plan['micro_batch']}"
                          for p in plan["pipelines"])
        print(f"plan ({plan.get('schedule', '1f1b')}): {shape}")
        print(f"  predicted {report['predicted_iteration_s']:.4f} s/iteration, "
              f"{report['predicted_samples_per_s']:.1f} samples/s{tag}  [{secs:.1f} s]")
        for name, t in report["baselines_iteration_s"].items():
            print(f"  vs {name}: predicted {t:.4f} s/iteration -> gain {t / report['predicted_iteration_s']:.2f}x")
    elif phase == "place":
        print(f"place: {report['ranks']} stage actors placed and joined; time scale {report['time_scale']:.3g} "
              f"wall s per emulated s  [{secs:.1f} s]")


def _starting(cluster) -> None:
    print(f"starting an emulated Ray cluster: {', '.join(f'{n.name} ({n.count}x {n.device})' for n in cluster.nodes)}",
          flush=True)


def cmd_train(args) -> int:
    from autohet_ray.orchestrate.elastic_tiers import check_storage, storage_spec
    from autohet_ray.orchestrate.job import job_from_dict
    from autohet_ray.orchestrate.session import ray_session, run_job
    cluster, model = load_cluster(args.cluster), load_model(args.model)
    if args.time_scale != "auto":
        try:
            if float(args.time_scale) <= 0:
                raise ValueError
        except ValueError:
            raise ConfigError(f"--time-scale={args.time_scale!r} must be a positive number or 'auto'") from None
    tag = " (emulated)" if args.emulate else ""

    def on_step(m: dict) -> None:
        print(f"{_bar(m['step'], args.steps)} step {m['step']} loss {m['loss']:.4f}  "
              f"{m['samples_per_s']:.1f} samples/s measured vs {m['predicted_samples_per_s']:.1f} predicted{tag}",
              flush=True)

    job = _job(args, cluster, model)
    job_from_dict(job)                    # bad values fail here, before a cluster starts
    if args.storage:                      # and an unusable storage, before a job runs up to its first write
        check_storage(storage_spec(args.storage, endpoint_url=args.endpoint_url))
    with ray_session(cluster, address=args.address, emulate=args.emulate, on_start=_starting):
        history = run_job(job, on_phase=lambda r: _print_phase(r, tag), on_step=on_step)
    summary = _summary(history, args.emulate, args.global_batch)
    print(f"done: {summary['steps']} steps, final loss {summary['final_loss']:.4f}; iteration "
          f"{summary['measured_iteration_s']:.4f} s measured (steady state) vs "
          f"{summary['predicted_iteration_s']:.4f} s "
          f"predicted{tag}")
    if args.json:
        print(json.dumps(summary))
    return 0


def _summary(history: list[dict], emulated: bool, global_batch: int) -> dict:
    steady = history[1:] or history          # the first step includes warm-up
    measured = sorted(m["iteration_s"] for m in steady)[len(steady) // 2]
    return {"steps": len(history), "losses": [m["loss"] for m in history], "final_loss": history[-1]["loss"],
            "measured_iteration_s": measured, "predicted_iteration_s": history[-1]["predicted_iteration_s"],
            "measured_samples_per_s": global_batch / measured,
            "predicted_samples_per_s": history[-1]["predicted_samples_per_s"], "emulated": emulated}


def cmd_profile_ray(args) -> int:
    """`autohet profile --cluster FILE --model M --out F [--emulate]`: one profile per GPU type on Ray."""
    from autohet_ray.orchestrate.session import profile_on_ray, ray_session
    cluster, model = load_cluster(args.cluster), load_model(args.model)
    seq_len = args.seq_len or model.max_seq_len
    start = time.perf_counter()
    with ray_session(cluster, address=args.address, emulate=args.emulate, on_start=_starting):
        db = profile_on_ray(cluster, model, seq_len, args.cache)
    db.save(args.out)
    for name, info in db.meta["types"].items():
        print(f"{name}: node {info['node']} ({info['device_name']}), {info['seconds']:.1f} s"
              f"{' (cached)' if info['cached'] else ''}")
    print(f"wrote {args.out}: {len(db.entries)} entries, measured; profiling {db.meta['profile_time_s']:.1f} s, "
          f"total {time.perf_counter() - start:.1f} s", file=sys.stdout)
    return 0
