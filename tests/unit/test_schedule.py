"""Pipeline schedules as data: exact action lists, completeness, memory bound and deadlock freedom."""
import pytest

from autohet_ray.runtime.schedule import BACKWARD, FORWARD, Action, gpipe, max_in_flight, one_f_one_b


def _names(actions):
    return " ".join(str(a) for a in actions)


def test_1f1b_exact_lists_four_stages_six_microbatches():
    assert _names(one_f_one_b(4, 0, 6)) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5"
    assert _names(one_f_one_b(4, 1, 6)) == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5"
    assert _names(one_f_one_b(4, 3, 6)) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5"


def test_1f1b_fewer_microbatches_than_stages():
    assert _names(one_f_one_b(4, 0, 2)) == "F0 F1 B0 B1"
    assert _names(one_f_one_b(3, 1, 1)) == "F0 B0"


def test_gpipe_exact_list():
    assert _names(gpipe(3, 1, 3)) == "F0 F1 F2 B0 B1 B2"


def simulate(schedules: list[tuple[Action, ...]]) -> bool:
    """Run one pipeline's stages with non-blocking sends and blocking receives; True if all finish."""
    num_stages = len(schedules)
    done = set()                                  # (kind, stage, microbatch)
    pos = [0] * num_stages
    progress = True
    while progress:
        progress = False
        for j, actions in enumerate(schedules):
            if pos[j] == len(actions):
                continue
            a = actions[pos[j]]
            if a.kind == FORWARD:
                ready = j == 0 or (FORWARD, j - 1, a.microbatch) in done
            else:
                ready = (FORWARD, j, a.microbatch) in done and (
                    j == num_stages - 1 or (BACKWARD, j + 1, a.microbatch) in done)
            if ready:
                done.add((a.kind, j, a.microbatch))
                pos[j] += 1
                progress = True
    return all(p == len(s) for p, s in zip(pos, schedules))


@pytest.mark.parametrize("schedule", [one_f_one_b, gpipe])
@pytest.mark.parametrize("num_stages", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("num_microbatches", [1, 2, 3, 5, 8])
def test_every_microbatch_once_and_no_deadlock(schedule, num_stages, num_microbatches):
    schedules = [schedule(num_stages, j, num_microbatches) for j in range(num_stages)]
    for actions in schedules:
        for kind in (FORWARD, BACKWARD):
            assert [a.microbatch for a in actions if a.kind == kind] == list(range(num_microbatches))
        for a in actions:                          # backward only after its forward on the same stage
            if a.kind == BACKWARD:
                assert actions.index(Action(FORWARD, a.microbatch)) < actions.index(a)
    assert simulate(schedules)


@pytest.mark.parametrize("num_stages", [1, 2, 4, 6])
@pytest.mark.parametrize("num_microbatches", [1, 3, 8])
def test_1f1b_keeps_at_most_stages_minus_j_in_flight(num_stages, num_microbatches):
    for j in range(num_stages):
        assert max_in_flight(one_f_one_b(num_stages, j, num_microbatches)) == min(num_stages - j, num_microbatches)
    assert max_in_flight(gpipe(num_stages, 0, num_microbatches)) == num_microbatches


def test_simulator_detects_a_deadlock():
    # the last stage waits for a backward the first stage can never provide in this (bad) order
    bad = [(Action(BACKWARD, 0), Action(FORWARD, 0)), (Action(FORWARD, 0), Action(BACKWARD, 0))]
    assert not simulate(bad)


def test_bad_arguments_are_rejected():
    with pytest.raises(AssertionError):
        one_f_one_b(2, 2, 4)
    with pytest.raises(AssertionError):
        gpipe(2, 0, 0)
