"""AdamW over this rank's slices of the sharded buckets (ZeRO-1 across asymmetric holders).

Each owned piece (shard_layout.Piece: whole rows of one segment) gets its own master tensor (master dtype:
fp32 under bf16 compute, else the compute dtype) and AdamW moments, so a rank's optimizer state is its slice
only. Weight decay follows the parameter the piece belongs to (optim.decays); a tied embedding's piece stands
for both copies. The state dict gathers the slices back into each rank's full chunks (a collective), so a
sharded run's checkpoints have the same names and chunks as an unsharded run's and restore onto any plan.
"""
from __future__ import annotations

import torch

from autohet_ray.layout import to_local
from autohet_ray.runtime.lr_schedule import OptimizerConfig
from autohet_ray.runtime.optim import ADAM_KEYS, decays, set_lr
from autohet_ray.runtime.shard_sync import ShardSync


class ShardedAdamW:
    def __init__(self, sync: ShardSync, config: OptimizerConfig, *, master_dtype: torch.dtype,
                 tied_embeddings: bool):
        self.sync, self.master_dtype = sync, master_dtype
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
        self.optimizer = (torch.optim.AdamW(param_groups, lr=config.lr_at(0), betas=config.betas)
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
        self.sync.publish({i: self._flat(i, lambda m: m.detach()) for i in self.masters}, compute_dtype)

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

    def load(self, state: dict, chunks: dict) -> None:
        """Take this rank's slices of the full chunks in `state` (name -> (tensor, shape, chunk))."""
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
                            **{k: state[f"optim.{name}.{k}"][0][index].to(m.dtype).clone() for k in ADAM_KEYS}}
