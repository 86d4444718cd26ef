"""Shared helpers of the checkpoint tests (no tests here): a tiny model state under TP layouts, and a
mini job that snapshots several ranks into node keepers (MemoryTier), peer keepers and a cloud tier."""
from __future__ import annotations

import torch

from autohet_ray.checkpoint import (AsyncSnapshotter, Faults, MemoryTier, SnapshotPolicy, assign_writers,
                                    choose_peers, commit_step)
from autohet_ray.layout import Chunk, shard_chunk

SHAPES = {
    "embedding.tok.weight": ((7, 4), torch.bfloat16, 0),        # (global shape, dtype, TP split dim)
    "layers.0.attn.qkv.weight": ((9, 5), torch.float32, 0),     # column-parallel: rows split
    "layers.0.mlp.fc2.weight": ((5, 9), torch.float32, 1),      # row-parallel: columns split
    "layers.0.mlp.fc2.bias": ((5,), torch.float32, None),       # replicated across TP
    "optim.layers.0.attn.qkv.weight.exp_avg": ((9, 5), torch.float32, 0),
    "optim.step": ((), torch.int64, None),
}


def full_state(step: int, shapes=SHAPES) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    out = {}
    for name, (shape, dtype, _) in shapes.items():
        if dtype == torch.int64:
            out[name] = torch.tensor(step, dtype=torch.int64) if shape == () else torch.randint(0, 99, shape, generator=gen)
        else:
            out[name] = torch.randn(shape, generator=gen).to(dtype)
    return out


def rank_states(full: dict[str, torch.Tensor], tp: int, shapes=SHAPES, split_dims=None) -> list[dict]:
    """The state_dict() of each of `tp` ranks: name -> (local tensor, global shape, chunk)."""
    states = []
    for rank in range(tp):
        state = {}
        for name, (shape, _, dim) in shapes.items():
            dim = (split_dims or {}).get(name, dim)
            chunk = shard_chunk(shape, dim, tp, rank)
            state[name] = (full[name][chunk.slices()].clone(), shape, chunk)
        states.append(state)
    return states


def needs_of(states: list[dict]) -> list[dict[str, tuple[tuple[int, ...], Chunk]]]:
    return [{name: (shape, chunk) for name, (_, shape, chunk) in st.items()} for st in states]


def assert_bit_exact(restored: dict, full: dict[str, torch.Tensor]) -> None:
    for name, (tensor, shape, chunk) in restored.items():
        expected = full[name][chunk.slices()]
        assert tensor.dtype == expected.dtype and tensor.shape == expected.shape, name
        assert torch.equal(tensor, expected), name


class MiniJob:
    """Ranks on nodes; each node's keeper is a MemoryTier; each rank replicates to its node's peer."""

    def __init__(self, node_gpu: dict[str, str], rank_nodes: list[str], cloud, *, cloud_every: int = 1,
                 faults: Faults | None = None):
        self.faults = faults or Faults()
        self.keepers = {node: MemoryTier(f"keeper-{node}") for node in node_gpu}
        self.cloud = cloud
        peers = choose_peers({node: node for node in node_gpu}, node_gpu)
        self.snapshotters = [
            AsyncSnapshotter(local=self.keepers[node], peers=[self.keepers[p] for p in peers[node]], storage=cloud,
                             policy=SnapshotPolicy(storage_every=cloud_every, num_threads=2), faults=self.faults)
            for node in rank_nodes]

    def save(self, step: int, states: list[dict], *, dedupe: bool = True) -> None:
        holdings = {r: [(n, c, t.numel() * t.element_size()) for n, (t, _, c) in st.items()]
                    for r, st in enumerate(states)}
        owned = assign_writers(holdings) if dedupe else {r: None for r in holdings}
        handles = [snap.snapshot(step, st, owned=owned[r])
                   for r, (snap, st) in enumerate(zip(self.snapshotters, states))]
        fast = [rec for h in handles for rec in h.fast_result(timeout=60).records]
        commit_step(step, fast, list(self.keepers.values()), faults=self.faults)
        if any(h.storage is not None for h in handles):
            cloud = [rec for h in handles for rec in h.storage_result(timeout=60).records]
            commit_step(step, cloud, [self.cloud], faults=self.faults)

    def all_tiers(self) -> list:
        return [*self.keepers.values(), self.cloud]

    def close(self) -> None:
        for snap in self.snapshotters:
            snap.close()
