"""Process groups created by their members only, and kept across plans of one world (runtime/groups.py).

One spawned world of 4 ranks runs three plans in turn, each on fresh engines: A (two TP2 pipelines: TP groups
{0,1} {2,3}, sync groups {0,2} {1,3}), B (one TP2 -> TP2 pipeline: the TP groups {0,1} {2,3} again, no sync
group) and C (one TP4 stage: {0,1,2,3}). Each rank creates only the groups that changed: 2 for A, none for B
(its TP group is kept), 1 for C; and every plan's numerics equal the single-process reference. Plan A's sync
groups are the pattern `new_group(use_local_synchronization=True)` hangs on when members hold different
numbers of groups before (tests/dist/test_numerics.py runs such plans too).
"""
from __future__ import annotations

from _harness import FAMILY_SPECS, TP4_SPECS, Case, compare, pipeline, reference_run, run_cases
from autohet_ray.runtime import run_world

CASES = [Case(name="A", spec=FAMILY_SPECS["gpt"], pipelines=(pipeline(3, (0, 4, 2)), pipeline(2, (0, 4, 2))), steps=2),
         Case(name="B", spec=FAMILY_SPECS["gpt"], pipelines=(pipeline(3, (0, 2, 2), (2, 4, 2)),), steps=2),
         Case(name="C", spec=TP4_SPECS["llama"], pipelines=(pipeline(3, (0, 4, 4)),), steps=2)]


def test_only_changed_groups_are_created_and_numerics_hold():
    per_rank = run_world(run_cases, 4, CASES)
    built = {case.name: [(r[case.name]["groups_built"].created, r[case.name]["groups_built"].kept)
                         for r in per_rank] for case in CASES}
    assert built == {"A": [(2, 0)] * 4, "B": [(0, 1)] * 4, "C": [(1, 0)] * 4}, built
    for case in CASES:
        report = compare(case, [r[case.name] for r in per_rank], reference_run(case))
        assert not report.problems, (case.name, report.problems[:10])
