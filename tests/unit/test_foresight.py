"""Plan-ahead's pure part (job/foresight.py): equivalent states share one planning, a cached plan is renamed
onto the nodes of an equivalent state, and the states a job foresees come first-needed first."""
from __future__ import annotations

import json

import pytest

from autohet_ray.cluster.spec import cluster_from_dict, load_cluster
from autohet_ray.job.foresight import (cached_entry, canonical_key, foreseen_states, node_renaming, one_loss_states,
                                       renamed_plan)
from autohet_ray.job.plan_choice import state_key

NODES = [{"name": "a", "device": "H800", "count": 1}, {"name": "b", "device": "H800", "count": 1},
         {"name": "c", "device": "H20", "count": 2}, {"name": "d", "device": "H20", "count": 1}]


def cluster(names, nodes=NODES):
    return cluster_from_dict({"name": "live", "nodes": [n for n in nodes if n["name"] in names]})


def plan_on(*nodes) -> dict:
    return {"pipelines": [{"num_microbatches": 2, "stages": [{"node": n, "layers": [i, i + 1], "tp": 1}
                                                             for i, n in enumerate(nodes)]}]}


def test_states_that_differ_only_by_node_names_are_equivalent():
    assert canonical_key(cluster("ac").to_dict()) == canonical_key(cluster("bc").to_dict())
    assert canonical_key(cluster("ac").to_dict()) != canonical_key(cluster("ad").to_dict())   # 2 H20 vs 1
    slower = [dict(n, nic_gbps=10.0) if n["name"] == "b" else n for n in NODES]
    assert canonical_key(cluster("ac").to_dict()) != canonical_key(cluster("bc", slower).to_dict())


def test_a_cached_plan_serves_an_equivalent_state_renamed_and_is_kept_under_its_key():
    cache = {state_key(cluster("ac")): {"plan": plan_on("a", "c"), "ahead": True}}
    entry = cached_entry(cache, state_key(cluster("bc")))
    assert entry["plan"] == plan_on("b", "c") and entry["ahead"] is True and entry["renamed_from"] == ["a", "c"]
    assert cache[state_key(cluster("bc"))] is entry
    assert cached_entry(cache, state_key(cluster("ad"))) is None          # not equivalent: planned anew
    assert state_key(cluster("ad")) not in cache


def test_renaming_keeps_file_order_within_a_kind():
    big = [{"name": f"n{i}", "device": "H100", "count": 8} for i in range(4)]
    source, target = cluster(["n0", "n1", "n2"], big).to_dict(), cluster(["n1", "n2", "n3"], big).to_dict()
    assert node_renaming(source, target) == {"n0": "n1", "n1": "n2", "n2": "n3"}
    assert renamed_plan(plan_on("n2", "n0"), node_renaming(source, target)) == plan_on("n3", "n1")
    with pytest.raises(AssertionError):
        node_renaming(cluster("ac").to_dict(), cluster("ad").to_dict())


def test_one_planning_per_kind_of_node_one_loss_away_on_the_1024_gpu_mix():
    mix = load_cluster("jobs/clusters/mixed-1024.yaml")
    states = one_loss_states(mix)
    assert len(mix.nodes) == 128 and len(states) == len({n.device for n in mix.nodes}) == 4
    assert all(len(s.nodes) == 127 for s in states)
    assert one_loss_states(cluster("a")) == []


def test_foreseen_states_come_join_first_then_notice_then_single_losses_without_repeats():
    now = cluster("abc")
    states = foreseen_states(now, joined=cluster("abcd"), leaving=["c"])
    names = [sorted(n.name for n in s.nodes) for s in states]
    assert names[:2] == [["a", "b", "c", "d"], ["a", "b"]]
    assert names[2:] == [["b", "c"]]          # a or b lost: one kind of state; c lost is the notice's, planned once
    assert len({json.dumps(s.to_dict(), sort_keys=True) for s in states}) == len(states)
