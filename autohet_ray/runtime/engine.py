"""One rank's training engine for a (possibly asymmetric) plan: its stage in its TP shard, the pipeline
schedule with inter-stage bridges, layer-wise gradient sync across pipelines, clipping and AdamW."""
from __future__ import annotations

import time
from typing import Callable

import torch
import torch.distributed as dist

from autohet_ray import ConfigError
from autohet_ray.model.spec import ModelSpec
from autohet_ray.nn import param_shapes
from autohet_ray.nn.model import init_tied_head, tied_names
from autohet_ray.plan.rankmap import SYNC_BUCKET_ELEMENTS, build_rank_map
from autohet_ray.plan.schema import Plan
from autohet_ray.runtime.bridge import Bridge, route
from autohet_ray.runtime.checks import IGNORE_INDEX, check_batch, check_plan
from autohet_ray.runtime.device import resolve_device, resolve_dtype
from autohet_ray.runtime.executor import Clock, MicroBatches, StageExecutor
from autohet_ray.layout import Chunk
from autohet_ray.runtime.grad_sync import GradSync, plan_grad_sync, unit_of
from autohet_ray.runtime.groups import create_groups
from autohet_ray.runtime.lr_schedule import OptimizerConfig
from autohet_ray.runtime.optim import (ADAM_KEYS, STEP_KEY, StateDict, build_adamw, clip_, holdings_of_layout,
                                      live_views, load_optimizer_state, needs_of_layout, optimizer_state,
                                      resolve_config, set_lr, squared_norm)
from autohet_ray.runtime.parallelize import build_stage_model, shard_dim
from autohet_ray.runtime.precision import MasterGradStore, MasterWeights
from autohet_ray.runtime.shard_sync import ShardSync, plan_slice_weights, sharded_units
from autohet_ray.runtime.sharded_optim import ShardedAdamW
from autohet_ray.plan.schedule import SCHEDULES, SPLIT_BACKWARD
from autohet_ray.runtime.tp import ColumnParallelLinear, RowParallelLinear, TPContext
from autohet_ray.runtime.wgrad import WeightGradStore


class Engine:
    """One rank of a plan. torch.distributed must be initialized with one rank per device of the plan (plan
    rank r = rank r of `world_group`, default the whole world); the constructor creates the plan's subgroups
    that this rank belongs to with their other members (runtime/groups.py), so the ranks must construct their
    Engines at the same time; a group of this world with the same members (an earlier Engine's) is kept
    (`groups_built` counts both).

    train_step returns {"loss", "grad_norm" (before clipping), "lr" (of this update), "step", "timings"};
    timings are this rank's seconds per op name summed over the step ("forward", "backward", "send_activation",
    "recv_activation", "send_grad", "recv_grad", "grad_sync", "optimizer", and "wgrad" under a split-backward
    schedule such as "zb-h1") plus "step" (wall time of the whole step).
    `schedule`: the pipeline schedule (plan/schedule.py); None runs the plan's.
    `optimizer`: AdamW, clipping and LR schedule (default OptimizerConfig()); `lr`, `weight_decay` and
    `max_grad_norm` (clip_grad), when given, replace those fields.
    `shard_weights`: plan rank -> relative size of its slices of sharded optimizer state; None: the plan's
    (each stage's slice_weight, chosen by planner/slice_sizes.py; equal unless it says otherwise).
    `dtype`: compute dtype; default bf16 on CUDA, fp32 on CPU. Under bf16 the optimizer keeps fp32 master
    weights (runtime/precision.py); state_dict, live_state and grads are the masters' (fp32).
    state_dict: name -> (CPU tensor, global shape, Chunk) for parameters ("layers.3.mlp.fc1.weight"), AdamW
    state ("optim.<param>.exp_avg", "optim.<param>.exp_avg_sq") and "optim.step" (0-dim, whole chunk).
    """

    def __init__(self, *, plan: Plan, model_spec: ModelSpec, rank: int, world_group=None, seed: int = 0,
                 optimizer: OptimizerConfig | None = None, lr: float | None = None,
                 weight_decay: float | None = None, max_grad_norm: float | None = None, device=None,
                 dtype=None, pacer=None, schedule: str | None = None,
                 sync_bucket_elements: int = SYNC_BUCKET_ELEMENTS, optimizer_sharding: str | None = None,
                 shard_weights: dict[int, float] | None = None):
        schedule = _checked_schedule(plan, model_spec, schedule, optimizer_sharding)
        self.plan, self.spec, self.rank, self.world_group = plan, model_spec, rank, world_group
        self.optimizer_config = resolve_config(optimizer, lr=lr, weight_decay=weight_decay, clip_grad=max_grad_norm)
        self._place(rank, device, dtype)
        tied = tied_names(model_spec)         # tied embeddings: one tensor on first and last stages
        units = sharded_units(plan, self.rank_map, model_spec.num_layers, tied=bool(tied), mode=optimizer_sharding)
        ops = plan_grad_sync(self.rank_map, [(n, s, shard_dim(n)) for n, s in param_shapes(model_spec).items()],
                             sync_bucket_elements, tied=tied, sharded_units=units)
        groups, self.groups_built = create_groups(self.rank_map, ops, me=rank, to_global=self._global)
        self._build_model(groups, seed, tied)
        alias = {tied[1]: "embedding"} if tied else {}
        carriers = {n for n in self.params if alias.get(n, unit_of(n)) in units}      # optimizer state sharded
        weights = plan_slice_weights(plan, self.rank_map) if shard_weights is None else shard_weights
        self._build_sync(ops, groups, tied, carriers, weights)
        self._build_optimizers(carriers, tied)
        self.bridge = self._make_bridge()
        self.clock = Clock(pacer, self.device)
        self.before_update: Callable[[], None] | None = None
        self._hooks: list = []                # handles of the hooks on parameters and modules (release)
        """Called right before the optimizer changes parameters and moments in place (a background snapshot
        copy of the previous step waits there)."""
        self._build_executor(schedule)
        if self.sharded is not None:
            self._settle_gathers_before_forward()
        self.step = 0

    def _place(self, rank: int, device, dtype) -> None:
        """This rank's place in the plan: pipeline, stage, micro-batch size, device and compute dtype."""
        self.rank_map = build_rank_map(self.plan, self.spec.num_layers)
        self._check_world(rank)
        self.info = info = self.rank_map.ranks[rank]
        self.micro_batch = self.plan.micro_batch_of(info.pipeline)     # this pipeline's samples per micro-batch
        self.stages = self.plan.pipelines[info.pipeline].stages
        self.first, self.last = info.stage == 0, info.stage == len(self.stages) - 1
        self.device = resolve_device(device, self.world_group)
        self.dtype = resolve_dtype(dtype, self.device)

    def _build_model(self, groups: dict, seed: int, tied: tuple[str, str] | None) -> None:
        """This stage's modules in its TP shard (the tied head given the embedding's values), and its layout."""
        my_stage = self.rank_map.tp_group(self.rank)
        self.tp = TPContext(size=len(my_stage), rank=self.info.tp_rank, group=groups.get(my_stage))
        stage = self.stages[self.info.stage]
        self.model, self.layout = build_stage_model(
            self.spec, layers=stage.layers, first=self.first, last=self.last, tp=self.tp,
            seed=seed, device=self.device, dtype=self.dtype)
        self.model.recompute = stage.recompute     # torch.utils.checkpoint around each block
        if tied and self.last:
            init_tied_head(self.model, self.layout, seed=seed, num_layers=self.spec.num_layers)
        self.params = dict(self.model.named_parameters())

    def _build_sync(self, ops, groups: dict, tied, carriers: set[str], shard_weights) -> None:
        """Masters (fp32 under bf16), the gradient sync (reduce-scatter for `carriers`, the parameters whose
        optimizer state is sharded) and the parameters updated here whole."""
        self.mixed = MasterWeights(self.params, carriers) if self.dtype == torch.bfloat16 else None
        self.masters = self.params if self.mixed is None else self.mixed.masters    # what AdamW updates
        # Gradients are reduced in fp32 (the masters'), not bf16: a bf16 all-reduce rounds every partial sum to
        # 8 mantissa bits (NCCL and gloo accumulate in the wire dtype; there is no bf16-in/fp32-accumulate
        # all-reduce), and the fp32 gradient is already there for the update. The price: 2x the sync bytes.
        sync_args = dict(ops=ops, me=self.rank, params=self.masters, groups=groups, tied=tied,
                         chunks={n: c for n, (_, c) in self.layout.items()})
        self.grad_sync = (ShardSync(weights=self.params, shard_weights=shard_weights, **sync_args) if carriers
                          else GradSync(**sync_args))
        assert not carriers or self.grad_sync.sharded_names() == carriers, (carriers, self.grad_sync.sharded_names())
        self.local_masters = {n: p for n, p in self.masters.items() if n not in carriers}   # updated here whole

    def _build_optimizers(self, carriers: set[str], tied) -> None:
        """AdamW over the whole local masters and over this rank's slices; which gradients the norm counts."""
        info = self.info
        # each parameter counted once in the global norm: pipeline 0's copy, TP-replicated ones on TP rank 0
        self.norm_params = [n for n in self.local_masters
                            if info.pipeline == 0 and (shard_dim(n) is not None or info.tp_rank == 0)
                            and not (tied and n == tied[1])]
        tie = self.spec.tie_embeddings
        self.optimizer = (build_adamw(self.local_masters, self.optimizer_config, tied_embeddings=tie)
                          if self.local_masters else None)
        self.sharded = (ShardedAdamW(self.grad_sync, self.optimizer_config, master_dtype=self.master_dtype,
                                     tied_embeddings=tie, shapes=param_shapes(self.spec)) if carriers else None)

    def _build_executor(self, schedule: str) -> None:
        """The stage executor, gradient hooks (deferred weight gradients under a split backward) and actions."""
        store, deferred = self._defer_weight_grads() if schedule in SPLIT_BACKWARD else (None, {})
        self.executor = StageExecutor(model=self.model, bridge=self.bridge, tp=self.tp, first=self.first,
                                      last=self.last, clock=self.clock, before_last_backward=self.grad_sync.arm,
                                      wgrad=store,
                                      on_final_weight_grad=lambda p: self.grad_sync.on_grad(deferred[p]))
        # a deferred weight's gradient is final after the step's last W, not when autograd calls its hook
        for name, p in self.params.items():
            if p not in deferred:
                self._hooks.append(p.register_post_accumulate_grad_hook(lambda _, name=name: self._on_grad(name)))
        m = self.plan.pipelines[self.info.pipeline].num_microbatches
        self.actions = SCHEDULES[schedule](len(self.stages), self.info.stage, m)
        self.sample_offset = self.plan.sample_offset(self.info.pipeline)

    def _settle_gathers_before_forward(self) -> None:
        """Each unit's forward first waits for the all-gathers of the new weights it reads (posted after the
        last update: shard_sync.ShardSync.post_gathers)."""
        units = [("embedding", self.model.embedding), ("head", self.model.head),
                 *((f"layers.{i}", block) for i, block in self.model.layers.items())]
        for prefix, module in units:
            if module is not None:
                names = frozenset(n for n in self.params if n.startswith(prefix + "."))
                self._hooks.append(module.register_forward_pre_hook(
                    lambda *_, names=names: self.grad_sync.settle_gathers(names)))

    def _settled(self) -> None:
        """Every posted all-gather in the weights (before they are read or overwritten outside a forward)."""
        if self.sharded is not None:
            self.grad_sync.settle_gathers()

    def _defer_weight_grads(self) -> tuple[WeightGradStore, dict[torch.nn.Parameter, str]]:
        """Attach one store to every TP linear; their weights, by parameter -> name."""
        store = WeightGradStore() if self.mixed is None else MasterGradStore(self.mixed)
        names = {p: n for n, p in self.params.items()}
        deferred = {}
        for module in self.model.modules():
            if isinstance(module, (ColumnParallelLinear, RowParallelLinear)):
                module.wgrad_store = store
                deferred[module.weight] = names[module.weight]
        return store, deferred

    def _on_grad(self, name: str) -> None:
        """A compute parameter's gradient was accumulated (once per micro-batch; final in the last backward)."""
        if self.mixed is not None:
            self.mixed.accumulate(name)
        self.grad_sync.on_grad(name)

    @property
    def master_dtype(self) -> torch.dtype:
        """The dtype of the weights the optimizer updates, of its moments and of every checkpointed tensor."""
        return next(iter(self.masters.values())).dtype

    def _global(self, plan_rank: int) -> int:
        return plan_rank if self.world_group is None else dist.get_global_rank(self.world_group, plan_rank)

    def _check_world(self, rank: int) -> None:
        if not dist.is_initialized():
            raise ConfigError("torch.distributed must be initialized (init_process_group) before creating an Engine")
        size = dist.get_world_size(self.world_group)
        if size != dist.get_world_size():
            raise ConfigError(f"world_group has {size} of the default group's {dist.get_world_size()} ranks; "
                              "the Engine needs a group spanning every rank (it creates subgroups collectively)")
        if size != self.rank_map.world_size:
            raise ConfigError(f"the plan uses {self.rank_map.world_size} devices but the process group has {size} ranks")
        if not 0 <= rank < size:
            raise ConfigError(f"rank={rank} must lie in [0, {size})")

    def _make_bridge(self) -> Bridge:
        to_global = lambda ranks: None if ranks is None else tuple(self._global(r) for r in ranks)  # noqa: E731
        mine, me = to_global(self.rank_map.tp_group(self.rank)), self._global(self.rank)
        return Bridge(prev=route(mine, to_global(self.rank_map.prev_stage(self.rank)), me),
                      next=route(mine, to_global(self.rank_map.next_stage(self.rank)), me),
                      tp_group=self.tp.group, shape=(self.micro_batch, self.plan.seq_len, self.spec.hidden),
                      dtype=self.dtype, device=self.device)

    def _microbatches(self, ids: torch.Tensor, labels: torch.Tensor) -> MicroBatches:
        mb, m = self.micro_batch, self.plan.pipelines[self.info.pipeline].num_microbatches
        starts = [self.sample_offset + i * mb for i in range(m)]
        take = lambda t, use: [t[s: s + mb].to(self.device) for s in starts] if use else []  # noqa: E731
        return MicroBatches(input_ids=take(ids, self.first), labels=take(labels, self.last),
                            num_tokens=int((labels != IGNORE_INDEX).sum()))

    def abort(self) -> None:
        """Make a step running in another thread fail at its next forward or backward (thread-safe); the
        engine is not usable afterwards."""
        self.executor.stop.set()

    def release(self) -> None:
        """Drop this engine's hooks and gradients (it is not usable afterwards). Its hooks close over the
        engine, and the parameters that hold them are kept alive from C++ (autograd), a cycle Python's
        collector cannot free: without this a dropped engine's whole state stays in memory."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        for p in (*self.params.values(), *self.masters.values()):
            p.grad = None

    def train_step(self, batch) -> dict:
        """One optimizer step on the whole global batch (every rank gets the same batch)."""
        ids, labels = check_batch(batch, self.plan, self.spec)
        start = time.perf_counter()
        for p in (*self.params.values(), *self.masters.values()):
            p.grad = None
        loss = self.executor.run(self.actions, self._microbatches(ids, labels))
        self.clock.wait("flush", self.bridge.flush)      # inside the pacer's grad_sync window
        loss, norm = self.clock.run("grad_sync", lambda: self._sync(loss), num_bytes=self.grad_sync.num_bytes)
        if self.before_update is not None:
            self.before_update()          # outside the paced op: a wait here is the host's, not the device's
        lr = self.optimizer_config.lr_at(self.step)
        self.clock.run("optimizer", lambda: self._optimizer_step(norm, lr))
        self.step += 1
        timings = self.clock.reset()
        timings["step"] = time.perf_counter() - start
        return {"loss": loss, "grad_norm": norm, "lr": lr, "step": self.step, "timings": timings}

    def eval_step(self, batch) -> dict:
        """The loss of the whole global batch (forward only; weights and optimizer untouched)."""
        ids, labels = check_batch(batch, self.plan, self.spec)
        m = self.plan.pipelines[self.info.pipeline].num_microbatches
        loss = self.executor.evaluate(self._microbatches(ids, labels), m)
        self.bridge.flush()
        mine = self.last and self.tp.rank == 0
        total = loss if mine else torch.zeros_like(loss)
        dist.all_reduce(total, group=self.world_group)
        self.clock.reset()
        return {"loss": float(total)}

    def _sync(self, loss: torch.Tensor) -> tuple[float, float]:
        for p in self.masters.values():
            if p.grad is None:
                p.grad = torch.zeros(p.shape, dtype=p.dtype, device=p.device)
        self.grad_sync.start()
        self.grad_sync.finish()
        mine = self.last and self.tp.rank == 0
        squares = squared_norm([self.masters[n].grad for n in self.norm_params])
        if self.sharded is not None:          # each sharded element on exactly one rank: its slice's owner
            squares = squares + squared_norm(self.sharded.attach_grads()).to(squares.device)
        stats = torch.stack([loss if mine else torch.zeros_like(loss), squares.to(loss.device)])
        dist.all_reduce(stats, group=self.world_group)
        return float(stats[0]), float(stats[1].sqrt())

    def _optimizer_step(self, norm: float, lr: float) -> None:
        grads = [p.grad for p in self.local_masters.values()]
        if self.sharded is not None:
            grads += [m.grad for ms in self.sharded.masters.values() for m in ms]
        clip_(grads, norm, self.optimizer_config.clip_grad)
        if self.optimizer is not None:
            set_lr(self.optimizer, lr)
            self.optimizer.step()
        if self.mixed is not None:
            self.mixed.publish()
        if self.sharded is not None:
            self.sharded.step(lr, self.dtype)

    def state_dict(self) -> StateDict:
        """name -> (CPU copy of this rank's chunk, global shape, Chunk); parameters (the masters) and AdamW state.
        Under sharded optimizer state a collective: each bucket's ranks gather their slices into whole chunks."""
        self._settled()
        out: StateDict = {n: (p.detach().cpu().clone(), *self.layout[n]) for n, p in self.local_masters.items()}
        if self.optimizer is not None:
            out.update(optimizer_state(self.optimizer, self.local_masters, self.layout))
        if self.sharded is not None:
            out.update(self._gathered(lambda m: m.detach(), moments=self.step > 0))
            out[STEP_KEY] = (torch.tensor(float(self.step), dtype=torch.float64), (), Chunk.whole(()))
        return out

    def _gathered(self, pick, *, moments: bool) -> StateDict:
        shapes = {n: self.layout[n][1].sizes for n in self.grad_sync.sharded_names()}
        full = self.sharded.gathered(shapes, pick, moments=moments)
        return {key: (t.cpu(), *self.layout[name]) for key, (t, name) in full.items()}

    def live_state(self, *, gather: bool = True) -> StateDict:
        """The state_dict's entries as views of the live tensors (no copy): valid until the next update. Under
        sharded optimizer state, gathered copies (a collective, like state_dict); with `gather=False` (no
        collective: survivors after a loss) only what this rank holds whole: its unsharded tensors, and the
        sharded parameters' weights where the compute dtype is the master dtype and their all-gather is done."""
        if self.sharded is None:
            return live_views(self.optimizer, self.masters, self.layout)
        if gather:
            return self.state_dict()
        in_flight = self.grad_sync.settle_finished_gathers()     # a lost peer may never send its slice
        out = live_views(self.optimizer, self.local_masters, self.layout) if self.optimizer is not None else {}
        if self.mixed is None:
            out.update({n: (self.params[n].detach(), *self.layout[n])
                        for n in self.grad_sync.sharded_names() - in_flight})
        return out

    def live_regions(self) -> list[tuple[str, Chunk, torch.Tensor]]:
        """(name, chunk held, live view) of everything this rank can write without a collective (a survivor
        after a loss rewriting chunks no store holds any more): live_state(gather=False)'s tensors and, under
        sharded optimizer state, every slice of masters and moments it owns, and the step counter."""
        out = [(name, chunk, t) for name, (t, _, chunk) in self.live_state(gather=False).items()]
        if self.sharded is not None:
            slices = self.sharded.stored_slices(moments=self.step > 0, stored_only=False)
            out += [(name, chunk, t) for (name, chunk), (t, _, _) in slices.items()]
            out.append((STEP_KEY, Chunk.whole(()), torch.tensor(float(self.step), dtype=torch.float64)))
        return out

    def snapshot_state(self) -> dict:
        """What a snapshot of this rank stores, as views of the live tensors (no copy, no collective): valid
        until the next update. Without sharded optimizer state: live_state(). With it: the whole tensors this
        rank updates, and its stored slices of the sharded ones (masters and moments) keyed (name, chunk), a
        rank holding several slices of one tensor. Matches `snapshot_holdings`."""
        if self.sharded is None:
            return self.live_state()
        out: dict = live_views(self.optimizer, self.local_masters, self.layout) if self.optimizer is not None else {}
        out.update(self.sharded.stored_slices(moments=self.step > 0))
        out[STEP_KEY] = (torch.tensor(float(self.step), dtype=torch.float64), (), Chunk.whole(()))
        return out

    def snapshot_holdings(self) -> list[tuple[str, Chunk, int]]:
        """(name, chunk, bytes) of everything `snapshot_state` stores once the optimizer has stepped (for
        checkpoint.peers.place_copies): the master weights (fp32 under bf16 compute), their AdamW moments and
        the step counter; slices only for sharded optimizer state."""
        out = holdings_of_layout({n: self.layout[n] for n in self.local_masters}, self.master_dtype)
        return out + (self.sharded.stored_holdings() if self.sharded is not None else [])

    def grads(self) -> StateDict:
        """The gradients of the last step (synced and clipped), in the state_dict format (sharded ones gathered:
        a collective)."""
        out = {n: (p.grad.detach().cpu().clone(), *self.layout[n]) for n, p in self.local_masters.items()
               if p.grad is not None}
        if self.sharded is not None:
            out.update(self._gathered(lambda m: m.grad, moments=False))
        return out

    def restore_needs(self) -> dict:
        """What this rank loads from a checkpoint (checkpoint.restore's `needs`): its chunks of every parameter,
        its moments and the step (optim.needs_of_layout), except that the moments of sharded parameters are
        only the slices it owns, keyed (name, chunk): a restore reads only the saved boxes that overlap them."""
        needs = needs_of_layout(self.layout)
        if self.sharded is None:
            return needs
        for name in self.grad_sync.sharded_names():
            for key in ADAM_KEYS:
                needs.pop(f"optim.{name}.{key}")
        return needs | self.sharded.slice_needs()

    def load_state_dict(self, state: StateDict) -> None:
        """Load this rank's chunks (same format as state_dict; resharding is the caller's job)."""
        self._settled()
        with torch.no_grad():
            for name, p in self.masters.items():
                if name not in state:
                    raise ConfigError(f"state dict lacks {name!r}")
                tensor, shape, chunk = state[name]
                if (tuple(shape), chunk) != (self.layout[name][0], self.layout[name][1]):
                    raise ConfigError(f"state dict {name!r} holds chunk {chunk} of {tuple(shape)}; this rank "
                                      f"needs {self.layout[name][1]} of {self.layout[name][0]}")
                target = p if name in self.local_masters else self.params[name]
                target.copy_(tensor.to(device=target.device, dtype=target.dtype))
        if self.mixed is not None:
            self.mixed.publish()
        if self.optimizer is not None:
            load_optimizer_state(self.optimizer, self.local_masters, state)
        if self.sharded is not None:
            self.sharded.load(state, {n: c for n, (_, c) in self.layout.items()})
        self.step = int(float(state["optim.step"][0])) if "optim.step" in state else 0


def _checked_schedule(plan: Plan, model_spec: ModelSpec, schedule: str | None, optimizer_sharding) -> str:
    """The schedule to run (the plan's when None); ConfigError on a bad plan, schedule or sharding mode."""
    check_plan(plan, model_spec)
    schedule = schedule or getattr(plan, "schedule", "1f1b")
    if schedule not in SCHEDULES:
        raise ConfigError(f"schedule={schedule!r}; valid: {', '.join(SCHEDULES)}")
    if optimizer_sharding not in (None, "none", "dp"):
        raise ConfigError(f"optimizer_sharding={optimizer_sharding!r}; valid: none, dp (or None: the plan's)")
    return schedule
