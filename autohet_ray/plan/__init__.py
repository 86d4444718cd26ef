from autohet_ray.plan.rankmap import LayerHolder, RankInfo, RankMap, build_rank_map
from autohet_ray.plan.schema import (SCHEMA_VERSION, Pipeline, Plan, Predicted, Stage, load_plan, plan_from_dict,
                                     plan_from_json)
from autohet_ray.plan.validate import validate_plan

__all__ = ["LayerHolder", "RankInfo", "RankMap", "build_rank_map", "SCHEMA_VERSION", "Pipeline", "Plan",
           "Predicted", "Stage", "load_plan", "plan_from_dict", "plan_from_json", "validate_plan"]
