"""Numeric flags of every `autohet` command, checked before any work: a NaN, an infinity or a value out of
range is one line naming the flag (cli.py prints it and exits 2)."""
from __future__ import annotations

import math

from autohet_ray import ConfigError
from autohet_ray.cluster.spec import cluster_from_dict
from autohet_ray.data.dataset import read_index
from autohet_ray.plan.schema import plan_from_dict
from autohet_ray.plan.validate import validate_plan
from autohet_ray.profile.db import load_profile

ABOVE_ZERO = ("time_limit", "global_batch", "seq_len", "priced_seq_len", "micro_batch", "steps", "iteration_wall_s",
              "eval_batches", "lr", "decay_steps", "plan_time_limit_s", "setup_timeout_s", "loss_grace_s",
              "shard_mb", "workers", "ranks", "train_tokenizer", "dataset_cache_gb", "max_cost_per_hour",
              "min_samples_per_s")
AT_LEAST_ZERO = ("eval_every", "min_lr", "warmup_steps", "weight_decay", "clip_grad", "checkpoint_every", "seed",
                 "step", "val_fraction", "adam_beta1", "adam_beta2")


def check_numeric_flags(args) -> None:
    """ConfigError for the first numeric flag that is not finite or out of its range."""
    for dest, value in vars(args).items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        dest = dest.split(".")[-1]                 # a nested field's flag is its own name (optimizer.lr: --lr)
        flag = "--" + dest.replace("_", "-")
        if not math.isfinite(value):
            raise ConfigError(f"{flag}={value} must be a finite number")
        if dest in ABOVE_ZERO and not value > 0:
            raise ConfigError(f"{flag}={value} must be > 0")
        if dest in AT_LEAST_ZERO and value < 0:
            raise ConfigError(f"{flag}={value} must be >= 0")


def check_job_files(job, model) -> None:
    """A job's files that are read only once it starts, read now (before any cluster starts): its plan
    against the cluster and the model, a profile JSON, and a local dataset's index."""
    if job.plan:
        validate_plan(plan_from_dict(job.plan), cluster_from_dict(job.cluster), model)
    if job.profile.endswith(".json"):
        load_profile(job.profile)
    if job.data and not job.data.startswith("s3://"):
        read_index(job.data)
