"""`autohet plan`, `autohet evaluate`, `autohet show`: console output for plans."""
from __future__ import annotations

import json

from autohet_ray.cluster.spec import load_cluster
from autohet_ray.cost.breakdown import breakdown_line, time_breakdown
from autohet_ray.cost.evaluate import evaluate_plan
from autohet_ray.model.spec import load_model, model_from_dict
from autohet_ray.plan.schedule import schedule_choices
from autohet_ray.plan.schema import Plan, load_plan
from autohet_ray.planner import check_request, plan_with_baselines
from autohet_ray.profile.analytic import analytic_profile, with_micro_batches
from autohet_ray.profile.db import load_profile


def _profile(args, model, cluster, seq_len, micro_batches=()):
    """The --profile file, or the analytic profile with entries for `micro_batches` as well."""
    if getattr(args, "profile", None):
        return load_profile(args.profile)
    return analytic_profile(model, cluster, seq_len, with_micro_batches(*micro_batches))


def _gb(x: float) -> str:
    return f"{x / 1e9:.1f} GB"


def plan_table(plan: Plan, memory: dict[str, int]) -> str:
    rows = [f"{'pipe':>4} {'micro':>5} {'stage':>5} {'layers':>9} {'tp':>3} {'device':<10} {'node':<10} "
            f"{'gpus':<16} {'peak mem':>9}"]
    for k, p in enumerate(plan.pipelines):
        for j, s in enumerate(p.stages):
            mem = memory.get(f"{s.node}:{s.devices[0]}", 0)
            micro = f"{p.num_microbatches}x{plan.micro_batch_of(k)}" if j == 0 else ""
            rows.append(f"{k:>4} {micro:>5} {j:>5} "
                        f"{f'[{s.layers[0]},{s.layers[1]})':>9} {s.tp:>3} {s.device_type:<10} {s.node:<10} "
                        f"{','.join(map(str, s.devices)):<16} {_gb(mem):>9}")
    return "\n".join(rows)


def cmd_plan(args) -> int:
    cluster, model = load_cluster(args.cluster), load_model(args.model)
    seq_len = args.seq_len or model.max_seq_len
    profile = _profile(args, model, cluster, seq_len, [args.micro_batch])
    result, baselines = plan_with_baselines(cluster=cluster, model=model, profile=profile,
                                            global_batch=args.global_batch, seq_len=seq_len,
                                            micro_batch=args.micro_batch, time_limit_s=args.time_limit,
                                            schedules=schedule_choices(args.schedule))
    if args.out:
        with open(args.out, "w") as f:
            f.write(result.plan.to_json())
    if args.json:
        print(json.dumps({"plan": result.plan.to_dict(), "predicted": result.plan.predicted.to_dict(),
                          "baselines": {n: (b.plan.predicted.to_dict() if b.plan else None)
                                        for n, b in baselines.items()},
                          "baseline_reasons": {n: b.reason for n, b in baselines.items() if b.plan is None},
                          "solve_time_s": result.solve_time_s,
                          "time_breakdown": time_breakdown(result.plan, result.evaluation)}))
        return 0
    ev = result.evaluation
    print(f"plan for {model.name} on {cluster.name} ({cluster.num_gpus} GPUs), global batch {args.global_batch}, "
          f"micro-batch {result.plan.micro_batch}, seq {seq_len}, schedule {result.plan.schedule}  "
          f"[{profile.kind} profile]")
    print(plan_table(result.plan, ev.memory_bytes))
    print(f"predicted: {ev.iteration_time_s:.3f} s/iteration, {ev.samples_per_s:.1f} samples/s "
          f"(slowest pipeline {max(ev.pipeline_times_s):.3f} s; grad sync {ev.sync_time_s:.3f} s, overlapping "
          f"the cool-down; optimizer {ev.optimizer_time_s:.3f} s); solved in {result.solve_time_s:.1f} s"
          f"{' (time limit hit: best so far)' if result.hit_time_limit else ''}")
    print(breakdown_line(time_breakdown(result.plan, ev)))
    for name, b in baselines.items():
        if b.evaluation is None:
            print(f"  vs {name:<8}: cannot run ({b.reason})")
        else:
            gain = b.evaluation.iteration_time_s / ev.iteration_time_s
            print(f"  vs {name:<8}: {b.evaluation.samples_per_s:8.1f} samples/s -> gain {gain:.2f}x")
    if args.out:
        print(f"wrote {args.out}")
    return 0


def cmd_evaluate(args) -> int:
    plan, cluster = load_plan(args.plan), load_cluster(args.cluster)
    model = model_from_dict(plan.model_spec) if plan.model_spec else load_model(plan.model)
    profile = _profile(args, model, cluster, plan.seq_len,
                       [plan.micro_batch_of(k) for k in range(len(plan.pipelines))])
    check_request(model, profile, plan.global_batch, plan.seq_len, (plan.schedule,))
    ev = evaluate_plan(plan, cluster, model, profile)
    pred = ev.predicted().to_dict()
    out = {"feasible": ev.feasible, "predicted": {k: pred[k] for k in
                                                  ("iteration_time_s", "samples_per_s", "peak_memory_bytes")},
           "reason": ev.reason}
    if args.json:
        print(json.dumps(out))
    else:
        print(plan_table(plan, ev.memory_bytes))
        status = "feasible" if ev.feasible else f"INFEASIBLE: {ev.reason}"
        print(f"{status}; predicted {ev.iteration_time_s:.3f} s/iteration, {ev.samples_per_s:.1f} samples/s "
              f"[{profile.kind} profile]")
        print(breakdown_line(time_breakdown(plan, ev)))
    return 0 if ev.feasible else 1


def cmd_show(args) -> int:
    from autohet_ray.plan_view import draw_plan, timeline_text
    plan = load_plan(args.plan)
    print(timeline_text(plan))
    if args.png:
        draw_plan(plan, args.png)
        print(f"wrote {args.png}")
    return 0
