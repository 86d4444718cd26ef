"""Restart cost as the world grows: bring up plans of 8, 16, 32, ... ranks (one spawned process per rank, gloo on
loopback, a tiny GPT) as a relaunch after a loss does, and time each phase on every rank:

- groups: the plan's process groups, two ways side by side in the same world: "every_rank" (every rank creates
  every group of the world, in one order: torch's new_group contract, what runtime/groups.py did before) and
  "members_only" (each group created by its members only: runtime/groups.py now); how many each rank creates;
- engine: the Engine's build with its groups already held (model, sync, optimizer, executor);
- state: loading this rank's state (params + AdamW moments) saved by the same plan from a file in /dev/shm (the
  node store is RAM) into the new engine: bytes and seconds;
- first_step: the first training step after it.

Each phase's slowest rank is the phase's time. The plan: N/4 pipelines of 2 stages at TP2 (TP groups {2i, 2i+1},
and one sync group per stage and TP rank across the pipelines: N/2 + 4 groups in the world). Each phase is fitted
(least squares) as a + b*N and as c*N^k; the better fit (smaller relative error) is extrapolated to 1024 ranks
("fit", "at_1024"). Labelled testbed-free: all ranks share this host's cores, so the per-rank work of the
larger worlds is serialized here (the fits are upper bounds for the compute phases on a real cluster, where
each rank has its own GPU; the group phase's store traffic is the part that scales with the world).

    python -m benchmarks run restart-scaling -- [--ranks 8,16,32,48] [--json-out FILE]
Ends with one JSON line.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist

EXTRAPOLATE_TO = 1024
PHASES = ("groups_every_rank_s", "groups_members_only_s", "engine_s", "state_s", "first_step_s")


def bench_plan(world: int):
    from autohet_ray.model.spec import PRESETS
    from autohet_ray.plan.schema import Pipeline, Plan, Stage
    spec = PRESETS["tiny-gpt"]
    pipes = tuple(Pipeline(num_microbatches=2, stages=(
        Stage(layers=(0, 2), tp=2, device_type="cpu", node=f"n{k}", devices=(0, 1)),
        Stage(layers=(2, 4), tp=2, device_type="cpu", node=f"n{k}", devices=(2, 3)))) for k in range(world // 4))
    return spec, Plan(model=spec.name, global_batch=2 * len(pipes), micro_batch=1, seq_len=16, pipelines=pipes)


def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def run_rank(rank: int, world: int, state_dir: str) -> dict:
    """One rank's phases (every rank returns the slowest rank's seconds of each)."""
    from autohet_ray.plan.rankmap import SYNC_BUCKET_ELEMENTS, build_rank_map
    from autohet_ray.nn import param_shapes
    from autohet_ray.runtime.engine import Engine
    from autohet_ray.runtime.grad_sync import plan_grad_sync
    from autohet_ray.runtime.groups import all_group_ranks, create_groups
    from autohet_ray.runtime.parallelize import shard_dim
    spec, plan = bench_plan(world)
    rank_map = build_rank_map(plan, spec.num_layers)
    ops = plan_grad_sync(rank_map, [(n, s, shard_dim(n)) for n, s in param_shapes(spec).items()],
                         SYNC_BUCKET_ELEMENTS, tied=None, sharded_units=set())
    every = all_group_ranks(rank_map, ops)
    out = {"groups_in_world": len(every)}
    dist.barrier()
    start = time.perf_counter()
    for ranks in every:                                   # the old way: every rank creates every group
        dist.new_group(list(ranks))
    out["groups_every_rank_s"] = _slowest(time.perf_counter() - start)
    out["groups_created_per_rank_every_rank"] = len(every)
    dist.barrier()
    _, built = create_groups(rank_map, ops, me=rank, to_global=lambda r: r)
    out["groups_members_only_s"] = _slowest(built.seconds)
    out["groups_created_per_rank_members_only"] = int(_slowest(built.created))
    dist.barrier()
    start = time.perf_counter()
    engine = Engine(plan=plan, model_spec=spec, rank=rank, seed=0, dtype=torch.float32)   # keeps those groups
    out["engine_s"] = _slowest(time.perf_counter() - start)
    g = torch.Generator().manual_seed(0)
    batch = {"input_ids": torch.randint(0, spec.vocab_size, (plan.global_batch, plan.seq_len), generator=g),
             "labels": torch.randint(0, spec.vocab_size, (plan.global_batch, plan.seq_len), generator=g)}
    engine.train_step(batch)
    path = os.path.join(state_dir, f"{rank}.pt")
    torch.save(engine.state_dict(), path)
    dist.barrier()
    start = time.perf_counter()
    state = torch.load(path, weights_only=False)
    engine.load_state_dict(state)
    out["state_s"] = _slowest(time.perf_counter() - start)
    out["state_bytes_per_rank"] = sum(t.numel() * t.element_size() for t, _, _ in state.values())
    dist.barrier()
    start = time.perf_counter()
    engine.train_step(batch)
    out["first_step_s"] = _slowest(time.perf_counter() - start)
    return out


def fit(ns: list[int], ts: list[float]) -> dict:
    """Least-squares a + b*N and c*N^k; the one with the smaller worst relative error, and its value at 1024."""
    n = len(ns)
    mean_n, mean_t = sum(ns) / n, sum(ts) / n
    b = sum((x - mean_n) * (y - mean_t) for x, y in zip(ns, ts)) / sum((x - mean_n) ** 2 for x in ns)
    a = mean_t - b * mean_n
    lx, ly = [math.log(x) for x in ns], [math.log(max(y, 1e-9)) for y in ts]
    mlx, mly = sum(lx) / n, sum(ly) / n
    k = sum((x - mlx) * (y - mly) for x, y in zip(lx, ly)) / sum((x - mlx) ** 2 for x in lx)
    c = math.exp(mly - k * mlx)
    linear = lambda x: a + b * x  # noqa: E731
    power = lambda x: c * x ** k  # noqa: E731
    err = {name: max(abs(f(x) - y) / max(y, 1e-9) for x, y in zip(ns, ts)) for name, f in
           (("linear", linear), ("power", power))}
    best = min(err, key=err.get)
    at = linear(EXTRAPOLATE_TO) if best == "linear" else power(EXTRAPOLATE_TO)
    return {"form": best, "linear": {"a": a, "b": b}, "power": {"c": c, "k": k},
            "worst_relative_error": err[best], f"at_{EXTRAPOLATE_TO}_s": max(at, 0.0)}


def max_ranks_here(per_rank_bytes: int = 450 << 20) -> int:
    """The largest multiple of 4 ranks this host's available memory holds (each rank a torch process)."""
    with open("/proc/meminfo") as f:
        avail = next(int(line.split()[1]) << 10 for line in f if line.startswith("MemAvailable"))
    return max(4, (avail // 2 // per_rank_bytes) // 4 * 4)     # half of what is free: other jobs share the host


def main(argv=None) -> int:
    from autohet_ray.runtime import run_world
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default=None, help="world sizes, multiples of 4 (default: 8,16,32 and the most "
                                                  "this host's free memory holds, up to 64)")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args(argv)
    most = min(64, max_ranks_here())
    sizes = [int(x) for x in args.ranks.split(",")] if args.ranks else sorted({8, 16, 32, max(32, most)})
    bad = [s for s in sizes if s < 4 or s % 4]
    if bad:
        ap.error(f"--ranks: {bad} are not multiples of 4 (>= 4)")
    rows = []
    for world in sizes:
        with tempfile.TemporaryDirectory(prefix="restart-scaling-", dir="/dev/shm") as state_dir:
            start = time.perf_counter()
            got = run_world(run_rank, world, state_dir, timeout_s=600)[0]
        rows.append({"ranks": world, **got, "wall_s": time.perf_counter() - start, "loadavg": os.getloadavg()})
        print(f"{world} ranks: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                            for k, v in rows[-1].items() if k != "ranks"), file=sys.stderr, flush=True)
    ns = [r["ranks"] for r in rows]
    fits = {phase: fit(ns, [r[phase] for r in rows]) for phase in PHASES} if len(rows) >= 2 else {}
    out = {"label": "measured on one host (all ranks share its cores), fitted and extrapolated",
           "host_cpus": os.cpu_count(), "rows": rows, "fits": fits}
    if fits:
        at = f"at_{EXTRAPOLATE_TO}_s"
        out["restart_at_1024_s"] = {
            "members_only": sum(fits[p][at] for p in ("groups_members_only_s", "engine_s", "state_s")),
            "every_rank": sum(fits[p][at] for p in ("groups_every_rank_s", "engine_s", "state_s"))}
    line = json.dumps(out)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
