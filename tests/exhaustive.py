"""Exhaustive search over every plan of a tiny cluster (3-6 GPUs, 8-24 layers), for tests and benchmarks.

Independent of the planner: it enumerates everything itself and shares only the cost model with it
(`evaluate_plan`, the per-group prices `GroupCostTable`, `stage_link_time`, the plan schema). Plan space:
- device grouping: every way to cut each node's GPUs into TP groups of a power-of-two size that the model
  and the profile allow (one type, one node per group; GPUs may stay idle);
- every partition of those groups into pipelines, and every distinct stage order of each pipeline;
- every contiguous layer split of each pipeline (every stage at least one layer);
- every micro-batch size given, and every integer allocation of the micro-batches across pipelines (with
  `mixed_micro_batches`, each pipeline also picks its own size and the samples add up to the global batch);
- every schedule given; each candidate priced by `evaluate_plan` under that schedule;
- with `recompute="auto"`, every stage with and without activation recomputation ("full": every stage with);
- with `optimizer_sharding="auto"`, every stage with and without sharded optimizer state ("dp": every stage
  with), slices equal (the planner's uneven slices are sized after its search, so it may do better).

Pruning, each provably safe (it drops only plans that cannot beat the incumbent, or cannot fit):
- memory: a stage's memory grows with its layer count, and a pipeline's memory does not depend on the other
  pipelines, so a split whose stage does not fit is dropped with every larger count for that stage (with
  sharding allowed, a stage's state is sharded across at most one holder per pipeline, and whether its units
  are sharded depends on the other pipelines: this check then prices every stage sharded across the most
  pipelines any plan can have, and each whole plan is checked when priced);
- a stage's last gradient action ends no earlier than micro-batch 0's forward arrival at it (the forwards and
  links of the stages before it) plus all of its own actions run one after another (m times its F+B+W);
- a pipeline's time alone (the same plan with that pipeline only: no gradient sync) is a lower bound on
  any plan that contains it, because each stage's iteration ends at its last gradient action or later (with
  sharding allowed, only the pipeline's last gradient action counts: a sharded update takes less than its
  whole stage's);
- a pipeline's per-sample time is at least its layers spread over its stages at their per-layer speeds
  (L / sum_j 1/layer_j), so a pipeline given n samples takes at least n times that, and a partition at least
  the batch over the sum of its pipelines' rates (a partition whose bound reaches the incumbent is skipped;
  partitions run best bound first, so the search stops at the first such one);
- identical pipelines (the same groups on the same nodes) are interchangeable: only one order of their
  allocations and options is priced.

With a money goal (cost/money.py Goal: $ per token, a budget, a throughput floor) every plan is ranked by the
goal's key: $ per iteration = $/hour of the nodes the partition uses a GPU of, each billed whole (its instance),
x its iteration time (or the time, under a budget). A partition's nodes are known before its plans are, so each
time bound above becomes the incumbent's key over the partition's $/hour (a pipeline's own options, cached across
partitions, use its own nodes' $/hour: a partition holding it uses those nodes and maybe more, so it costs at
least that much, and nothing it drops could count). Partitions over the budget
are skipped, and plans slower than the floor are not kept.
"""
from __future__ import annotations

import itertools
import math

from autohet_ray.cost.evaluate import evaluate_plan, stage_link_time
from autohet_ray.cost.money import THROUGHPUT, node_usd_per_hour
from autohet_ray.cost.memory import stage_peak_memory
from autohet_ray.cost.terms import GroupCostTable
from autohet_ray.plan.schedule import PLAN_SCHEDULES, SPLIT_BACKWARD
from autohet_ray.plan.schema import Pipeline, Plan, Stage

TP_SIZES = (8, 4, 2, 1)
SEED_UNITS = 64               # partitions priced cheaply first, for a starting incumbent


def node_cuts(count: int, sizes: tuple[int, ...]):
    """Multisets (non-increasing tuples) of group sizes from `sizes` with total <= count."""
    def rec(left, i):
        if i == len(sizes):
            yield ()
            return
        for k in range(left // sizes[i], -1, -1):
            for rest in rec(left - k * sizes[i], i + 1):
                yield (sizes[i],) * k + rest
    yield from rec(count, 0)


def groupings(cluster, model):
    """Every non-empty list of TP groups as (node name, TP degree) labels."""
    per_node = []
    for node in cluster.nodes:
        sizes = tuple(t for t in TP_SIZES if t <= node.count and model.valid_tp(t))
        per_node.append([[(node.name, t) for t in cut] for cut in node_cuts(node.count, sizes)])
    for combo in itertools.product(*per_node):
        groups = [g for node_groups in combo for g in node_groups]
        if groups:
            yield groups


def set_partitions(items):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        for i in range(len(part)):
            yield part[:i] + [[first] + part[i]] + part[i + 1:]
        yield [[first]] + part


def distinct_partitions(groups):
    """Partitions of the groups into pipelines, up to swapping identical groups: tuples of sorted blocks."""
    seen = set()
    for part in set_partitions(groups):
        key = tuple(sorted(tuple(sorted(block)) for block in part))
        if key not in seen:
            seen.add(key)
            yield key


def compositions(total: int, parts: int):
    """Every tuple of `parts` positive integers adding up to `total`."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        yield tuple(b - a for a, b in zip((0,) + cuts, cuts + (total,)))


RECOMPUTE_OPTIONS = {"none": (False,), "full": (True,), "auto": (False, True)}
SHARDING_OPTIONS = {"none": (False,), "dp": (True,), "auto": (False, True)}


def build_stages(cluster, order, counts, taken=None, flags=None) -> tuple[Stage, ...]:
    """Stages for labels in `order` with `counts` layers; `flags`: per stage its recompute flag, or its
    (recompute, shard optimizer) flags; GPU indices handed out per node from `taken`."""
    taken = {} if taken is None else taken
    flags = [f if isinstance(f, tuple) else (f, False) for f in (flags or (False,) * len(order))]
    stages, start = [], 0
    for (node, tp), n, (recompute, shard) in zip(order, counts, flags):
        first = taken.get(node, 0)
        taken[node] = first + tp
        stages.append(Stage(layers=(start, start + n), tp=tp, device_type=cluster.node(node).device, node=node,
                            devices=tuple(range(first, first + tp)), recompute=recompute, shard_optimizer=shard))
        start += n
    return tuple(stages)


class _Search:
    def __init__(self, cluster, model, profile, global_batch, seq_len, micro_batches, schedules, mixed,
                 recompute="none", goal=THROUGHPUT, optimizer_sharding="none"):
        self.cluster, self.model, self.profile = cluster, model, profile
        self.goal, self.unit_usd = goal, 0.0
        self.flags = RECOMPUTE_OPTIONS[recompute]
        self.stage_options = tuple(itertools.product(self.flags, SHARDING_OPTIONS[optimizer_sharding]))
        # sharding allowed: the most holders (pipelines) any plan can have, for the per-stage memory check
        self.max_ways = min(cluster.num_gpus, global_batch) if optimizer_sharding != "none" else 1
        self.global_batch, self.seq_len = global_batch, seq_len
        self.micro_batches = sorted(mb for mb in set(micro_batches) if global_batch % mb == 0 or mixed)
        self.schedules, self.mixed = tuple(schedules), mixed
        self.tables = {mb: GroupCostTable(model=model, cluster=cluster, profile=profile, micro_batch=mb,
                                          seq_len=seq_len) for mb in self.micro_batches}
        self.spec = model.to_dict()
        self.best: tuple[Plan, object] | None = None
        self.options_cache: dict[tuple, list] = {}
        self.priced = 0

    def key(self, plan: Plan, ev) -> float:
        return self.goal.key(plan, self.cluster, ev.iteration_time_s)

    def usd(self, groups) -> float:
        """$/hour of the nodes a set of (node, TP degree) groups sits on, each whole (0 for plain throughput)."""
        if self.goal.plain:
            return 0.0
        return sum(node_usd_per_hour(self.cluster, self.goal.prices, n) for n in {n for n, _ in groups})

    def limit(self, usd: float) -> float:
        """Iteration seconds a plan of GPUs costing `usd` per hour must beat to beat the incumbent."""
        best = self.key(*self.best) if self.best else math.inf
        if self.goal.min_samples_per_s is not None:
            floor = self.global_batch / self.goal.min_samples_per_s * (1 + 1e-9)
        else:
            floor = math.inf
        if self.goal.plain or not self.goal.minimizes_cost:
            return min(best, floor)
        return min(best / usd if usd > 0 else math.inf, floor)

    @property
    def bound(self) -> float:
        return self.limit(self.unit_usd)

    def offer(self, plan: Plan) -> None:
        ev = evaluate_plan(plan, self.cluster, self.model, self.profile, self.tables[plan.micro_batch])
        self.priced += 1
        if ev.feasible and self.key(plan, ev) < (self.key(*self.best) if self.best else math.inf):
            self.best = (plan.with_predicted(ev.predicted()), ev)

    def plan_of(self, schedule, pipelines, mb) -> Plan:
        return Plan(model=self.model.name, model_spec=self.spec, global_batch=self.global_batch,
                    micro_batch=mb, seq_len=self.seq_len, pipelines=tuple(pipelines), schedule=schedule)

    # -- per pipeline ---------------------------------------------------------------------------------------
    def has_entries(self, block, mb) -> bool:
        return all(self.profile.has(self.cluster.node(n).device, t, mb) for n, t in block)

    def per_sample_floor(self, block, mb, schedule) -> float:
        """Seconds per sample at least: the layers spread over the stages at their per-layer speeds."""
        rate = sum(self._layer_speeds(block, mb, schedule))
        return self.model.num_layers / rate / mb

    def options(self, block, schedule, mb, m) -> list[tuple[float, tuple, tuple, tuple]]:
        """(time alone, stage order, layer counts, recompute flags) of every split of `block` with m
        micro-batches of mb that fits and may beat the incumbent, fastest first (computed once, under the
        incumbent of that time, which only falls later, so nothing dropped could have counted)."""
        key = (block, schedule, mb, m)
        if key not in self.options_cache:
            found, limit = [], self.limit(self.usd(block))
            for order in sorted(set(itertools.permutations(block))):
                found += self._order_options(order, schedule, mb, m, limit)
            self.options_cache[key] = sorted(found)
        return [o for o in self.options_cache[key] if o[0] < self.bound]

    def _order_options(self, order, schedule, mb, m, limit):
        table, split, p, layers = self.tables[mb], schedule in SPLIT_BACKWARD, len(order), self.model.num_layers
        if p > layers:
            return []
        probe = build_stages(self.cluster, order, [1] * p)
        gcs = [{f: table.get(s.device_type, s.tp, f[0], self.max_ways) for f in self.stage_options} for s in probe]
        stub = Plan(model=self.model.name, global_batch=m * mb, micro_batch=mb, seq_len=self.seq_len, pipelines=())
        links = [stage_link_time(stub, self.cluster, self.profile, self.model, a, b, mb)
                 for a, b in zip(probe, probe[1:])]
        found = []

        def rec(j, left, arrival, counts, flags):
            if j == p:
                pipe = Pipeline(num_microbatches=m, stages=build_stages(self.cluster, order, counts, None, flags),
                                micro_batch=mb)
                plan = Plan(model=self.model.name, model_spec=self.spec, global_batch=m * mb,
                            micro_batch=mb, seq_len=self.seq_len, pipelines=(pipe,), schedule=schedule)
                ev = evaluate_plan(plan, self.cluster, self.model, self.profile, table)
                self.priced += 1
                sharding = self.max_ways > 1     # memory checked per stage above; the update may shrink
                alone = max(ev.pipeline_times_s) if sharding else ev.iteration_time_s
                if (ev.feasible or sharding) and alone < limit:
                    found.append((alone, order, tuple(counts), tuple(flags)))
                return
            first, last = j == 0, j == p - 1
            most = left if last else left - (p - j - 1)
            for flag, gc in gcs[j].items():
                for n in range(left if last else 1, most + 1):
                    if stage_peak_memory(gc, schedule, p, j, m, n) > gc.capacity_bytes:
                        break
                    parts = gc.stage_split(n, first, last, split)
                    if arrival + m * sum(parts) >= limit:
                        break
                    rec(j + 1, left - n, arrival + parts[0] + (links[j] if not last else 0.0), counts + [n],
                        flags + [flag])
        rec(0, layers, 0.0, [], [])
        return found

    # -- across pipelines -----------------------------------------------------------------------------------
    def sizes_for(self, block, mb):
        return [s for s in ([mb] if mb is not None else self.micro_batches) if self.has_entries(block, s)]

    def allocations(self, blocks, schedule, mb):
        """Per pipeline (micro-batch size, micro-batches), adding up to the global batch; identical pipelines
        in non-increasing order; pruned by each pipeline's per-sample floor."""
        floors = [{s: self.per_sample_floor(b, s, schedule) for s in self.sizes_for(b, mb)} for b in blocks]
        smallest = min(self.micro_batches)

        def rec(k, left, prev):
            if k == len(blocks):
                if left == 0:
                    yield ()
                return
            for s, floor in floors[k].items():
                for m in range(1, left // s + 1):
                    n = m * s
                    rest = len(blocks) - k - 1
                    if left - n < rest * smallest or n * floor >= self.bound:
                        break
                    if k > 0 and blocks[k] == blocks[k - 1] and (s, m) > prev:
                        continue
                    for tail in rec(k + 1, left - n, (s, m)):
                        yield ((s, m),) + tail
        yield from rec(0, self.global_batch, None)

    def joint(self, blocks, schedule, alloc, mb) -> None:
        lists = [self.options(b, schedule, s, m) for b, (s, m) in zip(blocks, alloc)]
        if any(not opts for opts in lists):
            return

        def rec(k, chosen, low):
            if k == len(blocks):
                taken: dict[str, int] = {}
                pipes = [Pipeline(num_microbatches=m, micro_batch=s if self.mixed else None,
                                  stages=build_stages(self.cluster, order, counts, taken, flags))
                         for (s, m), (_, order, counts, flags) in zip(alloc, chosen)]
                self.offer(self.plan_of(schedule, pipes, mb if mb is not None else max(s for s, _ in alloc)))
                return
            same = k > 0 and blocks[k] == blocks[k - 1] and alloc[k] == alloc[k - 1]
            for i, option in enumerate(lists[k]):
                if option[0] >= self.bound:
                    break
                if same and i < low:
                    continue
                rec(k + 1, chosen + [option], i)
        rec(0, [], 0)

    def units(self):
        """(floor, schedule, uniform micro-batch or None, blocks) for every partition, best floor first."""
        out = []
        sizes = [None] if self.mixed else self.micro_batches
        parts = {p for groups in groupings(self.cluster, self.model) for p in distinct_partitions(groups)}
        for schedule in self.schedules:
            for mb in sizes:
                for blocks in parts:
                    if len(blocks) > self.global_batch // (mb or min(self.micro_batches)):
                        continue
                    rates = []
                    for b in blocks:
                        floors = [self.per_sample_floor(b, s, schedule) for s in self.sizes_for(b, mb)]
                        rates.append(1.0 / min(floors) if floors else 0.0)
                    usd = self.usd([g for b in blocks for g in b])
                    if self.goal.max_usd_per_hour is not None and usd > self.goal.max_usd_per_hour * (1 + 1e-9):
                        continue
                    if all(r > 0 for r in rates):
                        out.append((self.global_batch / sum(rates), schedule, mb, blocks, usd))
        order = (lambda u: u[0] * u[4]) if self.goal.minimizes_cost else (lambda u: u[0])
        return sorted(out, key=lambda u: (order(u), u[1], u[2] or 0, u[3]))

    def seed(self, units) -> None:
        """An incumbent from a few cheap plans (each pipeline's layers and every pipeline's micro-batches in
        proportion to speed), so that the bounds prune from the start; the search itself does not rely on it."""
        for _, schedule, mb, blocks, _ in units[:SEED_UNITS]:
            size = mb if mb is not None else min(self.micro_batches)
            if self.global_batch % size or not all(self.has_entries(b, size) for b in blocks):
                continue
            rates = [1.0 / self.per_sample_floor(b, size, schedule) for b in blocks]
            alloc = _proportional(self.global_batch // size, rates)
            splits = [_proportional(self.model.num_layers, self._layer_speeds(b, size, schedule)) for b in blocks]
            if alloc is None or None in splits:
                continue
            for flag in self.stage_options:
                taken: dict[str, int] = {}
                pipes = [Pipeline(num_microbatches=m, stages=build_stages(self.cluster, block, counts, taken,
                                                                          (flag,) * len(block)))
                         for block, m, counts in zip(blocks, alloc, splits)]
                self.offer(self.plan_of(schedule, pipes, size))

    def _layer_speeds(self, block, mb, schedule) -> list[float]:
        """Layers per second of each group, with or without recomputation, whichever is faster."""
        split = schedule in SPLIT_BACKWARD
        return [max(1.0 / sum(self.tables[mb].get(self.cluster.node(n).device, t, f).stage_split(1, False, False,
                                                                                                 split))
                    for f in self.flags) for n, t in block]

    def run(self):
        units = self.units()
        self.seed(units)
        for floor, schedule, mb, blocks, usd in units:
            self.unit_usd = usd
            best = self.key(*self.best) if self.best else math.inf
            if (floor * usd if self.goal.minimizes_cost else floor) >= best:
                break                # units run in order of their key's floor: none later can do better
            if floor >= self.bound:
                continue             # slower than the throughput floor
            floors = [{s: self.per_sample_floor(b, s, schedule) for s in self.sizes_for(b, mb)} for b in blocks]
            ranked = sorted((max(s * m * f[s] for (s, m), f in zip(alloc, floors)), alloc)
                            for alloc in self.allocations(blocks, schedule, mb))
            for alloc_floor, alloc in ranked:         # most balanced first: the incumbent falls sooner
                if alloc_floor >= self.bound:
                    break
                self.joint(blocks, schedule, alloc, mb)
        return self.best


def _proportional(total: int, weights: list[float]) -> list[int] | None:
    """Positive integers adding up to `total`, close to proportional to `weights` (None if impossible)."""
    if total < len(weights):
        return None
    raw = [1 + (total - len(weights)) * w / sum(weights) for w in weights]
    out = [int(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: out[i] - raw[i])[:total - sum(out)]:
        out[i] += 1
    return out


def exhaustive_best(cluster, model, profile, global_batch, seq_len, micro_batches,
                    schedules: tuple[str, ...] = PLAN_SCHEDULES, mixed_micro_batches: bool = False,
                    recompute: str = "none", goal=THROUGHPUT, optimizer_sharding: str = "none"):
    """The fastest feasible plan and its evaluation, as (plan, Evaluation), or None if no plan fits.
    Without `mixed_micro_batches` every pipeline runs one of `micro_batches` (those dividing the batch);
    with it each pipeline picks its own size from them. `recompute`: "none", "full" (every stage recomputes)
    or "auto" (each stage either way); `optimizer_sharding` likewise ("none", "dp", "auto"). `goal`
    (cost/money.py): the best plan for it instead of the fastest; GPUs may be left out either way."""
    assert recompute in RECOMPUTE_OPTIONS and optimizer_sharding in SHARDING_OPTIONS, (recompute, optimizer_sharding)
    search = _Search(cluster, model, profile, global_batch, seq_len, micro_batches, schedules, mixed_micro_batches,
                     recompute, goal, optimizer_sharding)
    return search.run()
