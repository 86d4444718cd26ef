"""Asynchronous snapshots (CPU copy first, writes in the background, cloud every N) and peer choice."""
import threading

import pytest
import torch

from autohet_ray import ConfigError
from autohet_ray.checkpoint import (AsyncSnapshotter, MemoryTier, SnapshotPolicy, assign_writers, choose_peers,
                                    commit_step, find_manifest, restore)
from autohet_ray.layout import Chunk
from checkpoint_helpers import full_state, needs_of, rank_states


class GatedTier(MemoryTier):
    """A slow tier: writes wait until the test opens the gate."""

    def __init__(self, name):
        super().__init__(name)
        self.gate = threading.Event()

    def put_chunk(self, key, blob):
        assert self.gate.wait(30)
        super().put_chunk(key, blob)


def test_snapshot_returns_after_the_cpu_copy_and_writes_in_the_background():
    local, cloud = MemoryTier("node"), GatedTier("cloud")
    snap = AsyncSnapshotter(local=local, storage=cloud, policy=SnapshotPolicy(storage_every=2))
    full = full_state(2)
    state = rank_states(full, 1)[0]
    handle = snap.snapshot(2, state)
    for tensor, _, _ in state.values():                     # training continues and mutates the weights
        tensor.zero_() if tensor.dtype != torch.int64 else tensor.fill_(-1)
    fast = handle.fast_result(timeout=30)
    assert fast.bytes_written["node"] > 0 and not handle.storage.done()     # the storage lane is still blocked
    cloud.gate.set()
    uploaded = handle.storage_result(timeout=30)
    assert all(r.replicas == ("node", "cloud") for r in uploaded.records)
    manifest = commit_step(2, uploaded.records, [cloud])
    restored, _ = restore(manifest, needs_of([state])[0], [cloud])
    assert all(torch.equal(t, full[name]) for name, (t, _, _) in restored.items())       # the pre-mutation values
    assert snap.snapshot(3, state).storage is None                                     # not a storage step
    snap.close()


def test_only_owned_chunks_are_written():
    local = MemoryTier("node")
    snap = AsyncSnapshotter(local=local, policy=SnapshotPolicy(storage_every=0))
    state = rank_states(full_state(1), 2)[1]
    owned = {("optim.step", Chunk((), ()))}
    records = snap.snapshot(1, state, owned=owned).fast_result(timeout=30).records
    assert [r.name for r in records] == ["optim.step"] and local.list() == ["step-0000000001/optim.step/s"]
    snap.close()


def test_keeper_manifest_then_restore_from_peer_after_node_loss():
    node_gpu = {"a": "H100", "b": "H100", "c": "H20"}
    peers = choose_peers({"a": "a", "b": "b", "c": "c"}, node_gpu)
    keepers = {n: MemoryTier(f"keeper-{n}") for n in node_gpu}
    full = full_state(5)
    states = rank_states(full, 3)
    owned = assign_writers({r: [(n, c, t.numel()) for n, (t, _, c) in st.items()] for r, st in enumerate(states)})
    records = []
    for rank, node in enumerate("abc"):
        snap = AsyncSnapshotter(local=keepers[node], peers=[keepers[p] for p in peers[node]],
                                policy=SnapshotPolicy(storage_every=0))
        records += snap.snapshot(5, states[rank], owned=owned[rank]).fast_result(timeout=30).records
        snap.close()
    commit_step(5, records, list(keepers.values()))
    survivors = [keepers["b"], keepers["c"]]                          # node a is lost with its keeper
    manifest = find_manifest(survivors, 5)
    state, report = restore(manifest, needs_of(rank_states(full, 2))[0], survivors)
    assert all(torch.equal(t, full[n][c.slices()]) for n, (t, _, c) in state.items())
    assert not report.fallbacks


def test_choose_peers_prefers_another_gpu_pool_then_balances():
    node_gpu = {"a": "H100", "b": "H100", "c": "H20", "d": "H20"}
    peers = choose_peers({"a": "a", "b": "b", "c": "c", "d": "d"}, node_gpu)
    assert all(node_gpu[p[0]] != node_gpu[n] for n, p in peers.items())
    assert sorted(p[0] for p in peers.values()) == ["a", "b", "c", "d"]        # balanced: one each
    same_pool = choose_peers({"x": "a"}, {"a": "H100", "b": "H100"})
    assert same_pool == {"x": ["b"]}                                            # only choice: same pool
    two = choose_peers({"s": "a"}, node_gpu, num_peers=2)["s"]
    assert len(set(two)) == 2 and "a" not in two
    with pytest.raises(ConfigError, match="needs at least 2 nodes"):
        choose_peers({"s": "a"}, {"a": "H100"})
    with pytest.raises(ConfigError, match=r"nodes \['z'\] missing"):
        choose_peers({"s": "z"}, node_gpu)


def test_assign_writers_picks_one_holder_per_chunk_and_balances_bytes():
    whole, half0, half1 = Chunk((0,), (8,)), Chunk((0,), (4,)), Chunk((4,), (4,))
    holdings = {0: [("w", half0, 400), ("b", whole, 100)], 1: [("w", half1, 400), ("b", whole, 100)],
                2: [("w", half0, 400), ("b", whole, 100)]}                         # rank 2: a DP copy of rank 0
    owned = assign_writers(holdings)
    written = [item for items in owned.values() for item in items]
    assert sorted(written, key=str) == sorted({("w", half0), ("w", half1), ("b", whole)}, key=str)
    assert owned[2] and len(owned[0]) + len(owned[2]) == 2                     # the copy shares the work


def test_buffers_are_reused_only_after_every_lane_is_done_with_them():
    local, cloud = MemoryTier("node"), GatedTier("cloud")
    snap = AsyncSnapshotter(local=local, storage=cloud, policy=SnapshotPolicy(storage_every=2))
    full = full_state(2)
    state = rank_states(full, 1)[0]
    first = snap.snapshot(2, state)                         # a cloud step: its upload is held at the gate
    first.fast_result(timeout=30)
    lent = {id(item.blob) for item in first.items}
    original = {name: tensor.clone() for name, (tensor, _, _) in state.items()}
    for tensor, _, _ in state.values():
        tensor.add_(1) if tensor.is_floating_point() else tensor.fill_(5)
    second = snap.snapshot(3, state)                        # the upload still reads step 2: fresh buffers
    assert lent.isdisjoint(id(item.blob) for item in second.items)
    second.fast_result(timeout=30)
    cloud.gate.set()
    uploaded = first.storage_result(timeout=30)
    assert not second.wait_seconds > 5                      # the next step never waits for an upload
    lent |= {id(item.blob) for item in second.items}
    third = snap.snapshot(5, state)                         # both earlier snapshots are settled: reused
    assert {id(item.blob) for item in third.items} <= lent
    third.fast_result(timeout=30)
    restored, _ = restore(commit_step(2, uploaded.records, [cloud]), needs_of([state])[0], [cloud])
    for name, (tensor, _, _) in restored.items():           # step 2 as it was, despite later snapshots
        assert torch.equal(tensor, original[name]), name
    snap.close()


def test_a_background_copy_returns_at_once_and_holds_the_state_of_its_step():
    local = GatedTier("node")      # the fast lane is busy with the previous snapshot's writes
    snap = AsyncSnapshotter(local=local, policy=SnapshotPolicy(storage_every=0))
    full2, full3 = full_state(2), full_state(3)
    state = rank_states(full2, 1)[0]
    first = snap.snapshot(2, state, background_copy=True)
    assert first.wait_copied(timeout=30) < 30 and first.copied.done()
    for name, (tensor, _, _) in state.items():               # the "optimizer" of step 3 updates in place
        tensor.copy_(full3[name])
    second = snap.snapshot(3, state, background_copy=True)   # queued behind step 2's writes (gate closed)
    assert not second.copied.done()                          # the caller was not blocked: the copy waits
    local.gate.set()
    second.wait_copied(timeout=30)
    for step, full, handle in ((2, full2, first), (3, full3, second)):
        manifest = commit_step(step, handle.fast_result(timeout=30).records, [local])
        restored, _ = restore(manifest, needs_of([state])[0], [local])
        for name, (tensor, _, _) in restored.items():
            assert torch.equal(tensor, full[name]), (step, name)
    snap.close()


def test_a_failed_background_copy_releases_the_caller_and_fails_the_snapshot():
    from autohet_ray.checkpoint import Faults, InjectedFault
    faults = Faults()
    snap = AsyncSnapshotter(local=MemoryTier("node"), policy=SnapshotPolicy(storage_every=0), faults=faults)
    faults.arm_next("snapshot_copy")
    handle = snap.snapshot(4, rank_states(full_state(4), 1)[0], background_copy=True)
    handle.wait_copied(timeout=30)
    with pytest.raises(InjectedFault, match="snapshot_copy"):
        handle.fast_result(timeout=30)
    snap.close()
