"""The training job a driver runs: plain data (a frozen dataclass that travels to the driver actor as a dict)."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from autohet_ray import ConfigError
from autohet_ray.config_io import dataclass_from_dict
from autohet_ray.orchestrate.elastic_tiers import storage_spec
from autohet_ray.plan.schedule import schedule_choices
from autohet_ray.plan.validate import check_micro_batch

PROFILE_MODES = ("analytic", "measured")
DTYPES = ("float32", "float64", "bfloat16")


@dataclass(frozen=True, kw_only=True)
class TrainJob:
    model: dict                          # ModelSpec fields of the model that runs
    global_batch: int                    # samples per step
    steps: int                           # optimizer steps to run
    cluster: dict | None = None          # cluster file contents (links, custom devices); None: discover only
    priced_as: dict | None = None        # ModelSpec fields to profile/plan/price with (default: `model`), e.g.
                                         # the real-size model whose layer count a scaled-down `model` shares
    plan: dict | None = None             # a plan to run instead of planning
    seq_len: int | None = None           # tokens per sample the model runs (default: model's max_seq_len)
    priced_seq_len: int | None = None    # tokens per sample the plan is priced for (default: seq_len)
    micro_batch: int | None = None       # fix the planner's micro-batch size
    schedule: str = "auto"               # pipeline schedule: "auto" (the faster that fits), "1f1b" or "zb-h1"
    emulate: bool = False                # pace stage actors to the profile's predicted times (emulated GPUs)
    time_scale: float = 1.0              # emulated seconds x time_scale = wall seconds
    iteration_wall_s: float | None = None  # instead of time_scale: pace so one predicted iteration takes this
                                         # many wall seconds (leave the real CPU work room inside the paced ops)
    profile: str = "analytic"            # "analytic" (device catalog), "measured" (profile on Ray), or a DB path
    profile_cache: str | None = None     # directory caching measured profiles
    storage: str | None = None           # directory or s3://bucket/prefix for the plan and per-step metrics
    endpoint_url: str | None = None      # S3 endpoint of an s3:// storage (default: AWS_ENDPOINT_URL, or AWS)
    dtype: str = "float32"              # training dtype on the stage actors (float64 for exact comparisons)
    seed: int = 0
    lr: float = 1e-3
    plan_time_limit_s: float = 20.0
    placement_timeout_s: float = 60.0
    collective_timeout_s: float = 300.0  # torch.distributed timeout (a hung peer fails after this)

    def __post_init__(self):
        for name in ("global_batch", "steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}={value!r} must be a positive integer")
        if self.micro_batch is not None:
            check_micro_batch(self.global_batch, self.micro_batch)
        if not self.time_scale > 0:
            raise ConfigError(f"time_scale={self.time_scale!r} must be > 0")
        if self.iteration_wall_s is not None and not self.iteration_wall_s > 0:
            raise ConfigError(f"iteration_wall_s={self.iteration_wall_s!r} must be > 0")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype={self.dtype!r}; valid: {', '.join(DTYPES)}")
        if self.profile not in PROFILE_MODES and not self.profile.endswith(".json"):
            raise ConfigError(f"profile={self.profile!r}; valid: {', '.join(PROFILE_MODES)}, or a profile DB .json")
        schedule_choices(self.schedule)
        if self.storage is not None:
            storage_spec(self.storage)          # a directory or s3://bucket/prefix, else ConfigError

    def schedules(self) -> tuple[str, ...]:
        """The schedules the planner may choose from."""
        return schedule_choices(self.schedule)

    def to_dict(self) -> dict:
        return asdict(self)


def job_from_dict(raw: dict) -> TrainJob:
    return dataclass_from_dict(TrainJob, raw, "train job")
