"""`autohet plan`, `autohet evaluate`, `autohet show`: console output for plans."""
from __future__ import annotations

import json
import time

from autohet_ray import ConfigError
from autohet_ray.cli.money import money_lines, money_report
from autohet_ray.cli.plan_view import draw_plan, slice_note, timeline_text
from autohet_ray.cli.train import build_job, job_fields
from autohet_ray.cli.units import seconds, size
from autohet_ray.cluster.spec import cluster_from_dict, load_cluster
from autohet_ray.config_io import check_type, read_structured
from autohet_ray.cost.breakdown import breakdown_line, time_breakdown
from autohet_ray.cost.evaluate import evaluate_plan
from autohet_ray.cost.money import goal_from
from autohet_ray.cost.sharding import saved_bytes
from autohet_ray.job import file as job_file
from autohet_ray.job.config import TrainJob, compute_dtype
from autohet_ray.job.plan_choice import analytic_job_profile, plan_request
from autohet_ray.metrics.step import peak_dtype
from autohet_ray.model.spec import load_model, model_from_dict
from autohet_ray.plan.schema import Plan, plan_from_dict
from autohet_ray.planner import check_request, plan_training, plan_with_baselines, strongest_baseline
from autohet_ray.planner.bounds.background import lower_bound_in_background
from autohet_ray.planner.workers import stop_helper_process, use_helper_process
from autohet_ray.profile.analytic import analytic_profile, with_micro_batches
from autohet_ray.profile.db import load_profile


def _profile(args, model, cluster, seq_len, micro_batches=()):
    """The --profile file, or the analytic profile with entries for `micro_batches` as well."""
    if getattr(args, "profile", None):
        return load_profile(args.profile)
    return analytic_profile(model, cluster, seq_len, with_micro_batches(*micro_batches),
                            dtype=peak_dtype(compute_dtype(args.dtype or "bfloat16", cuda=True)))


def read_plan(path: str) -> Plan:
    """A plan file, or the output of `autohet plan --json` (the plan inside it)."""
    raw = read_structured(path, "plan")
    if isinstance(raw, dict) and "schema_version" not in raw and isinstance(raw.get("plan"), dict):
        raw = raw["plan"]
    return plan_from_dict(raw)


TABLE_LEGEND = ("  (micro: micro-batches per iteration x samples each; layers: [first, last) of the transformer "
                "layers; tp: tensor-parallel degree; gpus: the node's GPU indices; peak mem: per GPU)")
BOUND_MEANINGFUL = 2.0     # the bound leaves out bubbles, links and sync: a plan over twice it is mostly those


def plan_table(plan: Plan, memory: dict[str, int], saved: dict | None = None) -> str:
    """One row per stage. `saved`: (pipeline, stage) -> bytes per device its sharded optimizer state saves."""
    rows = [f"{'pipe':>4} {'micro':>5} {'stage':>5} {'layers':>9} {'tp':>3} {'device':<10} {'node':<10} "
            f"{'gpus':<16} {'peak mem':>9} recompute  optimizer state"]
    rows.append(TABLE_LEGEND)
    for k, p in enumerate(plan.pipelines):
        for j, s in enumerate(p.stages):
            mem = memory.get(f"{s.node}:{s.devices[0]}", 0)
            micro = f"{p.num_microbatches}x{plan.micro_batch_of(k)}" if j == 0 else ""
            rows.append(f"{k:>4} {micro:>5} {j:>5} "
                        f"{f'[{s.layers[0]},{s.layers[1]})':>9} {s.tp:>3} {s.device_type:<10} {s.node:<10} "
                        f"{','.join(map(str, s.devices)):<16} {size(mem):>9} {'yes' if s.recompute else 'no':<9}  "
                        f"{_sharding(plan, k, j, saved)}")
    return "\n".join(rows)


def _sharding(plan: Plan, k: int, j: int, saved: dict | None) -> str:
    """A stage that does not ask to shard still keeps slices of the units another of their holders shards."""
    asks, ways = plan.pipelines[k].stages[j].shard_optimizer, len(plan.pipelines)
    if saved is None:
        return f"sharded {ways}-way" if asks and ways > 1 else "replicated"
    if saved[(k, j)] <= 0:
        return "replicated"
    return (f"{'sharded' if asks else 'partly sharded (by co-holders)'} {ways}-way, saves {size(saved[(k, j)])}"
            f"{slice_note(plan, k, j)}")


def _savings(plan: Plan, cluster, model, profile) -> dict:
    return saved_bytes(plan, cluster, model, profile)


def plan_job(args) -> tuple[TrainJob, bool]:
    """(the job, whether it runs emulated) as `autohet train` would read it from the same --config and flags,
    with only the fields planning reads."""
    fields, launch, where, from_file = job_fields(args, only=args.plan_fields)
    job_file.check_required(fields, where)
    fields = job_file.resolve_all(fields, where=where, from_file=from_file)
    if fields.get("profile") == "measured":
        raise ConfigError("profile='measured' is measured on the Ray cluster as training starts; to plan with one, "
                          "run autohet profile --cluster FILE --out P.json and give --profile P.json")
    emulate = launch.get("emulate", False)
    check_type(emulate, bool, f"{where or 'plan'}: emulate")
    return build_job(fields, where, from_file), emulate


def cmd_plan(args) -> int:
    started = time.perf_counter()
    job, emulate = plan_job(args)
    cluster, model = cluster_from_dict(job.cluster), model_from_dict(job.model)
    priced = model_from_dict(job.priced_as) if job.priced_as else model       # as orchestrate/live_job.py
    seq_len = job.priced_seq_len or job.seq_len or model.max_seq_len
    profile = load_profile(job.profile) if job.profile.endswith(".json") else \
        analytic_job_profile(job, priced_model=priced, cluster=cluster, seq_len=seq_len, cuda=not emulate)
    check_request(priced, profile, job.global_batch, seq_len, job.schedules())
    goal = goal_from(job.objective, job.prices, job.max_cost_per_hour, job.min_samples_per_s, cluster)
    request = plan_request(job, cluster, profile=profile, priced_model=priced, seq_len=seq_len)
    common = {k: v for k, v in request.items() if k not in ("cluster", "time_limit_s", "goal", "micro_batch")}
    bound = lower_bound_in_background(goal=goal, cluster=cluster, **common)
    use_helper_process()          # the inputs are checked: a second core for the search (planner/workers.py)
    try:
        if job.baselines:         # as the first planning of autohet train (job/plan_choice.py)
            result, baselines = plan_with_baselines(**request)
        else:
            result, baselines = plan_training(**request), {}
        money = None
        if goal.prices is not None:
            money = money_report(result, baselines, cluster, goal, seq_len, common | {"micro_batch": job.micro_batch})
    finally:
        stop_helper_process()     # a caller of cli.main in its own process keeps no planner process behind
    if args.out:
        with open(args.out, "w") as f:
            f.write(result.plan.to_json())
    bound_all = bound.result()
    if money is not None:
        money["lower_bound_usd_per_million_tokens"] = _per_million(bound_all, job.global_batch, seq_len)
    report = plan_report(result, baselines, wall_s=time.perf_counter() - started) | {
        "lower_bound_iteration_s": bound_all["iteration_s"], "dtype": profile.meta.get("dtype", "bfloat16")} | (
        {"money": money} if money is not None else {})
    if args.json:
        print(json.dumps({"plan": result.plan.to_dict(), "predicted": result.plan.predicted.to_dict(), **report}))
        return 0
    print("\n".join(plan_lines(job, result, report, cluster, priced, profile, seq_len, left_out=money is None)))
    if money is not None:
        _print_money(money, goal)          # it names the GPUs left out, with what each would add
    if args.out:
        print(f"wrote {args.out}")
    return 0


def plan_lines(job, result, report: dict, cluster, model, profile, seq_len: int, *,
               left_out: bool = True) -> list[str]:
    """What `autohet plan` prints of a plan: the table, the prediction, the bound where it means something, the
    baselines, and (`left_out`; with --prices the money report does it) the GPUs the plan leaves out."""
    ev, bound_s = result.evaluation, report["lower_bound_iteration_s"]
    lines = [f"plan for {model.name} on {cluster.name} ({cluster.num_gpus} GPUs), global batch {job.global_batch}, "
             f"micro-batch {result.plan.micro_batch}, seq {seq_len}, schedule {result.plan.schedule}  "
             f"[{profile.kind} profile, {report['dtype']}]",
             plan_table(result.plan, ev.memory_bytes, _savings(result.plan, cluster, model, profile)),
             f"predicted: {seconds(ev.iteration_time_s)}/iteration, {ev.samples_per_s:.1f} samples/s (slowest "
             f"pipeline {seconds(max(ev.pipeline_times_s))}; grad sync {seconds(ev.sync_time_s)}, overlapping the "
             f"cool-down; optimizer {seconds(ev.optimizer_time_s)}); solved in {result.solve_time_s:.1f} s, "
             f"{report['wall_time_s']:.1f} s in all{' (time limit hit: best so far)' if result.hit_time_limit else ''}",
             breakdown_line(time_breakdown(result.plan, ev))]
    what = "a fluid relaxation of every plan: compute, optimizer and memory per GPU type; no bubbles, links or sync"
    if bound_s and ev.iteration_time_s <= BOUND_MEANINGFUL * bound_s:
        lines.append(f"within {ev.iteration_time_s / bound_s - 1:.0%} of the proven lower bound "
                     f"{seconds(bound_s)}/iteration ({what})")
    elif bound_s is not None:
        lines.append(f"proven lower bound {seconds(bound_s)}/iteration ({what}); this plan is over "
                     f"{BOUND_MEANINGFUL:g}x it, its time mostly what the bound leaves out, so no distance is claimed")
    lines += gain_lines(report, headline=not job.goal().minimizes_cost)
    return lines + (_left_out_lines(result, cluster) if left_out else [])


def _left_out_lines(result, cluster) -> list[str]:
    """The GPUs a throughput plan does not use, by node: a plan with them would be no faster (the planner
    chose without them), unless the time limit stopped the search."""
    used: dict[str, int] = {}
    for p in result.plan.pipelines:
        for s in p.stages:
            used[s.node] = used.get(s.node, 0) + s.tp
    adds = ("not evaluated: the time limit stopped the search (a longer --plan-time-limit-s may use them)"
            if result.hit_time_limit else "adding them: no faster (the planner found no faster plan with them)")
    return [f"left out: {n.count - used.get(n.name, 0)}x {n.device} on {n.name}; {adds}"
            for n in cluster.nodes if n.count > used.get(n.name, 0)]


def _print_money(money: dict, goal) -> None:
    for line in money_lines(money, BASELINE_TITLES):
        print(line)
    if goal.minimizes_cost:
        print(cost_headline(money))
    low = money["lower_bound_usd_per_million_tokens"]
    if low and goal.minimizes_cost:
        print(f"within {money['plan']['usd_per_million_tokens'] / low - 1:.0%} of the proven lower bound "
              f"${low:.4f} per million tokens (the same relaxation, choosing which GPUs to pay for)")


def cost_headline(money: dict) -> str:
    """Under --objective cost: the plan's $ per million tokens against the cheapest baseline per token."""
    plan, rivals = money["plan"]["usd_per_million_tokens"], money["baselines"]
    if not rivals:
        return f"${plan:.4f} per million tokens; no baseline can run"
    cheapest = min(rivals, key=lambda n: rivals[n]["usd_per_million_tokens"])
    theirs = rivals[cheapest]["usd_per_million_tokens"]
    return (f"cost per million tokens against the cheapest baseline ({BASELINE_TITLES.get(cheapest, cheapest)}): "
            f"${plan:.4f} vs ${theirs:.4f}, {theirs / plan:.2f}x cheaper")


def _per_million(bound: dict, global_batch: int, seq_len: int) -> float | None:
    usd = bound.get("usd_per_iteration")
    return None if usd is None else usd / (global_batch * seq_len) * 1e6


BASELINE_TITLES = {"megatron": "Megatron-LM, all GPUs", "megatron-subset": "Megatron-LM, best GPU subset",
                   "whale": "Whale"}


def plan_report(result, baselines, wall_s: float) -> dict:
    """The machine-readable part of `autohet plan --json`: baselines, gains (baseline time / plan time), the
    strongest baseline, timings and whether the time limit was hit."""
    ev = result.evaluation
    strongest = strongest_baseline(baselines)
    return {"baselines": {n: (b.plan.predicted.to_dict() if b.plan else None) for n, b in baselines.items()},
            "baseline_reasons": {n: b.reason for n, b in baselines.items() if b.plan is None},
            "gains": {n: (b.evaluation.iteration_time_s / ev.iteration_time_s if b.evaluation else None)
                      for n, b in baselines.items()},
            "strongest_baseline": strongest,
            "solve_time_s": result.solve_time_s, "wall_time_s": wall_s, "hit_time_limit": result.hit_time_limit,
            "time_breakdown": time_breakdown(result.plan, ev)}


def gain_lines(report: dict, *, headline: bool = True) -> list[str]:
    """One line per baseline, then (with `headline`) the headline against the strongest."""
    lines = []
    for name, predicted in report["baselines"].items():
        title = f"{BASELINE_TITLES.get(name, name):<29}"
        if predicted is None:
            lines.append(f"  vs {title}: cannot run ({report['baseline_reasons'][name]})")
        else:
            lines.append(f"  vs {title}: {predicted['samples_per_s']:8.1f} samples/s -> gain "
                         f"{report['gains'][name]:.2f}x")
    strongest = report["strongest_baseline"]
    if strongest is not None and headline:
        lines.append(f"gain over the strongest baseline ({BASELINE_TITLES.get(strongest, strongest)}): "
                     f"{report['gains'][strongest]:.2f}x")
    return lines


def cmd_evaluate(args) -> int:
    plan, cluster = read_plan(args.plan), load_cluster(args.cluster)
    model = model_from_dict(plan.model_spec) if plan.model_spec else load_model(plan.model)
    if not args.dtype and plan.predicted is not None and plan.predicted.dtype:
        args.dtype = plan.predicted.dtype       # price the dtype the plan was made for
    profile = _profile(args, model, cluster, plan.seq_len,
                       [plan.micro_batch_of(k) for k in range(len(plan.pipelines))])
    check_request(model, profile, plan.global_batch, plan.seq_len, (plan.schedule,))
    ev = evaluate_plan(plan, cluster, model, profile)
    pred = ev.predicted().to_dict()
    out = {"feasible": ev.feasible, "predicted": {k: pred[k] for k in
                                                  ("iteration_time_s", "samples_per_s", "peak_memory_bytes")},
           "reason": ev.reason, "dtype": profile.meta.get("dtype", "bfloat16")}
    if args.json:
        print(json.dumps(out))
    else:
        print(plan_table(plan, ev.memory_bytes, _savings(plan, cluster, model, profile)))
        status = "feasible" if ev.feasible else f"INFEASIBLE: {ev.reason}"
        print(f"{status}; predicted {seconds(ev.iteration_time_s)}/iteration, {ev.samples_per_s:.1f} samples/s "
              f"[{profile.kind} profile, {out['dtype']}]")
        print(breakdown_line(time_breakdown(plan, ev)))
    return 0 if ev.feasible else 1


def cmd_show(args) -> int:
    plan = read_plan(args.plan)
    print(timeline_text(plan))
    if args.png:
        draw_plan(plan, args.png)
        print(f"wrote {args.png}")
    return 0
