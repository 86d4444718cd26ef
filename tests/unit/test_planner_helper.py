"""The helper process (planner/workers.py) changes where parts of a plan are computed, never the result; an
error comes out in the order the sequential loop would raise it. `cli` tier: it starts a process."""
from __future__ import annotations

import pytest

from autohet_ray.cluster import cluster_from_dict
from autohet_ray.model import PRESETS
from autohet_ray.planner import plan_with_baselines, workers
from autohet_ray.profile import analytic_profile

pytestmark = pytest.mark.cli


@pytest.fixture
def helper():
    workers.use_helper_process()
    assert workers.helper() is not None, "these tests need a second core"
    yield
    workers.stop_helper_process()


def _square_or_fail(x: int, fail: tuple = ()) -> tuple[int, int]:
    import os
    if x in fail:
        raise ValueError(f"item {x}")
    return x * x, os.getpid()


def test_items_keep_their_order_and_every_other_one_runs_in_the_helper(helper):
    out = workers.run_split(_square_or_fail, list(range(5)))
    assert [v for v, _ in out] == [0, 1, 4, 9, 16]
    here = {pid for _, pid in out[::2]}
    there = {pid for _, pid in out[1::2]}
    assert len(here) == 1 and len(there) == 1 and here != there


def test_the_first_error_in_item_order_is_raised(helper):
    with pytest.raises(ValueError, match="item 1"):
        workers.run_split(_square_or_fail, [0, 1, 2], fail=(1, 2))     # 1 in the helper, 2 here
    with pytest.raises(ValueError, match="item 0"):
        workers.run_split(_square_or_fail, [0, 1], fail=(0, 1))


def _plan(cluster, model, profile):
    result, baselines = plan_with_baselines(cluster=cluster, model=model, profile=profile, global_batch=256,
                                            seq_len=model.max_seq_len, time_limit_s=120)
    return (result.plan.to_dict(), result.evaluation.iteration_time_s,
            {n: (b.plan.to_dict() if b.plan else None) for n, b in baselines.items()})


def test_a_plan_is_the_same_with_and_without_the_helper():
    cluster = cluster_from_dict({"name": "t16", "network": {"inter_node_gbps": 200},
                                 "nodes": [{"name": "a", "device": "A100-80GB", "count": 8},
                                           {"name": "h", "device": "H20", "count": 8}]})
    model = PRESETS["llama-7b"]
    profile = analytic_profile(model, cluster, model.max_seq_len, micro_batches=(1, 2, 4))
    alone = _plan(cluster, model, profile)
    workers.use_helper_process()
    try:
        assert workers.helper() is not None
        assert _plan(cluster, model, profile) == alone
    finally:
        workers.stop_helper_process()


def test_autohet_plan_called_in_process_leaves_no_helper_process_behind(capsys):
    """`cli.main(["plan", ...])` from Python (a notebook, a test) stops its helper when the command ends: a
    helper left running would keep serving later plans in that process from its own copy of the modules."""
    import json
    from autohet_ray import cli
    assert workers.helper() is None
    assert cli.main(["plan", "--cluster", "jobs/clusters/paper-24.yaml", "--model", "gpt3-1.3b",
                     "--global-batch", "64", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["pipelines"]
    assert workers.helper() is None
