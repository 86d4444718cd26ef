"""A proven lower bound on the iteration time of every plan of a cluster: a fluid (linear) relaxation of the
whole plan space, solved with cvxpy. Not limited to the planner's templates: any grouping, TP degree, pipeline
shape, layer split, micro-batch size per pipeline and schedule is a point of the relaxation.

Why it holds, for the cost model (cost/evaluate.py). Take any plan and any stage s of it: TP degree t_s on
devices of type d, n_s layers, in pipeline k with m_k micro-batches of b_k samples (S_k = m_k b_k samples).
1. The iteration ends no sooner than s's last gradient action plus its optimizer step, and a stage runs its
   actions one at a time from time 0: T >= m_k * (F + B + W of s per micro-batch) + opt_s.
2. The per-micro-batch time is linear in the layers: n_s * layer + [first] embed + [last] head, so
   t_s * m_k * (F + B + W) = n_s S_k (t_s layer / b_k) + ... >= n_s S_k * c_d + ..., where c_d is the least
   device-seconds per layer-sample of type d over every TP degree, micro-batch size and schedule allowed.
   t_s * opt_s = (n_s * layer + ...) parameters * optimizer bytes / HBM bandwidth does not depend on t_s.
3. Summing t_s * T over the stages of type d (they use distinct devices, at most N_d of them):
   N_d T >= c_d X_d + e_d Y_d + h_d Z_d + o_d H_d + oe_d F_d + oh_d G_d, with X_d = sum n_s S_k
   (layer-samples run on d), Y_d / Z_d the samples whose embedding / head run on d, H_d = sum n_s (layers held
   on d), F_d / G_d the pipelines whose first / last stage is on d. Over all types: sum X = B L, sum Y =
   sum Z = B, sum H = K L, sum F = sum G = K for K >= 1 pipelines; X_d <= B H_d, Y_d <= B F_d, Z_d <= B G_d.
4. Memory: a device keeps its stage's weights and optimizer state and at least one micro-batch's activations
   (the peak follows the first forward), so t_s * capacity_d >= n_s (layer state + t_s layer activations)
   + ..., and summing over type d: m_d H_d + me_d F_d + mh_d G_d <= N_d * capacity_d (m_d: the least over
   TP degrees and micro-batch sizes). A (type, TP degree) whose device cannot hold even one layer (with the
   embedding or head, for a first or last stage) is no option at all.
5. Recomputation (when the job allows it): a recomputing stage keeps only each layer's input per micro-batch
   plus one layer's full activations while it is rebuilt, and runs one more forward per layer. Each
   coefficient is then the least over both options as well: the compute ones come from stages that do not
   recompute, the memory ones from stages that do (per layer without the one rebuilt layer, which a stage
   holds once whatever its layer count), so every stage of every plan still obeys 1-4.
6. Sharded optimizer state (when the job allows it): a stage shards across at most one holder per pipeline,
   so at most N (all GPUs) ways; (master + moments) per parameter and the optimizer step's work shrink with
   the ways, so the memory and optimizer coefficients are the least over replicated and N-way sharded state.
Pipeline bubbles, links and gradient sync only add time, and are left out. The bound is the least T of this
linear program; an interior-point solve is approximate, so the result is lowered by SOLVER_SLACK.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import cvxpy as cp

from autohet_ray import ConfigError
from autohet_ray.cluster.spec import Cluster
from autohet_ray.cost.terms import GroupCost, GroupCostTable
from autohet_ray.model.spec import ModelSpec
from autohet_ray.plan.schema import check_recompute
from autohet_ray.plan.schedule import PLAN_SCHEDULES, SPLIT_BACKWARD
from autohet_ray.profile.db import ProfileDB

SOLVER_SLACK = 1e-6          # relative: the LP's optimum is known to about this precision
TP_DEGREES = (1, 2, 4, 8, 16)


@dataclass(frozen=True, kw_only=True)
class TypeCoefficients:
    """The least cost per unit of work on one device type, over its TP degrees, micro-batch sizes and the
    schedules allowed (each unit: device-seconds, or bytes summed over the stage's devices)."""
    devices: int                  # N_d
    capacity_bytes: float         # usable memory of one device
    layer_s: float                # device-seconds per layer and sample (forward + backward)
    embed_s: float                # per sample, on a first stage
    head_s: float                 # per sample, on a last stage
    layer_opt_s: float            # device-seconds of the optimizer step per layer held
    embed_opt_s: float
    head_opt_s: float
    layer_bytes: float            # bytes per layer held (state + one micro-batch's activations), all TP ranks
    embed_bytes: float
    head_bytes: float


RECOMPUTE_OPTIONS = {"none": (False,), "full": (True,), "auto": (False, True)}


def _group_costs(cluster: Cluster, model: ModelSpec, profile: ProfileDB, seq_len: int, device: str,
                 recompute: str = "none", sharding: str = "none"):
    """(TP degree, micro-batch size, GroupCost) for every profiled TP degree and micro-batch size of one device
    type, and each recomputation and optimizer-sharding option allowed."""
    ways = (1,) if sharding == "none" else (1, max(1, cluster.num_gpus))
    largest_node = max(n.count for n in cluster.nodes if n.device == device)
    sizes = sorted({key[2] for key in profile.entries if key[0] == device})
    for mb in sizes:
        table = GroupCostTable(model=model, cluster=cluster, profile=profile, micro_batch=mb, seq_len=seq_len)
        for tp in TP_DEGREES:
            if tp <= largest_node and model.valid_tp(tp) and profile.has(device, tp, mb):
                for flag in RECOMPUTE_OPTIONS[recompute]:
                    for w in ways:
                        yield tp, mb, table.get(device, tp, flag, w)


ROLES = {"layer": (1, False, False), "embed": (0, True, False), "head": (0, False, True)}   # (layers, first, last)


def _role_costs(gc: GroupCost, role: str, split: bool) -> tuple[float, float, int]:
    """(seconds of one micro-batch, optimizer seconds, bytes with one micro-batch in flight) on one rank of
    the role alone: one layer, or the embedding / head (per-stage figures are linear in these)."""
    n, first, last = ROLES[role]
    base = (0, False, False)
    work = sum(gc.stage_split(n, first, last, split)) - sum(gc.stage_split(*base, split))
    opt = gc.optimizer_s(n, first, last) - gc.optimizer_s(*base)
    # stage_memory rounds down to whole bytes: 2 bytes less keeps the coefficient a lower bound; a layer's
    # share is the second layer's (the first also brings the one rebuilt layer of a recomputing stage)
    mem = gc.stage_memory(n + 1, first, last, 1, 0) - gc.stage_memory(1, *base[1:], 1, 0) - 2 if n else \
        gc.stage_memory(0, first, last, 1, 0) - gc.stage_memory(*base, 1, 0) - 2
    return work, opt, mem


def type_coefficients(cluster: Cluster, model: ModelSpec, profile: ProfileDB, seq_len: int, device: str,
                      schedules: tuple[str, ...], recompute: str = "none",
                      sharding: str = "none") -> TypeCoefficients | None:
    """The least costs of one device type over its options; None when no option holds one layer. A role
    (embedding, head) no option can take on this type is math.inf."""
    best = {f"{r}_{k}": math.inf for r in ("layer", "embed", "head") for k in ("s", "opt_s", "bytes")}
    capacity = 0.0
    for tp, mb, gc in _group_costs(cluster, model, profile, seq_len, device, recompute, sharding):
        capacity = gc.capacity_bytes
        for role in ROLES:
            _, first, last = ROLES[role]
            if gc.stage_memory(1, first, last, 1, 0) > gc.capacity_bytes:
                continue             # a stage of this TP degree cannot hold one layer (and its role)
            for schedule in schedules:
                work, opt, mem = _role_costs(gc, role, schedule in SPLIT_BACKWARD)
                best[f"{role}_s"] = min(best[f"{role}_s"], tp * work / mb)
                best[f"{role}_opt_s"] = min(best[f"{role}_opt_s"], tp * opt)
                best[f"{role}_bytes"] = min(best[f"{role}_bytes"], tp * mem)
    if math.isinf(best["layer_s"]):
        return None
    return TypeCoefficients(devices=cluster.gpus_of(device), capacity_bytes=capacity, **best)


def lower_bound_iteration_s(*, cluster: Cluster, model: ModelSpec, profile: ProfileDB, global_batch: int,
                            seq_len: int, schedules: tuple[str, ...] = PLAN_SCHEDULES,
                            recompute: str = "none", optimizer_sharding: str = "none") -> float:
    """Seconds per iteration that no plan of `cluster` reaches below, under the cost model with `profile`
    (every micro-batch size in the profile, every TP degree, every schedule of `schedules`, and with
    `recompute` "auto" every stage with or without recomputation, with "full" every stage with it); math.inf
    when no device type can hold a layer. See the module docstring for the proof. Takes about 0.1-0.5 s at 1024 GPUs
    (the program has six variables per device type; most of the time is building the per-type costs)."""
    if not schedules or any(s not in PLAN_SCHEDULES for s in schedules):
        raise ConfigError(f"schedules={schedules!r}; valid: {', '.join(PLAN_SCHEDULES)}")
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise ConfigError(f"global batch {global_batch!r} must be a positive integer")
    if profile.seq_len != seq_len:
        raise ConfigError(f"the {profile.kind} profile was made for seq_len {profile.seq_len}, not {seq_len}")
    check_recompute(recompute)
    coeffs = [c for d in cluster.device_types()
              if (c := type_coefficients(cluster, model, profile, seq_len, d, tuple(schedules), recompute,
                                         optimizer_sharding))
              is not None]
    if not coeffs:
        return math.inf
    return _solve(coeffs, global_batch, model.num_layers) * (1 - SOLVER_SLACK)


def _solve(coeffs: list[TypeCoefficients], batch: int, layers: int) -> float:
    """The relaxation's least iteration time. Work is in shares of the whole (x: of the B*L layer-samples,
    y / z: of the B samples' embeddings / heads), holdings in layers (h) and pipelines (f, g)."""
    n = len(coeffs)
    x, y, z = cp.Variable(n, nonneg=True), cp.Variable(n, nonneg=True), cp.Variable(n, nonneg=True)
    h, f, g = cp.Variable(n, nonneg=True), cp.Variable(n, nonneg=True), cp.Variable(n, nonneg=True)
    pipelines, t = cp.Variable(), cp.Variable()
    cons = [cp.sum(x) == 1, cp.sum(y) == 1, cp.sum(z) == 1, cp.sum(h) == pipelines * layers,
            cp.sum(f) == pipelines, cp.sum(g) == pipelines, pipelines >= 1]
    for i, c in enumerate(coeffs):
        busy = c.layer_s * batch * layers * x[i] + c.layer_opt_s * h[i]
        held = c.layer_bytes * h[i]
        cons += [layers * x[i] <= h[i], y[i] <= f[i], z[i] <= g[i]]
        for share, count, role in ((y, f, "embed"), (z, g, "head")):
            if math.isinf(getattr(c, f"{role}_s")):
                cons += [count[i] == 0]          # no first / last stage fits on this type
                continue
            busy = busy + getattr(c, f"{role}_s") * batch * share[i] + getattr(c, f"{role}_opt_s") * count[i]
            held = held + getattr(c, f"{role}_bytes") * count[i]
        cons += [busy <= c.devices * t, held / (c.devices * c.capacity_bytes) <= 1]
    problem = cp.Problem(cp.Minimize(t), cons)
    problem.solve(solver=cp.CLARABEL)
    if problem.status == cp.INFEASIBLE:
        return math.inf              # the model's state fits nowhere, even spread fluidly
    assert problem.status == cp.OPTIMAL, problem.status
    return float(t.value)
