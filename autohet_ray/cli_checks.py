"""Numeric flags of every `autohet` command, checked before any work: a NaN, an infinity or a value out of
range is one line naming the flag (cli.py prints it and exits 2)."""
from __future__ import annotations

import math

from autohet_ray import ConfigError

ABOVE_ZERO = ("time_limit", "global_batch", "seq_len", "micro_batch", "steps", "iteration_wall_s",
              "eval_batches", "lr", "decay_steps", "plan_time_limit", "placement_timeout", "loss_grace_s",
              "shard_mb", "workers", "ranks", "train_tokenizer", "dataset_cache_gb", "max_cost_per_hour",
              "min_samples_per_s")
AT_LEAST_ZERO = ("eval_every", "min_lr", "warmup_steps", "weight_decay", "clip_grad", "checkpoint_every", "seed",
                 "step", "val_fraction", "adam_beta1", "adam_beta2")


def check_numeric_flags(args) -> None:
    """ConfigError for the first numeric flag that is not finite or out of its range."""
    for dest, value in vars(args).items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        flag = "--" + dest.replace("_", "-")
        if not math.isfinite(value):
            raise ConfigError(f"{flag}={value} must be a finite number")
        if dest in ABOVE_ZERO and not value > 0:
            raise ConfigError(f"{flag}={value} must be > 0")
        if dest in AT_LEAST_ZERO and value < 0:
            raise ConfigError(f"{flag}={value} must be >= 0")


def check_train_files(args, cluster, model) -> None:
    """`autohet train`'s files that are read only once the job starts, read now (before any cluster starts):
    --plan against the cluster and the model, a --profile JSON, and a local --data directory's index."""
    if args.plan:
        from autohet_ray.plan.schema import load_plan
        from autohet_ray.plan.validate import validate_plan
        validate_plan(load_plan(args.plan), cluster, model)
    if args.profile and args.profile.endswith(".json"):
        from autohet_ray.profile.db import load_profile
        load_profile(args.profile)
    if args.data and not args.data.startswith("s3://"):
        from autohet_ray.data.dataset import read_index
        read_index(args.data)
