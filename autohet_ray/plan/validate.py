"""Structural validation of a plan against its cluster and model (memory is checked by the cost model)."""
from __future__ import annotations

from autohet_ray import ConfigError
from autohet_ray.cluster.spec import Cluster
from autohet_ray.model.spec import ModelSpec
from autohet_ray.plan.schema import Plan, check_slice_weight


def _is_power_of_two(x: int) -> bool:
    return x >= 1 and x & (x - 1) == 0


def check_micro_batch(global_batch: int, micro_batch: int) -> None:
    """ConfigError unless `micro_batch` is a positive integer that divides `global_batch`."""
    if isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch < 1:
        raise ConfigError(f"micro-batch {micro_batch!r} must be a positive integer")
    if global_batch % micro_batch:
        raise ConfigError(f"global batch {global_batch} is not divisible by micro-batch {micro_batch}")


def validate_plan(plan: Plan, cluster: Cluster, model: ModelSpec) -> None:
    """Raise ConfigError naming the first problem found."""
    if plan.micro_batch < 1 or plan.global_batch < 1:
        raise ConfigError(f"plan: global_batch={plan.global_batch} and micro_batch={plan.micro_batch} must be >= 1")
    if not 1 <= plan.seq_len <= model.max_seq_len:
        raise ConfigError(f"plan: seq_len={plan.seq_len} must lie in [1, {model.max_seq_len}] "
                          f"({model.name}'s max_seq_len)")
    for k, pipeline in enumerate(plan.pipelines):
        if pipeline.micro_batch is not None and pipeline.micro_batch < 1:
            raise ConfigError(f"plan: pipelines[{k}].micro_batch={pipeline.micro_batch} must be >= 1")
    if all(p.micro_batch is None for p in plan.pipelines):
        if plan.global_batch % plan.micro_batch:
            raise ConfigError(f"plan: global_batch={plan.global_batch} is not divisible by "
                              f"micro_batch={plan.micro_batch}")
        total_mb = plan.global_batch // plan.micro_batch
        got = sum(p.num_microbatches for p in plan.pipelines)
        if got != total_mb:
            raise ConfigError(f"plan: pipelines' num_microbatches sum to {got}, but global_batch/micro_batch = "
                              f"{total_mb}")
    got = sum(plan.samples_of(k) for k in range(len(plan.pipelines)))
    if got != plan.global_batch:
        raise ConfigError(f"plan: pipelines take {got} samples (num_microbatches x micro_batch), but "
                          f"global_batch={plan.global_batch}")
    used: dict[tuple[str, int], str] = {}
    for k, pipeline in enumerate(plan.pipelines):
        if pipeline.num_microbatches < 1:
            raise ConfigError(f"plan: pipelines[{k}].num_microbatches={pipeline.num_microbatches} must be >= 1")
        _check_layers(k, pipeline, model)
        for j, stage in enumerate(pipeline.stages):
            where = f"pipelines[{k}].stages[{j}]"
            _check_stage(where, stage, cluster, model)
            for d in stage.devices:
                if (stage.node, d) in used:
                    raise ConfigError(f"plan: GPU {stage.node}:{d} is used by {used[(stage.node, d)]} and {where}; "
                                      "each GPU may be used once")
                used[(stage.node, d)] = where
    _check_predicted_shape(plan)


def _check_predicted_shape(plan: Plan) -> None:
    """Per-stage predicted times, when a plan carries them, need one entry per stage and per boundary."""
    pred = plan.predicted
    if pred is None or not pred.stages:
        return
    want = [len(p.stages) for p in plan.pipelines]
    if [len(p) for p in pred.stages] != want or [len(p) for p in pred.links] != [n - 1 for n in want]:
        raise ConfigError(f"plan: predicted.stages has {[len(p) for p in pred.stages]} entries per pipeline and "
                          f"predicted.links {[len(p) for p in pred.links]}; the pipelines have {want} stages")


def _check_layers(k: int, pipeline, model: ModelSpec) -> None:
    expected = 0
    for j, stage in enumerate(pipeline.stages):
        start, end = stage.layers
        if start != expected or end <= start:
            raise ConfigError(f"plan: pipelines[{k}].stages[{j}].layers=[{start}, {end}) must start at {expected} "
                              "and be non-empty (layers contiguous per pipeline)")
        expected = end
    if expected != model.num_layers:
        raise ConfigError(f"plan: pipelines[{k}] covers layers [0, {expected}) but {model.name} has "
                          f"{model.num_layers} layers")


def _check_stage(where: str, stage, cluster: Cluster, model: ModelSpec) -> None:
    if not _is_power_of_two(stage.tp) or len(stage.devices) != stage.tp:
        raise ConfigError(f"plan: {where}.tp={stage.tp} must be a power of two equal to the number of devices "
                          f"({len(stage.devices)})")
    model.check_tp(stage.tp)
    check_slice_weight(stage.slice_weight, f"{where}.slice_weight")
    node = cluster.node(stage.node)
    if node.device != stage.device_type:
        raise ConfigError(f"plan: {where}.device_type={stage.device_type!r} but node {node.name!r} has {node.device}")
    bad = [d for d in stage.devices if not 0 <= d < node.count]
    if bad or len(set(stage.devices)) != len(stage.devices):
        raise ConfigError(f"plan: {where}.devices={list(stage.devices)} must be distinct GPU indices in "
                          f"[0, {node.count}): node {node.name!r} has only {node.count} {node.device}")
