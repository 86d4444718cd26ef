"""Which plan rank each worker of a Ray Train group takes (orchestrate/train_api.py): Ray Train sorts worker
ranks by node and GPU id, so a worker's role follows where it actually is, not its rank."""
from __future__ import annotations

from dataclasses import dataclass

from autohet_ray import ConfigError
from autohet_ray.plan.rankmap import build_rank_map
from autohet_ray.plan.schema import Plan


@dataclass(frozen=True, kw_only=True)
class WorkerPlace:
    train_rank: int
    node: str               # autohet.io/node label, else node-<id prefix> (as discovery names nodes)
    device_type: str | None
    gpu: str                # GPU id on the node ("" without GPUs)
    ip: str


def assign_roles(plan: Plan, places: list[WorkerPlace], num_layers: int) -> list[int]:
    """Plan rank of each train rank: on each node, the plan's ranks there (by GPU index) go to the workers
    there (by GPU id, then train rank). ConfigError when workers and plan disagree on a node."""
    wanted: dict[str, list] = {}
    for info in build_rank_map(plan, num_layers).ranks:
        wanted.setdefault(info.node, []).append(info)
    got: dict[str, list[WorkerPlace]] = {}
    for place in places:
        got.setdefault(place.node, []).append(place)
    roles = [-1] * len(places)
    for node in sorted(set(wanted) | set(got)):
        need, have = wanted.get(node, []), got.get(node, [])
        if len(need) != len(have) or any(p.device_type not in (None, i.device_type) for p in have for i in need):
            raise ConfigError(f"node {node!r}: the plan puts {len(need)} ranks "
                              f"({', '.join(sorted({i.device_type for i in need})) or 'none'}) there but Ray Train "
                              f"placed {len(have)} workers "
                              f"({', '.join(sorted({str(p.device_type) for p in have})) or 'none'}); "
                              f"build the ScalingConfig with plan_scaling_config(plan)")
        for info, place in zip(sorted(need, key=lambda i: i.device),
                               sorted(have, key=lambda p: (_gpu_key(p.gpu), p.train_rank))):
            roles[place.train_rank] = info.rank
    assert sorted(roles) == list(range(len(places))), roles
    return roles


def _gpu_key(gpu: str):
    return (0, int(gpu)) if gpu.isdigit() else (1, gpu)
