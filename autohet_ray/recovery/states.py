"""The controller's states (orchestrate/controller.py) and TRANSITIONS, the only moves it makes."""
from __future__ import annotations

from enum import Enum


class State(str, Enum):
    NEW = "new"
    RUNNING = "running"
    RECOVERING = "recovering"      # a step failed: detect what was lost, salvage the survivors
    REPLANNING = "replanning"      # rediscover, plan, restart, restore (after a loss, a notice or a join)
    CLOSED = "closed"


TRANSITIONS = {                    # every move the controller makes; any other is a bug
    State.NEW: {State.RUNNING, State.CLOSED},
    State.RUNNING: {State.RECOVERING, State.REPLANNING, State.CLOSED},
    State.RECOVERING: {State.REPLANNING, State.CLOSED},
    State.REPLANNING: {State.RUNNING, State.RECOVERING, State.CLOSED},   # a loss while relaunching: next round
    State.CLOSED: set(),
}


def transition(current: State, to: State) -> State:
    assert to in TRANSITIONS[current], f"no transition {current.value} -> {to.value}"
    return to
