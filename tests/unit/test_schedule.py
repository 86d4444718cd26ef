"""Pipeline schedules as data: exact action lists, completeness, memory bound and deadlock freedom."""
import pytest

from autohet_ray.plan.schedule import (BACKWARD, FORWARD, SCHEDULES, WGRAD, Action, gpipe, in_flight_bound,
                                       max_in_flight, one_f_one_b, zero_bubble_h1)


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


def test_zb_h1_exact_lists_four_stages_six_microbatches():
    assert _names(zero_bubble_h1(4, 0, 6)) == "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 B3 W3 B4 W4 B5 W5"
    assert _names(zero_bubble_h1(4, 3, 6)) == "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 W3 W4 W5"


def test_zb_h1_fewer_microbatches_than_stages():
    assert _names(zero_bubble_h1(4, 0, 2)) == "F0 F1 B0 W0 B1 W1"
    assert _names(zero_bubble_h1(4, 3, 2)) == "F0 B0 F1 B1 W0 W1"


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
            elif a.kind == WGRAD:                 # W follows its own stage's B; nothing waits for a W
                ready = (BACKWARD, j, a.microbatch) in done
            else:
                ready = (FORWARD, j, a.microbatch) in done and (
                    j == num_stages - 1 or (BACKWARD, j + 1, a.microbatch) in done)
            if ready:
                done.add((a.kind, j, a.microbatch))
                pos[j] += 1
                progress = True
    return all(p == len(s) for p, s in zip(pos, schedules))


@pytest.mark.parametrize("schedule", [one_f_one_b, gpipe, zero_bubble_h1])
@pytest.mark.parametrize("num_stages", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("num_microbatches", [1, 2, 3, 5, 8])
def test_every_microbatch_once_and_no_deadlock(schedule, num_stages, num_microbatches):
    schedules = [schedule(num_stages, j, num_microbatches) for j in range(num_stages)]
    kinds = (FORWARD, BACKWARD, WGRAD) if schedule is zero_bubble_h1 else (FORWARD, BACKWARD)
    for actions in schedules:
        assert {a.kind for a in actions} == set(kinds)
        for kind in kinds:
            assert [a.microbatch for a in actions if a.kind == kind] == list(range(num_microbatches))
        for a in actions:                          # B after its F, W after its B, on the same stage
            before = {BACKWARD: FORWARD, WGRAD: BACKWARD}.get(a.kind)
            if before is not None:
                assert actions.index(Action(before, a.microbatch)) < actions.index(a)
    assert simulate(schedules)


def test_zb_h1_stage_j_runs_w_of_i_right_after_b_of_i_plus_j():
    for num_stages, m in ((4, 6), (3, 8), (5, 5)):
        for j in range(num_stages):
            actions = zero_bubble_h1(num_stages, j, m)
            for n, a in enumerate(actions):
                if a.kind == BACKWARD and a.microbatch >= j:
                    assert actions[n + 1] == Action(WGRAD, a.microbatch - j)
            last_b = max(n for n, a in enumerate(actions) if a.kind == BACKWARD)
            assert all(a.kind == WGRAD for a in actions[last_b + 1:])
            assert actions[-1] == Action(WGRAD, m - 1)


@pytest.mark.parametrize("num_stages", [1, 2, 4, 6])
@pytest.mark.parametrize("num_microbatches", [1, 3, 8])
def test_1f1b_keeps_at_most_stages_minus_j_in_flight(num_stages, num_microbatches):
    for j in range(num_stages):
        assert max_in_flight(one_f_one_b(num_stages, j, num_microbatches)) == min(num_stages - j, num_microbatches)
    assert max_in_flight(gpipe(num_stages, 0, num_microbatches)) == num_microbatches


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_max_in_flight_matches_the_closed_form_bound(schedule):
    for num_stages in (1, 2, 3, 4, 6):
        for m in (1, 2, 3, 5, 8):
            for j in range(num_stages):
                assert (max_in_flight(SCHEDULES[schedule](num_stages, j, m))
                        == in_flight_bound(schedule, num_stages, j, m)), (num_stages, j, m)


def test_simulator_detects_a_deadlock():
    # the last stage waits for a backward the first stage can never provide in this (bad) order
    bad = [(Action(BACKWARD, 0), Action(FORWARD, 0)), (Action(FORWARD, 0), Action(BACKWARD, 0))]
    assert not simulate(bad)
    assert not simulate([(Action(FORWARD, 0), Action(WGRAD, 0), Action(BACKWARD, 0))])   # W before its B


def test_bad_arguments_are_rejected():
    with pytest.raises(AssertionError):
        one_f_one_b(2, 2, 4)
    with pytest.raises(AssertionError):
        gpipe(2, 0, 0)
