"""Before the stores of nodes that leave on purpose are dropped, the newest committed step is copied until two
staying stores hold each chunk (hand_over_copies), checked on random holdings against the rule itself; and
how long a switch waits for those copies (hand_over_wait_s)."""
from __future__ import annotations

import random

import pytest

from autohet_ray.checkpoint.holdings import hand_over_copies
from autohet_ray.checkpoint.manifest import ChunkRecord
from autohet_ray.job.notice_ahead import hand_over_wait_s
from autohet_ray.layout import Chunk


def record(i: int, replicas: tuple[str, ...]) -> ChunkRecord:
    return ChunkRecord(step=3, name=f"w{i}", global_shape=(4,), chunk=Chunk(offsets=(0,), sizes=(4,)), dtype="float32",
                       digest=f"d{i}", nbytes=16, replicas=replicas)


def store(node: str) -> str:
    return f"keeper-{node}"


def test_chunks_held_by_a_leaving_node_and_one_stayer_get_a_second_staying_copy_from_the_leaving_node():
    records = [record(0, (store("b"), store("c"))), record(1, (store("a"), store("c"))),
               record(2, (store("a"), store("b")))]
    staying = {store(n): n for n in "ac"}
    copies = hand_over_copies(records, staying, {store("b"): "b"})
    assert copies == {("b", "a"): [records[0].key], ("b", "c"): [records[2].key]}


def test_a_chunk_only_leaving_nodes_hold_gets_two_staying_copies_and_one_stayer_gets_one():
    records = [record(0, (store("b"), store("c")))]
    copies = hand_over_copies(records, {store(n): n for n in "ad"}, {store("b"): "b", store("c"): "c"})
    assert sorted(copies) == [("b", "a"), ("c", "d")] or sorted(copies) == [("b", "d"), ("c", "a")]
    only_a = hand_over_copies(records, {store("a"): "a"}, {store("b"): "b", store("c"): "c"})
    assert only_a == {("b", "a"): [records[0].key]}
    assert hand_over_copies(records, {}, {store("b"): "b", store("c"): "c"}) == {}


@pytest.mark.parametrize("seed", range(40))
def test_random_holdings_end_with_two_staying_copies_of_every_chunk(seed):
    rng = random.Random(seed)
    nodes = list("abcdef")[:rng.randint(2, 6)]
    leaving = set(rng.sample(nodes, rng.randint(1, len(nodes) - 1)))
    records = [record(i, tuple(store(n) for n in rng.sample(nodes, rng.randint(1, min(3, len(nodes))))))
               for i in range(rng.randint(1, 30))]
    staying = {store(n): n for n in nodes if n not in leaving}
    copies = hand_over_copies(records, staying, {store(n): n for n in leaving})
    holders = {r.key: {n for n in nodes if store(n) in r.replicas} for r in records}
    for (source, target), keys in copies.items():
        for key in keys:
            assert source in holders[key], "copied from a store that lacks the chunk"
            assert target not in leaving and target not in holders[key], "copied where it was not needed"
            holders[key].add(target)
    want = min(2, len(staying))
    for r in records:
        before = {n for n in nodes if store(n) in r.replicas and n not in leaving}
        assert len(holders[r.key] - leaving) == max(want, len(before)), (r.replicas, copies)


def test_the_wait_for_the_copies_ends_10_s_before_the_notice_or_the_watchers_flush_timeout():
    notices = {"id-b": {"deadline_s": 1120.0, "flush_by_s": 1060.0}}
    assert hand_over_wait_s(1120.0, notices, {"id-b"}, 1000.0, cap_s=120.0) == 50.0
    assert hand_over_wait_s(1120.0, notices, {"id-b"}, 1000.0, cap_s=30.0) == 30.0
    assert hand_over_wait_s(1120.0, notices, {"id-b"}, 1059.0, cap_s=30.0) == 1.0     # at least 1 s
    assert hand_over_wait_s(None, {}, {"id-b"}, 1000.0, cap_s=30.0) == 30.0          # a drain without deadline


def test_a_switch_builds_standby_workers_at_most_three_times():
    from autohet_ray.job.notice_ahead import STANDBY_TRIES, standby_tries_left
    reason = "spot notice: node(s) ['b'] will be preempted"
    line = f"autohet: step 4: the standby workers for the switch ({reason}) failed (1 of 3 tries); ..."
    other = "autohet: step 4: the standby workers for the switch (node(s) ['d'] joined) failed (1 of 3 tries)"
    assert STANDBY_TRIES == 3
    assert standby_tries_left([line, line, other], reason)
    assert not standby_tries_left([line, other, line, line], reason)
    assert standby_tries_left([other, other, other], reason)         # another switch's failures do not count
