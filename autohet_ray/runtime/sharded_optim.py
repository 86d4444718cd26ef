"""AdamW over this rank's slices of the sharded buckets (ZeRO-1 across asymmetric holders).

Each owned piece (shard_layout.Piece: whole rows of one segment) gets its own master tensor (master dtype:
fp32 under bf16 compute, else the compute dtype) and AdamW moments, so a rank's optimizer state is its slice
only. Weight decay follows the parameter the piece belongs to (optim.decays); a tied embedding's piece stands
for both copies. `state_dict` gathers the slices back into each rank's full chunks (a collective). Snapshots
store the slices themselves (`stored_slices`, no collective): each is a box of the global tensor (a Chunk)
under the tensor's own names, so a step's slices tile every tensor like any plan's chunks do, and
checkpoint.restore reshards them onto any plan, sharded or not.
"""
from __future__ import annotations

import torch

from autohet_ray.layout import Chunk, to_local
from autohet_ray.runtime.lr_schedule import OptimizerConfig
from autohet_ray.runtime.adamw import AdamW
from autohet_ray.runtime.optim import ADAM_KEYS, decays, set_lr
from autohet_ray.runtime.shard_sync import ShardSync


def _moment(state: dict, name: str, region: Chunk, index) -> torch.Tensor:
    """A slice of a moment: loaded on its own ((name, region) key) or cut from the full chunk (`index`)."""
    return state[(name, region)][0] if (name, region) in state else state[name][0][index]


class ShardedAdamW:
    def __init__(self, sync: ShardSync, config: OptimizerConfig, *, master_dtype: torch.dtype,
                 tied_embeddings: bool, shapes: dict[str, tuple[int, ...]]):
        self.sync, self.master_dtype, self.shapes = sync, master_dtype, shapes    # shapes: global, every param
        self.device = next(iter(sync.weights.values())).device
        self.masters: dict[int, list[torch.nn.Parameter]] = {}
        groups: tuple[list, list] = ([], [])
        for i, (_, _, pieces) in sync.layouts.items():
            segments = sync.ops[i].segments
            self.masters[i] = []
            for piece in pieces:
                seg = segments[piece.segment]
                name = sync._local(seg)[0]
                src = sync.weights[name].detach()[to_local(piece.region, sync.chunks[name])]
                master = torch.nn.Parameter(src.to(master_dtype).clone())
                self.masters[i].append(master)
                groups[0 if decays(seg.name, tied_embeddings=tied_embeddings) else 1].append(master)
        param_groups = [{"params": groups[0], "weight_decay": config.weight_decay},
                        {"params": groups[1], "weight_decay": 0.0}]
        param_groups = [g for g in param_groups if g["params"]]
        self.optimizer = (AdamW(param_groups, lr=config.lr_at(0), betas=config.betas)
                          if param_groups else None)

    @property
    def num_state_bytes(self) -> int:
        """Bytes of this rank's masters and AdamW moments (resident optimizer state)."""
        total = 0
        for ms in self.masters.values():
            for m in ms:
                total += m.numel() * m.element_size()
                for key in ADAM_KEYS:
                    t = self.optimizer.state.get(m, {}).get(key)
                    total += 0 if t is None else t.numel() * t.element_size()
        return total

    def attach_grads(self) -> list[torch.Tensor]:
        """Point each master's gradient at its part of the reduced slice; the gradients, for the norm."""
        out = []
        for i, ms in self.masters.items():
            bounds, k, pieces = self.sync.layouts[i]
            flat = self.sync.reduced.pop(i)
            for m, piece in zip(ms, pieces):
                off = piece.start - bounds[k]
                m.grad = flat[off: off + piece.numel].view(m.shape)
                out.append(m.grad)
        return out

    def _flat(self, i: int, pick) -> torch.Tensor:
        parts = [pick(m).reshape(-1) for m in self.masters[i]]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=self.master_dtype, device=self.device)

    def step(self, lr: float, compute_dtype: torch.dtype) -> None:
        if self.optimizer is not None:
            set_lr(self.optimizer, lr)
            self.optimizer.step()
        self.sync.post_gathers({i: self._flat(i, lambda m: m.detach()) for i in self.masters}, compute_dtype)

    def gathered(self, chunk_shapes: dict[str, tuple[int, ...]], pick, *, moments: bool) -> dict:
        """Full-chunk tensors of every sharded name from every rank's pieces: key -> (tensor, name), `pick(m)`
        under the name itself, and with `moments` AdamW's under optim.<name>.<key>. A collective over each
        bucket's ranks (every rank calls it with the same `moments`)."""
        keys = [("", pick)]
        if moments:
            keys += [(k, lambda m, k=k: self.optimizer.state[m][k]) for k in ADAM_KEYS]
        out: dict = {}
        for suffix, get in keys:
            into = {n: torch.zeros(shape, dtype=self.master_dtype, device=self.device)
                    for n, shape in chunk_shapes.items()}
            for i in self.masters:
                self.sync.scatter_bucket(i, self.sync.gather_bucket(i, self._flat(i, get)), into)
            out.update({(f"optim.{n}.{suffix}" if suffix else n): (t, n) for n, t in into.items()})
        return out

    def slice_needs(self) -> dict:
        """(optim.<name>.<key>, region) -> (global shape, region): the slices of AdamW's moments this rank
        owns, which is all of them it loads from a checkpoint (checkpoint.restore, keyed by name and chunk)."""
        out = {}
        for i in self.masters:
            for piece in self.sync.layouts[i][2]:
                name = self.sync._local(self.sync.ops[i].segments[piece.segment])[0]
                out.update({(f"optim.{name}.{k}", piece.region): (self.shapes[name], piece.region)
                            for k in ADAM_KEYS})
        return out

    def load(self, state: dict, chunks: dict) -> None:
        """Take this rank's slices of the full chunks in `state` (name -> (tensor, shape, chunk)); a moment's
        slice may be there on its own, keyed (name, chunk) as `slice_needs` asks for it."""
        step = float(state["optim.step"][0]) if "optim.step" in state else 0.0
        if self.optimizer is not None:
            self.optimizer.state.clear()
        with torch.no_grad():
            for i, ms in self.masters.items():
                _, _, pieces = self.sync.layouts[i]
                for m, piece in zip(ms, pieces):
                    name = self.sync._local(self.sync.ops[i].segments[piece.segment])[0]
                    index = to_local(piece.region, chunks[name])
                    m.copy_(state[name][0][index])
                    if step > 0:
                        self.optimizer.state[m] = {
                            "step": torch.tensor(step, dtype=torch.float32),
                            **{k: _moment(state, f"optim.{name}.{k}", piece.region, index).to(m.dtype).clone()
                               for k in ADAM_KEYS}}

    def _stored_names(self, i: int, piece, *, stored_only: bool = True) -> tuple[str, ...]:
        """The tensor names a piece is stored under: none unless its op holds the stored copy (`stored_only`);
        both tied names for a tied embedding's piece (it stands for both tensors)."""
        if stored_only and not self.sync.stores[i][piece.segment]:
            return ()
        name = self.sync.ops[i].segments[piece.segment].name
        tied = self.sync.tied
        return tuple(tied) if tied is not None and name == tied[0] else (name,)

    def stored_slices(self, *, moments: bool, stored_only: bool = True) -> dict:
        """(name, chunk) -> (view of the live tensor, global shape, chunk): this rank's stored slices of the
        masters and, with `moments`, of AdamW's moments (optim.<name>.<key>). Views: valid until the next step.
        `stored_only=False`: every slice it owns, also those another op's slices of the same tensor store."""
        out = {}
        for i, ms in self.masters.items():
            for m, piece in zip(ms, self.sync.layouts[i][2]):
                for name in self._stored_names(i, piece, stored_only=stored_only):
                    entry = (self.shapes[name], piece.region)
                    out[(name, piece.region)] = (m.detach(), *entry)
                    for key in ADAM_KEYS if moments else ():
                        out[(f"optim.{name}.{key}", piece.region)] = (self.optimizer.state[m][key].detach(), *entry)
        return out

    def stored_holdings(self) -> list[tuple[str, Chunk, int]]:
        """(name, chunk, bytes) of every slice `stored_slices(moments=True)` returns, moments or not yet."""
        item = torch.empty((), dtype=self.master_dtype).element_size()
        out = []
        for name, chunk in self.stored_slices(moments=False):
            out += [(n, chunk, chunk.numel * item) for n in (name, *(f"optim.{name}.{k}" for k in ADAM_KEYS))]
        return out
