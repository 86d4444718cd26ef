"""Checks of a plan against a model, and of a batch against a plan, with errors that say what to fix."""
from __future__ import annotations

import torch

from autohet_ray import ConfigError
from autohet_ray.model.spec import ModelSpec
from autohet_ray.plan.schema import Plan

IGNORE_INDEX = -100


def check_plan(plan: Plan, spec: ModelSpec) -> None:
    if plan.micro_batch < 1 or plan.seq_len < 1:
        raise ConfigError(f"plan: micro_batch={plan.micro_batch} and seq_len={plan.seq_len} must be >= 1")
    if plan.seq_len > spec.max_seq_len:
        raise ConfigError(f"plan: seq_len={plan.seq_len} exceeds {spec.name}'s max_seq_len={spec.max_seq_len}")
    if not plan.pipelines:
        raise ConfigError("plan: no pipelines")
    for k, pipeline in enumerate(plan.pipelines):
        if pipeline.num_microbatches < 1:
            raise ConfigError(f"plan: pipelines[{k}].num_microbatches={pipeline.num_microbatches} must be >= 1")
        expected = 0
        for j, stage in enumerate(pipeline.stages):
            where = f"pipelines[{k}].stages[{j}]"
            if stage.layers[0] != expected or stage.layers[1] <= stage.layers[0]:
                raise ConfigError(f"plan: {where}.layers={list(stage.layers)} must start at {expected} and be "
                                  "non-empty (each pipeline's layers are contiguous)")
            expected = stage.layers[1]
            if stage.tp < 1 or len(stage.devices) != stage.tp:
                raise ConfigError(f"plan: {where}.tp={stage.tp} must be >= 1 and equal its number of devices "
                                  f"({len(stage.devices)})")
            spec.check_tp(stage.tp)
        if expected != spec.num_layers:
            raise ConfigError(f"plan: pipelines[{k}] covers layers [0, {expected}) but {spec.name} has "
                              f"{spec.num_layers} layers")
    for k, pipeline in enumerate(plan.pipelines):
        if plan.micro_batch_of(k) < 1:
            raise ConfigError(f"plan: pipelines[{k}].micro_batch={plan.micro_batch_of(k)} must be >= 1")
    samples = sum(plan.samples_of(k) for k in range(len(plan.pipelines)))
    if samples != plan.global_batch:
        raise ConfigError(f"plan: global_batch={plan.global_batch} but the pipelines' micro_batch x "
                          f"num_microbatches add up to {samples}")


def check_batch(batch, plan: Plan, spec: ModelSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, labels) of a global batch, after checking shapes, dtypes and value ranges."""
    if not isinstance(batch, dict) or "input_ids" not in batch or "labels" not in batch:
        raise ConfigError("batch must be a dict with 'input_ids' and 'labels' (LongTensor[global_batch, seq_len])")
    expected = (plan.global_batch, plan.seq_len)
    ids, labels = batch["input_ids"], batch["labels"]
    for key, t in (("input_ids", ids), ("labels", labels)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.long:
            raise ConfigError(f"batch[{key!r}] must be a torch.LongTensor, got "
                              f"{getattr(t, 'dtype', type(t).__name__)}")
        if tuple(t.shape) != expected:
            raise ConfigError(f"batch[{key!r}] has shape {tuple(t.shape)} but the plan needs (global_batch, "
                              f"seq_len) = {expected}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= spec.vocab_size):
        raise ConfigError(f"batch['input_ids'] values must lie in [0, {spec.vocab_size})")
    bad = (labels != IGNORE_INDEX) & ((labels < 0) | (labels >= spec.vocab_size))
    if bool(bad.any()):
        raise ConfigError(f"batch['labels'] values must lie in [0, {spec.vocab_size}) or be {IGNORE_INDEX} (ignored)")
    if not bool((labels != IGNORE_INDEX).any()):
        raise ConfigError("batch['labels'] are all ignored (-100): the loss would be undefined")
    return ids, labels
