"""Place chosen pipelines on concrete nodes and GPUs and write the Plan."""
from __future__ import annotations

from dataclasses import dataclass

from autohet_ray.cluster.spec import Cluster
from autohet_ray.model.spec import ModelSpec
from autohet_ray.plan.schema import Pipeline, Plan, Stage
from autohet_ray.planner.candidates.space import Kind


@dataclass(frozen=True)
class PipelineChoice:
    kinds: tuple[Kind, ...]
    counts: tuple[int, ...]          # layers per stage
    num_microbatches: int


class PlacementError(Exception):
    """The groups do not pack into the nodes (internal: the planner then drops the candidate)."""


def place(choices: list[PipelineChoice], cluster: Cluster) -> list[list[tuple[str, tuple[int, ...]]]]:
    """(node, GPU indices) for every stage. Larger TP groups first (powers of two then pack without gaps).
    A stage prefers the node holding the same stage of an identical pipeline (gradient sync over NVLink),
    then the node of its pipeline's neighbouring stage (p2p over NVLink), then the fullest node that fits."""
    free = {n.name: list(range(n.count)) for n in cluster.nodes}
    device_of = {n.name: n.device for n in cluster.nodes}
    out: list[list] = [[None] * len(c.kinds) for c in choices]
    twin_node: dict[tuple, str] = {}
    order = sorted(((c.kinds[j][1], c.kinds, c.counts, j, k) for k, c in enumerate(choices)
                    for j in range(len(c.kinds))), key=lambda x: (-x[0], x[1], x[2], x[3], x[4]))
    for tp, kinds, counts, j, k in order:
        device = kinds[j][0]
        candidates = [n for n in free if device_of[n] == device and len(free[n]) >= tp]
        if not candidates:
            raise PlacementError(f"no node of {device} has {tp} free GPUs")
        neighbours = [out[k][i][0] for i in (j - 1, j + 1) if 0 <= i < len(out[k]) and out[k][i]]
        twin = twin_node.get((kinds, counts, j))
        node = (twin if twin in candidates else None) or next((n for n in candidates if n in neighbours), None) \
            or sorted(candidates, key=lambda n: len(free[n]))[0]
        out[k][j] = (node, tuple(free[node][:tp]))
        del free[node][:tp]
        twin_node[(kinds, counts, j)] = node
    return out


def build_plan(choices: list[PipelineChoice], cluster: Cluster, model: ModelSpec, *, global_batch: int,
               micro_batch: int, seq_len: int, recompute: bool = False, shard_optimizer: bool = False) -> Plan:
    placement = place(choices, cluster)
    pipelines = []
    for choice, where in zip(choices, placement):
        stages, start = [], 0
        for (device, tp), n, (node, devices) in zip(choice.kinds, choice.counts, where):
            stages.append(Stage(layers=(start, start + n), tp=tp, device_type=device, node=node, devices=devices,
                                recompute=recompute, shard_optimizer=shard_optimizer))
            start += n
        pipelines.append(Pipeline(num_microbatches=choice.num_microbatches, stages=tuple(stages)))
    return Plan(model=model.name, model_spec=model.to_dict(), cluster=cluster.name, global_batch=global_batch,
                micro_batch=micro_batch, seq_len=seq_len, pipelines=tuple(pipelines))
