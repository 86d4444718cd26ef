"""Worker side of the sharded-optimizer tests: one case run with and without sharded optimizer state in the
same spawned world (same seed, same batches), plus the resident optimizer bytes of every rank."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from _harness import LR, MAX_GRAD_NORM, WEIGHT_DECAY, make_batch, make_plan
from autohet_ray.runtime import Engine


@dataclass(frozen=True, kw_only=True)
class ShardCase:
    name: str
    spec: object
    pipelines: tuple
    steps: int = 5
    schedule: str = "1f1b"
    dtype: torch.dtype = torch.float64
    flags: tuple | None = None             # per pipeline, per stage shard_optimizer; None: every stage
    shard_weights: dict | None = None      # plan rank -> relative slice size
    slice_weights: tuple | None = None     # per pipeline, per stage: the plan's slice_weight (None: equal)
    resume_after: int | None = None        # sharded run only: rebuild from its (gathered) state_dict here
    reference: bool = True                 # compare with the one-process reference (not for random tied init)

    @property
    def plan(self):
        plan = make_plan(self.spec, *self.pipelines)
        plan = plan.with_optimizer_sharding(True if self.flags is None else self.flags)
        return plan if self.slice_weights is None else plan.with_slice_weights(self.slice_weights)


def optimizer_bytes(engine: Engine) -> int:
    """Bytes of the masters the optimizer updates and of its moments on this rank, counted from the tensors
    (compute weights and gradients excluded; under fp32/fp64 compute the weights are their own masters)."""
    total = 0
    own_masters = engine.mixed is not None
    for p in engine.local_masters.values():
        total += p.numel() * p.element_size() if own_masters else 0
    if engine.optimizer is not None:
        for state in engine.optimizer.state.values():
            total += sum(state[k].numel() * state[k].element_size() for k in ("exp_avg", "exp_avg_sq"))
    if engine.sharded is not None:
        total += engine.sharded.num_state_bytes
    return total


def _engine(case: ShardCase, rank: int, sharding: str | None) -> Engine:
    return Engine(plan=case.plan, model_spec=case.spec, rank=rank, seed=7, lr=LR, weight_decay=WEIGHT_DECAY,
                  max_grad_norm=MAX_GRAD_NORM, dtype=case.dtype, schedule=case.schedule,
                  optimizer_sharding=sharding, shard_weights=case.shard_weights)


def _run(case: ShardCase, rank: int, sharding: str | None) -> dict:
    engine = _engine(case, rank, sharding)
    out = {"losses": [], "norms": [], "pipeline": engine.info.pipeline, "stage": engine.info.stage, "overlap": []}
    sync, start = engine.grad_sync, engine.grad_sync.start

    def watched_start():
        out["overlap"].append((sync._posted, len(sync.ops)))
        start()
    sync.start = watched_start
    for step in range(case.steps):
        if sharding != "none" and case.resume_after == step:
            state = engine.state_dict()
            engine = _engine(case, rank, sharding)
            engine.load_state_dict(state)
        result = engine.train_step(make_batch(case.spec, case.plan, step))
        out["losses"].append(result["loss"])
        out["norms"].append(result["grad_norm"])
        if step == 0:
            out["grads"] = engine.grads()
    out["pending_gathers"] = len(getattr(engine.grad_sync, "gathers", {}))    # posted, awaiting a forward
    out["optimizer_bytes"] = optimizer_bytes(engine)
    out["sharded_ops"] = sum(op.sharded for op in engine.grad_sync.ops)
    out["state"] = engine.state_dict()
    return out


def run_pairs(rank: int, world_size: int, cases: list[ShardCase]) -> dict:
    """case name -> {"none": unsharded run, "sharded": the plan's sharding} on this rank."""
    return {c.name: {"none": _run(c, rank, "none"), "sharded": _run(c, rank, None)} for c in cases}


def train_then_state(rank: int, world_size: int, case: ShardCase, steps: int, sharding: str | None) -> dict:
    """`steps` steps of `case`'s plan from scratch: losses and what a snapshot stores (copies of
    snapshot_state: a sharded rank's own slices) with its holdings."""
    engine = _engine(case, rank, sharding)
    losses = [engine.train_step(make_batch(case.spec, case.plan, s))["loss"] for s in range(steps)]
    saved = {key: (t.detach().cpu().clone(), shape, c) for key, (t, shape, c) in engine.snapshot_state().items()}
    return {"losses": losses, "state": saved, "holdings": engine.snapshot_holdings(),
            "pipeline": engine.info.pipeline, "sharded_ops": sum(o.sharded for o in engine.grad_sync.ops)}


def restore_then_train(rank: int, world_size: int, case: ShardCase, root: str, steps: range,
                       sharding: str | None) -> dict:
    """Restore the newest committed step of the checkpoint under `root` onto `case`'s plan (resharded to this
    rank's chunks by checkpoint.restore), then train `steps`."""
    from autohet_ray.checkpoint import LocalDirTier, find_manifest, latest_committed_step, restore
    from autohet_ray.runtime.optim import needs_of_layout
    engine = _engine(case, rank, sharding)
    tier = LocalDirTier(root)
    manifest = find_manifest([tier], latest_committed_step([tier]))
    state, _ = restore(manifest, needs_of_layout(engine.layout), [tier])
    engine.load_state_dict(state)
    losses = [engine.train_step(make_batch(case.spec, case.plan, s))["loss"] for s in steps]
    return {"losses": losses, "step": engine.step, "sharded_ops": sum(o.sharded for o in engine.grad_sync.ops)}


def restore_slices_then_train(rank: int, world_size: int, case: ShardCase, root: str, steps: range) -> dict:
    """Restore the newest committed step under `root` onto `case`'s sharded plan twice: full chunks of every
    tensor (optim.needs_of_layout), then what the engine needs (Engine.restore_needs: only its slices of the
    sharded moments); load the second and train `steps`. Bytes read and needed of each."""
    from autohet_ray.checkpoint import LocalDirTier, find_manifest, latest_committed_step, restore
    from autohet_ray.runtime.optim import needs_of_layout
    engine = _engine(case, rank, None)
    tier = LocalDirTier(root)
    manifest = find_manifest([tier], latest_committed_step([tier]))
    out = {}
    for kind, needs in (("full", needs_of_layout(engine.layout)), ("sliced", engine.restore_needs())):
        state, report = restore(manifest, needs, [tier])
        out[f"{kind}_read"] = sum(report.bytes_by_tier().values())
        out[f"{kind}_needed"] = sum(max(1, chunk.numel) for _, chunk in needs.values())
    engine.load_state_dict(state)
    out["losses"] = [engine.train_step(make_batch(case.spec, case.plan, s))["loss"] for s in steps]
    return out
