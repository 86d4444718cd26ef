"""Which chunks to move before a restore. Right after a node loss the next plan is known when it was planned
ahead, and with it the chunks of the newest committed step that each surviving node's ranks will read: copying
the ones a node's store lacks from the stores that hold them (keeper to keeper) while the job salvages and
restarts its workers lets every rank restore from its own node's store. Pure; the copies are made in elastic/."""
from __future__ import annotations

from autohet_ray import ConfigError
from autohet_ray.checkpoint.holdings import stage_in_copies
from autohet_ray.cluster.live import without_nodes
from autohet_ray.cluster.spec import Cluster
from autohet_ray.job.foresight import cached_entry
from autohet_ray.job.plan_choice import state_key
from autohet_ray.model.spec import ModelSpec
from autohet_ray.nn.model import param_shapes
from autohet_ray.plan.rankmap import build_rank_map
from autohet_ray.plan.schema import plan_from_dict
from autohet_ray.runtime.optim import needs_of_layout
from autohet_ray.runtime.parallelize import rank_layouts


def copies_after_loss(cache: dict[str, dict], running: Cluster, lost: list[str], model: ModelSpec, manifest,
                      node_of: dict[str, str]) -> dict[tuple, list[str]]:
    """(source node, target node) -> keys to copy before the restore onto the plan `cache` holds for `running`
    less the `lost` nodes (none when it holds no plan for that state). `model`: the model the workers run;
    `node_of`: store name -> node of the live stores."""
    try:
        left = without_nodes(running, lost)
    except ConfigError:
        return {}
    entry = cached_entry(cache, state_key(left))        # its own plan, or an equivalent state's renamed
    if entry is None:
        return {}
    plan = plan_from_dict(entry["plan"])
    needs_by_node: dict[str, list[dict]] = {}
    for info, layout in zip(build_rank_map(plan, model.num_layers).ranks, rank_layouts(plan, model)):
        needs_by_node.setdefault(info.node, []).append(needs_of_layout(layout))
    return stage_in_copies(manifest, needs_by_node, node_of)


def warm_up(model: ModelSpec) -> None:
    """Build the model's parameter shapes once: torch's first module built on the meta device imports its
    compiler stack (about 1.5 s of CPU here). The plan-ahead thread calls this, so a loss does not pay it."""
    param_shapes(model)
