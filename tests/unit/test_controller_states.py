"""The controller's state machine (recovery/states.py, orchestrate/controller.py): the moves TRANSITIONS allows, and that any other
move, or a call made in the wrong state, fails. No Ray: a controller that was never started."""
from __future__ import annotations

import ast
import pathlib

import pytest

from autohet_ray.job.config import TrainJob
from autohet_ray.model.spec import load_model
from autohet_ray.orchestrate.controller import Controller
from autohet_ray.recovery.states import State, transition

CLUSTER = {"name": "one", "nodes": [{"name": "a", "device": "H800", "count": 1}]}


def _controller() -> Controller:
    return Controller(TrainJob(model=load_model("tiny-gpt").to_dict(), cluster=CLUSTER, global_batch=4))


def test_a_recovery_with_a_second_loss_and_a_planned_replan_follow_the_table():
    path = [State.NEW, State.RUNNING, State.RECOVERING, State.REPLANNING, State.RECOVERING, State.REPLANNING,
            State.RUNNING, State.REPLANNING, State.RUNNING, State.CLOSED]
    state = path[0]
    for to in path[1:]:
        state = transition(state, to)
    assert state is State.CLOSED


@pytest.mark.parametrize("current", [s for s in State if s is not State.CLOSED])
def test_every_state_but_closed_can_close(current):
    assert transition(current, State.CLOSED) is State.CLOSED


@pytest.mark.parametrize("current, to", [
    (State.NEW, State.RECOVERING), (State.NEW, State.REPLANNING), (State.RUNNING, State.NEW),
    (State.RECOVERING, State.RUNNING), (State.RECOVERING, State.RECOVERING), (State.CLOSED, State.RUNNING),
    (State.CLOSED, State.CLOSED)])
def test_an_illegal_transition_fails(current, to):
    with pytest.raises(AssertionError, match=f"no transition {current.value} -> {to.value}"):
        transition(current, to)


def test_a_controller_that_never_started_refuses_to_step_or_replan_and_closes_once():
    ctl = _controller()
    assert ctl.state is State.NEW
    with pytest.raises(AssertionError):
        ctl.step()
    with pytest.raises(AssertionError):
        ctl.check_joins()
    with pytest.raises(AssertionError):
        ctl.set_storage_every(2)
    assert ctl.close() == {"step": None, "where": None}
    assert ctl.state is State.CLOSED and ctl.state == "closed"
    assert ctl.close() == {}                 # every exit path closes; only the first does anything
    with pytest.raises(AssertionError):
        ctl.start()


def test_elastic_decides_and_imports_nothing_from_the_controller_layer():
    """elastic/ sits below orchestrate/: no import of it, module-level or inside a function."""
    elastic = pathlib.Path(__file__).resolve().parents[2] / "autohet_ray" / "elastic"
    found = [f"{path.name} imports {node.module}" for path in sorted(elastic.glob("*.py"))
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("autohet_ray.orchestrate")]
    found += [f"{path.name} imports {alias.name}" for path in sorted(elastic.glob("*.py"))
              for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Import)
              for alias in node.names if alias.name.startswith("autohet_ray.orchestrate")]
    assert not found, found
