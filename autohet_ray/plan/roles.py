"""Which plan rank each worker of a Ray Train group takes (orchestrate/train_api.py): Ray Train sorts worker
ranks by node and GPU id, so a worker's role follows where it actually is, not its rank. Also the nodes the
workers make, which the trainer plans on."""
from __future__ import annotations

from dataclasses import dataclass

from autohet_ray import ConfigError
from autohet_ray.cluster.live import LiveNode
from autohet_ray.plan.rankmap import build_rank_map
from autohet_ray.plan.schema import Plan


@dataclass(frozen=True, kw_only=True)
class WorkerPlace:
    train_rank: int
    node: str               # autohet.io/node label, else node-<id prefix> (as discovery names nodes)
    device_type: str | None
    gpu: str                # GPU id on the node ("" without GPUs)
    ip: str
    node_id: str = ""       # Ray node id
    emulated: bool = False  # the node carries autohet.io/emulated=true


def nodes_of_places(places: list[WorkerPlace]) -> list[LiveNode]:
    """The GPU nodes the workers are on, one GPU per worker, by name. ConfigError when a worker's node reports
    no GPU type, or one node reports two."""
    nodes: dict[str, LiveNode] = {}
    for p in places:
        if p.device_type is None:
            raise ConfigError(f"Ray Train worker {p.train_rank} is on node {p.node!r}, which has no "
                              f"ray.io/accelerator-type label; label the node with its GPU type")
        node = nodes.get(p.node)
        if node is not None and node.device_type != p.device_type:
            raise ConfigError(f"node {p.node!r} reports GPU types {node.device_type} and {p.device_type}")
        nodes[p.node] = LiveNode(name=p.node, node_id=p.node_id, ip=p.ip, device_type=p.device_type,
                                 num_gpus=(node.num_gpus if node else 0) + 1, emulated=p.emulated)
    return [nodes[name] for name in sorted(nodes)]


def plan_fits_places(plan: Plan, places: list[WorkerPlace], num_layers: int, *, strict: bool = False) -> bool:
    """Whether every rank of `plan` has a worker where it needs one (see assign_roles; workers may be left
    idle); with `strict`, the mismatch is a ConfigError instead of False."""
    try:
        assign_roles(plan, places, num_layers, allow_idle=True)
    except ConfigError:
        if strict:
            raise
        return False
    return True


IDLE = -1      # the role of a worker the plan does not use


def assign_roles(plan: Plan, places: list[WorkerPlace], num_layers: int, *, allow_idle: bool = False) -> list[int]:
    """Plan rank of each train rank: on each node, the plan's ranks there (by GPU index) go to the workers
    there (by GPU id, then train rank). With `allow_idle`, a node may have more workers than the plan uses
    there: the last of them are IDLE (the planner left those GPUs out). ConfigError when workers and plan
    disagree on a node."""
    wanted: dict[str, list] = {}
    for info in build_rank_map(plan, num_layers).ranks:
        wanted.setdefault(info.node, []).append(info)
    got: dict[str, list[WorkerPlace]] = {}
    for place in places:
        got.setdefault(place.node, []).append(place)
    roles = [IDLE] * len(places)
    for node in sorted(set(wanted) | set(got)):
        need, have = wanted.get(node, []), got.get(node, [])
        fits = len(need) <= len(have) if allow_idle else len(need) == len(have)
        if not fits or any(p.device_type not in (None, i.device_type) for p in have for i in need):
            raise ConfigError(f"node {node!r}: the plan puts {len(need)} ranks "
                              f"({', '.join(sorted({i.device_type for i in need})) or 'none'}) there but Ray Train "
                              f"placed {len(have)} workers "
                              f"({', '.join(sorted({str(p.device_type) for p in have})) or 'none'}); "
                              f"build the ScalingConfig with plan_scaling_config(plan)")
        for info, place in zip(sorted(need, key=lambda i: i.device),
                               sorted(have, key=lambda p: (_gpu_key(p.gpu), p.train_rank))):
            roles[place.train_rank] = info.rank
    assert sorted(r for r in roles if r != IDLE) == list(range(plan.num_devices)), roles
    return roles


def _gpu_key(gpu: str):
    return (0, int(gpu)) if gpu.isdigit() else (1, gpu)
