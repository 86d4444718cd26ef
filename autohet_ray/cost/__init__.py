from autohet_ray.cost.evaluate import Evaluation, evaluate_plan, price_plan
from autohet_ray.cost.pipeline import in_flight, one_f_one_b_time
from autohet_ray.cost.terms import GroupCost, GroupCostTable, allreduce_time, p2p_time

__all__ = ["Evaluation", "evaluate_plan", "price_plan", "in_flight", "one_f_one_b_time", "GroupCost",
           "GroupCostTable", "allreduce_time", "p2p_time"]
