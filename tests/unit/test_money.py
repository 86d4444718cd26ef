"""Money in the planner (cost/money.py, planner/candidates/money.py, planner/bounds/money_bound.py): prices, goals,
the cheapest plan, budgets and floors, the bound for each, and the job fields every re-plan keeps."""
from dataclasses import replace

import pytest

from autohet_ray import ConfigError
from autohet_ray.cluster import cluster_from_dict
from autohet_ray.cost.money import (Goal, Instance, Price, Prices, check_priced, cluster_usd_per_hour, goal_from,
                                    plan_usd_per_hour, prices_from_dict)
from autohet_ray.model import PRESETS
from autohet_ray.plan.schema import Pipeline, Plan, Stage
from autohet_ray.planner import plan_training
from autohet_ray.planner.candidates.money import grouping_money, on_cheapest_nodes, usage_usd_per_hour
from autohet_ray.planner.bounds.money_bound import goal_lower_bound
from autohet_ray.profile import analytic_profile

PER_GPU = {"H800": Price(on_demand=12.29, spot=4.92), "H20": Price(on_demand=5.12, spot=2.05),
           "A100-80GB": Price(on_demand=5.12, spot=2.05), "V100-16GB": Price(on_demand=3.06, spot=1.22)}
PRICES = Prices.of_gpus(PER_GPU)


def _cluster(*nodes):
    return cluster_from_dict({"name": "c", "network": {"inter_node_gbps": 200},
                              "nodes": [dict(name=f"n{i}", device=d, count=c, **extra)
                                        for i, (d, c, extra) in enumerate(nodes)]})


def _job(cluster, layers=8, name="llama-7b", mbs=(1, 2)):
    model = replace(PRESETS[name], num_layers=layers)
    return dict(cluster=cluster, model=model, seq_len=model.max_seq_len,
                profile=analytic_profile(model, cluster, model.max_seq_len, micro_batches=mbs))


def test_prices_file_errors_name_the_bad_value():
    with pytest.raises(ConfigError, match="prices.H800 needs on_demand and spot"):
        prices_from_dict({"prices": {"H800": {"on_demand": 1.0}}})
    with pytest.raises(ConfigError, match="finite numbers >= 0"):
        prices_from_dict({"prices": {"H800": {"on_demand": -1, "spot": 1}}})
    with pytest.raises(ConfigError, match="need a prices file"):
        Goal(objective="cost")
    with pytest.raises(ConfigError, match="objective 'money'; valid: throughput, cost"):
        Goal(objective="money", prices=PRICES)
    with pytest.raises(ConfigError, match="no price for L40S"):
        goal_from("cost", {"prices": {"H800": {"on_demand": 1, "spot": 1}}}, cluster=_cluster(("L40S", 1, {})))


def test_spot_nodes_pay_the_spot_price_and_the_cheapest_go_first():
    cluster = _cluster(("H800", 2, {"spot": True}), ("H800", 2, {}))
    assert cluster.nodes[0].spot and not cluster.nodes[1].spot
    assert cluster_usd_per_hour(cluster, PRICES) == pytest.approx(2 * 4.92 + 2 * 12.29)
    money = grouping_money(Goal(objective="cost", prices=PRICES), cluster)
    usd = [usage_usd_per_hour({"H800": n}, money) for n in range(5)]      # whole nodes, the spot one first
    assert usd == pytest.approx([0, 2 * 4.92, 2 * 4.92, 2 * 4.92 + 2 * 12.29, 2 * 4.92 + 2 * 12.29])


P5 = Instance(name="p5.48xlarge", device="H800", gpus=8, price=Price(on_demand=98.32, spot=39.33))


def _stage(node, devices, layers):
    return Stage(layers=layers, tp=len(devices), device_type="H800", node=node, devices=tuple(devices))


def test_a_plan_pays_for_every_node_it_uses_whole():
    """6 of an 8-GPU instance pay for 8; a second node's one GPU pays for all of it; the per-GPU form bills a
    node as an instance of its own GPUs (2 GPUs: twice the GPU's price)."""
    prices = Prices(instances=(P5,))
    cluster = _cluster(("H800", 8, {}), ("H800", 8, {"spot": True}))
    six = Plan(model="m", global_batch=8, micro_batch=1, seq_len=8, pipelines=(Pipeline(num_microbatches=8, stages=(
        _stage("n0", range(6), (0, 2)),)),))
    assert plan_usd_per_hour(six, cluster, prices) == 98.32
    both = replace(six, pipelines=(Pipeline(num_microbatches=8, stages=(
        _stage("n0", range(6), (0, 1)), _stage("n1", [3], (1, 2)))),))
    assert plan_usd_per_hour(both, cluster, prices) == pytest.approx(98.32 + 39.33)
    assert cluster_usd_per_hour(cluster, prices) == pytest.approx(98.32 + 39.33)
    two = _cluster(("H800", 2, {}))
    one_gpu = replace(six, pipelines=(Pipeline(num_microbatches=8, stages=(_stage("n0", [1], (0, 2)),)),))
    assert plan_usd_per_hour(one_gpu, two, PRICES) == pytest.approx(2 * 12.29)


def test_a_node_is_billed_as_its_instance_type():
    """Exactly its GPU count, else the smallest type that holds them; a node larger than every type is refused."""
    half = Instance(name="p5.24xlarge", device="H800", gpus=4, price=Price(on_demand=50.0, spot=20.0))
    prices = Prices(instances=(P5, half))
    assert prices.rental("H800", 4, False).instance == "p5.24xlarge"
    assert prices.rental("H800", 3, True).usd_per_hour == 20.0
    assert prices.rental("H800", 6, False).instance == "p5.48xlarge"
    with pytest.raises(ConfigError, match="a node of 16 H800 GPUs fits no H800 instance type .* p5.48xlarge, 8 GPUs"):
        check_priced(_cluster(("H800", 16, {})), prices)


def test_prices_file_per_instance_and_its_errors():
    raw = {"instances": {"p5.48xlarge": {"device": "H800", "gpus": 8, "on_demand": 98.32, "spot": 39.33}},
           "prices": {"H20": {"on_demand": 5.12, "spot": 2.05}}}
    prices = prices_from_dict(raw)
    assert prices.instances == (P5,) and prices.rental("H20", 8, False).usd_per_hour == pytest.approx(8 * 5.12)
    with pytest.raises(ConfigError, match=r"instances.p5.48xlarge needs gpus \(GPUs per instance\)"):
        prices_from_dict({"instances": {"p5.48xlarge": {"device": "H800", "on_demand": 98.32, "spot": 39.33}}})
    with pytest.raises(ConfigError, match=r"instances.x.gpus=0 must be a positive integer"):
        prices_from_dict({"instances": {"x": {"device": "H800", "gpus": 0, "on_demand": 1, "spot": 1}}})
    with pytest.raises(ConfigError, match=r"instances.x has unknown keys \['count'\]"):
        prices_from_dict({"instances": {"x": {"device": "H800", "count": 8, "on_demand": 1, "spot": 1}}})
    with pytest.raises(ConfigError, match="a prices file needs 'instances:"):
        prices_from_dict({"as_of": "2026-12-01"})


def test_the_shipped_prices_file_bills_whole_instances():
    from autohet_ray.cost.money import load_prices
    prices = load_prices("jobs/clusters/prices.yaml")
    assert all(i.gpus == 8 and i.price.source for i in prices.instances) and not prices.per_gpu
    assert prices.rental("H800", 8, False).usd_per_hour == 98.32


def test_a_plan_on_an_on_demand_node_moves_to_an_identical_spot_node():
    cluster = _cluster(("H800", 2, {}), ("H800", 2, {"spot": True}))
    job = _job(cluster)
    plan = plan_training(**job, global_batch=2, micro_batch=1, goal=Goal(objective="cost", prices=PRICES)).plan
    assert {s.node for p in plan.pipelines for s in p.stages} == {"n1"}     # the spot node
    moved = on_cheapest_nodes(replace(plan, pipelines=tuple(
        replace(p, stages=tuple(replace(s, node="n0") for s in p.stages)) for p in plan.pipelines)),
        cluster, Goal(objective="cost", prices=PRICES))
    assert {s.node for p in moved.pipelines for s in p.stages} == {"n1"}


def test_cost_objective_leaves_out_gpus_that_do_not_pay_for_themselves():
    """Two H800 on demand and two spot H20: the cheapest plan per token is not the fastest, and no plan is
    cheaper per token than the bound says."""
    cluster = _cluster(("H800", 2, {}), ("H20", 2, {"spot": True}))
    job = _job(cluster)
    fast = plan_training(**job, global_batch=16, goal=Goal(prices=PRICES))
    cheap = plan_training(**job, global_batch=16, goal=Goal(objective="cost", prices=PRICES))
    per_iteration = lambda r: plan_usd_per_hour(r.plan, cluster, PRICES) * r.evaluation.iteration_time_s  # noqa
    assert fast.plan.num_devices == 4 and cheap.plan.num_devices < 4
    assert per_iteration(cheap) < per_iteration(fast) * 0.9
    assert fast.evaluation.iteration_time_s < cheap.evaluation.iteration_time_s
    bound = goal_lower_bound(goal=Goal(objective="cost", prices=PRICES), global_batch=16, schedules=("1f1b", "zb-h1"),
                             **job)
    assert 0 < bound["usd_per_iteration"] <= per_iteration(cheap) / 3600


def test_budget_gives_the_fastest_plan_within_it_and_the_bound_agrees():
    cluster = _cluster(("H800", 2, {}), ("H20", 2, {"spot": True}))
    job = _job(cluster)
    budget = 0.6 * cluster_usd_per_hour(cluster, PRICES)
    goal = Goal(prices=PRICES, max_usd_per_hour=budget)
    result = plan_training(**job, global_batch=16, goal=goal)
    assert plan_usd_per_hour(result.plan, cluster, PRICES) <= budget
    bound = goal_lower_bound(goal=goal, global_batch=16, schedules=("1f1b", "zb-h1"), **job)
    plain = goal_lower_bound(goal=Goal(prices=PRICES), global_batch=16, schedules=("1f1b", "zb-h1"), **job)
    assert plain["iteration_s"] < bound["iteration_s"] <= result.evaluation.iteration_time_s


def test_unmet_budget_and_floor_say_what_they_would_need():
    """The cheapest plan per token pays for a whole 2-GPU node."""
    cluster = _cluster(("H800", 2, {}), ("H20", 2, {"spot": True}))
    job = _job(cluster)
    with pytest.raises(ConfigError, match=r"no plan found fits a budget of \$1/hour .* the plan cheapest per token "
                                          r"costs \$24.58/hour .* raise --max-cost-per-hour to 24.58 for it$"):
        plan_training(**job, global_batch=16, goal=Goal(prices=PRICES, max_usd_per_hour=1.0))
    with pytest.raises(ConfigError, match=r"no plan reaches 100000 samples/s .* the fastest found gives"):
        plan_training(**job, global_batch=16, goal=Goal(prices=PRICES, min_samples_per_s=1e5))
    # the relaxation pays for fractions of GPUs: it proves a budget impossible below the memory's share
    bound = goal_lower_bound(goal=Goal(prices=PRICES, max_usd_per_hour=0.1), global_batch=16,
                             schedules=("1f1b",), **job)
    assert not bound["feasible"] and "holding the model alone needs" in bound["needs"]
    assert goal_lower_bound(goal=Goal(prices=PRICES, max_usd_per_hour=1.0), global_batch=16,
                            schedules=("1f1b",), **job)["feasible"]


def test_floor_gives_the_cheapest_plan_that_reaches_it():
    cluster = _cluster(("H800", 2, {}), ("H20", 2, {"spot": True}))
    job = _job(cluster)
    fast = plan_training(**job, global_batch=16, goal=Goal(prices=PRICES))
    floor = 0.5 * fast.evaluation.samples_per_s
    result = plan_training(**job, global_batch=16, goal=Goal(prices=PRICES, min_samples_per_s=floor))
    assert result.evaluation.samples_per_s >= floor
    assert plan_usd_per_hour(result.plan, cluster, PRICES) < plan_usd_per_hour(fast.plan, cluster, PRICES)


def test_train_job_keeps_the_goal_for_every_re_plan():
    from autohet_ray.job.config import TrainJob
    from autohet_ray.job.plan_choice import plan_request
    cluster = _cluster(("H800", 2, {}), ("H20", 2, {"spot": True}))
    raw = {"prices": {d: {"on_demand": p.on_demand, "spot": p.spot} for d, p in PER_GPU.items()}}
    job = TrainJob(model=PRESETS["llama-7b"].to_dict(), cluster=cluster.to_dict(), global_batch=16,
                   objective="cost", prices=raw, max_cost_per_hour=20.0)
    request = plan_request(job, cluster, profile=None, priced_model=None, seq_len=2048)
    assert request["goal"] == Goal(objective="cost", prices=PRICES, max_usd_per_hour=20.0)
    with pytest.raises(ConfigError, match="need a prices file"):
        TrainJob(model=PRESETS["llama-7b"].to_dict(), cluster=cluster.to_dict(), global_batch=16, objective="cost")


def test_a_joining_spot_node_is_used_only_if_it_pays_for_itself():
    """The re-plan after a join (the same goal on the grown cluster): a cheap spot H800 joins and is used; the
    same node at a price that makes it a loss per token is left out."""
    base = _cluster(("H20", 2, {}))
    grown = _cluster(("H20", 2, {}), ("H800", 2, {"spot": True}))
    job = _job(grown)
    cheap = Prices.of_gpus({**PER_GPU, "H800": Price(on_demand=12.29, spot=0.5)})
    dear = Prices.of_gpus({**PER_GPU, "H800": Price(on_demand=12.29, spot=60.0)})
    used = lambda prices: {s.device_type for p in plan_training(  # noqa: E731
        **job, global_batch=16, goal=Goal(objective="cost", prices=prices)).plan.pipelines for s in p.stages}
    assert "H800" in used(cheap)
    assert used(dear) == {"H20"}
    assert base.device_types() == ["H20"]
