"""Which dropped keepers may be stopped (recovery/dropped.py), with a stop that records instead of asking Ray:
one is stopped only once a step newer than every step it could hold is committed, and never once it rejoined."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from autohet_ray.recovery.dropped import DroppedKeepers


def _spec(node: str) -> dict:
    return {"node_id": f"id-{node}", "name": f"keeper-{node}", "job_id": "j", "dir": f"/dev/shm/j/{node}"}


def test_a_dropped_keeper_is_stopped_once_a_newer_step_is_committed_and_a_rejoined_one_never():
    stopped = []
    dropped = DroppedKeepers(stop=lambda spec: stopped.append(spec["name"]) or True)
    with ThreadPoolExecutor(1) as pool:
        dropped.drop(_spec("a"), 5)
        dropped.drop(_spec("b"), 7)
        dropped.drop(_spec("c"), 5)
        dropped.rejoined("id-c")                      # its node serves the job again
        dropped.reap(5, pool)                         # not newer than step 5: a's chunks may still be needed
        dropped.wait(5.0)
        assert stopped == [] and [s["name"] for s in dropped.remaining()] == ["keeper-a", "keeper-b"]
        dropped.reap(6, pool)
        dropped.wait(5.0)
        assert stopped == ["keeper-a"] and [s["name"] for s in dropped.remaining()] == ["keeper-b"]
        dropped.reap(8, pool)
        dropped.wait(5.0)
    assert stopped == ["keeper-a", "keeper-b"] and dropped.remaining() == []
    assert [f.result() for f in dropped.stopping] == [True, True]
