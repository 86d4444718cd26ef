"""The one training job config: plain data for every entry point (`autohet train` with or without
--elastic, `autohet resume`, `jobs/train.py` under `ray job submit`, the Python API). It travels in every
committed manifest, so `autohet resume` can restart the job from its storage alone. Each setting and its
default is stated here once."""
from __future__ import annotations

import functools
import typing
from dataclasses import asdict, dataclass, field, fields
from typing import Literal

from autohet_ray import ConfigError
from autohet_ray.cloud.notices import PROVIDER_CHOICES
from autohet_ray.config_io import check_type, dataclass_from_dict
from autohet_ray.cost.money import OBJECTIVES, goal_from
from autohet_ray.metrics.tensorboard import check_available
from autohet_ray.metrics.tracking import TRACKERS, check_trackers
from autohet_ray.plan.schedule import PLAN_SCHEDULES, schedule_choices
from autohet_ray.plan.schema import RECOMPUTE_MODES, SHARDING_MODES, check_recompute, check_sharding
from autohet_ray.plan.validate import check_micro_batch
from autohet_ray.runtime.lr_schedule import OptimizerConfig
from autohet_ray.storage.dataset_cache import DEFAULT_CACHE_GB

PROFILE_MODES = ("analytic", "measured")
DTYPE_NAMES = {"float32": "float32", "float64": "float64", "bfloat16": "bfloat16", "fp32": "float32",
               "fp64": "float64", "bf16": "bfloat16", "auto": "auto"}
DTYPES = tuple(DTYPE_NAMES)

# the choices of the fields that have them: `--help` lists them and the job file's schema (job/schema.py) holds them
Schedule = Literal[("auto", *PLAN_SCHEDULES)]
Recompute = Literal[RECOMPUTE_MODES]
Sharding = Literal[SHARDING_MODES]
Objective = Literal[OBJECTIVES]
Dtype = Literal[DTYPES]
SpotProvider = Literal[PROVIDER_CHOICES]
Tracker = Literal[TRACKERS]


def compute_dtype(dtype: str, *, cuda: bool) -> str:
    """The torch dtype name a job's `dtype` trains in on a CUDA device or a CPU ("auto": bf16 on CUDA, fp32
    on CPU). The cost model prices this one."""
    name = DTYPE_NAMES[dtype]
    return name if name != "auto" else ("bfloat16" if cuda else "float32")


@dataclass(frozen=True, kw_only=True)
class TrainJob:
    __pydantic_config__ = {"use_attribute_docstrings": True}     # job/schema.py: docstrings as descriptions

    model: dict
    """The model that runs: a preset name, a model YAML or hf:DIR (a Hugging Face config.json); kept as its
    ModelSpec fields."""
    cluster: dict
    """The cluster file (named nodes and/or node types, GPU types, links), or its contents inline; every named
    node must be a live Ray node labelled autohet.io/node=<name>; a node type's instances are the live nodes that
    match it (GPU type, GPUs per node, market), named by their Ray node ids."""
    global_batch: int
    """Samples per step."""
    data: str | None = None
    """A dataset made by `autohet data prepare` (a directory or s3://bucket/prefix); None: synthetic tokens."""
    eval_every: int = 0
    """Compute the validation loss (forward only, with the running plan) every this many steps (0: never)."""
    eval_batches: int = 1
    """Global batches of the dataset's validation split each evaluation averages."""
    storage: dict | None = None
    """The job's storage, a directory or s3://bucket/prefix (kept as its storage/spec.py tier spec): the plan,
    the profile, the job record, metrics.jsonl and the checkpoints. `autohet train` without one: a new
    autohet-runs/<time> directory."""
    elastic: bool = False
    """Snapshot every step into two nodes' stores and recover from a lost node local-first. False: no node
    stores; `checkpoint_every` steps (and the final step) go to `storage` directly."""
    checkpoint_every: int = 10
    """Commit to `storage` every this many steps (0: only the final step, and on the way out)."""
    num_peers: int = 1
    """Elastic: peer node stores holding a replica of each rank's shards."""
    gc_every: int = 4
    """Delete node-store and storage steps older than the newest two committed ones every this many steps."""
    priced_as: dict | None = None
    """The model to profile, plan and price with (a preset, YAML or hf:DIR; default: `model`), e.g. the
    real-size model whose layer count a scaled-down `model` shares."""
    plan: dict | None = None
    """A plan JSON file for the first launch (default: plan now); every re-plan uses the planner on the live
    nodes."""
    seq_len: int | None = None
    """Tokens per sample the model runs (default: the model's max_seq_len)."""
    priced_seq_len: int | None = None
    """Tokens per sample the plan is priced for (default: seq_len)."""
    micro_batch: int | None = None
    """Fix the planner's micro-batch size."""
    schedule: Schedule = "auto"
    """Pipeline schedule: "auto" (the faster that fits), "1f1b" or "zb-h1"; re-plans keep the choice."""
    recompute: Recompute = "none"
    """Activation recomputation: "none", "full" (every stage) or "auto" (the planner picks it per stage where
    it makes the plan fit or faster); re-plans keep the choice."""
    optimizer_sharding: Sharding = "none"
    """Optimizer state (fp32 master, AdamW moments) sharded across each layer's data-parallel holders: "none",
    "dp" (every stage) or "auto" (the planner picks it per stage where it makes the plan fit or faster)."""
    objective: Objective = "throughput"
    """What every planning (the first and every re-plan) optimizes: "throughput" (samples/s) or "cost" ($ per
    token, from `prices`; it may leave GPUs or whole nodes out, so a node that joins is used only if it lowers
    the $ per token)."""
    prices: dict | None = None
    """Contents of a prices file ({instances: {TYPE: {device, gpus, on_demand, spot}}}, $ per instance-hour, or
    {prices: {GPU type: {on_demand, spot}}}, $ per GPU-hour; cost/money.py): a plan pays for each node it uses,
    whole; nodes marked `spot: true` in the cluster file pay the spot price. Needed by objective "cost" and the
    two limits."""
    max_cost_per_hour: float | None = None
    """A budget in $/hour for the nodes the plan uses (whole instances): the fastest plan within it (needs
    `prices`)."""
    min_samples_per_s: float | None = None
    """A throughput floor: the cheapest plan per token that reaches it (needs `prices`)."""
    profile: str = "analytic"
    """"analytic" (device catalog), "measured" (profiled on Ray once), or a profile DB .json path. The
    profile the job starts with is saved in `storage` and prices every re-plan."""
    profile_cache: str | None = None
    """Directory caching measured profiles."""
    time_scale: float = 0.0
    """Emulated GPUs: wall seconds per emulated second; each op is stretched to the time the profile predicts
    for its device. 0: no pacing, compute runs at this machine's speed."""
    iteration_wall_s: float | None = None
    """Instead of time_scale: pick the scale at the first launch so one predicted iteration lasts this long."""
    dtype: Dtype = "auto"
    """Compute dtype on the workers: "bfloat16" ("bf16": bf16 compute, fp32 master weights, AdamW moments and
    gradient reduction), "float32" ("fp32"), "float64" ("fp64", exact comparisons), or "auto" (bf16 on CUDA,
    fp32 on CPU). Checkpoints hold the fp32 masters either way. Stored canonical (the torch name)."""
    seed: int = 0
    """Seed of the initial weights and of the sample order."""
    init_from: str | None = None
    """A Hugging Face model directory (config.json + safetensors) whose weights step 0 starts from, each rank
    reading only its slices; restores (resume, recovery) load the checkpoint instead."""
    tensorboard: str | None = None
    """A directory the step metrics are also written to as TensorBoard events (needs the tensorboard package)."""
    tracking: tuple[Tracker, ...] = ()
    """Experiment trackers the run also logs to: "tensorboard" (into `tensorboard`), "mlflow" (to `mlflow_uri`),
    "wandb" (Weights & Biases; offline with WANDB_MODE=offline). Each needs its package: autohet_ray[mlflow],
    autohet_ray[wandb]. A tracker that fails is logged once and dropped; training goes on."""
    mlflow_uri: str | None = None
    """MLflow tracking URI: a directory, file:DIR, or http://HOST:PORT of a tracking server (default:
    MLFLOW_TRACKING_URI, else ./mlruns)."""
    tracking_project: str = "autohet"
    """The MLflow experiment and the W&B project the run is logged under."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """AdamW, clipping and the LR schedule (runtime/lr_schedule.py); part of the job record, so a resumed job
    takes exactly the rates the uninterrupted one would."""
    baselines: bool = True
    """Price the Megatron-LM and Whale baselines beside the first plan (reported, never trained)."""
    plan_time_limit_s: float = 10.0
    """Solver time limit of each planning (the first and every re-plan)."""
    setup_timeout_s: float = 120.0
    """How long workers may take to start, join the process group and build their engines."""
    collective_timeout_s: float = 120.0
    """torch.distributed timeout: a rank waiting on a vanished peer fails after at most this."""
    detect_timeout_s: float = 60.0
    """How long recovery waits for Ray to name the lost node or dead worker."""
    control_timeout_s: float = 60.0
    """The longest any control call between the driver and its actors may wait (the notice board's post,
    pending and ack, a keeper's replication, the checkpoint collector at close): past it the call fails loudly
    instead of hanging the job."""
    dataset_cache_gb: float = DEFAULT_CACHE_GB
    """The node-store root's cache of s3:// datasets keeps at most this many GB: least recently used datasets
    that no running job holds are evicted first."""
    loss_grace_s: float = 3.0
    """A node whose raylet stays silent (no refusal, Ray still lists it) is declared lost only after this
    many seconds of silence; a shorter stall (a network blip, a paused process) costs no recovery."""
    spot_watch: bool = False
    """Elastic: watch each node's instance metadata for spot interruption notices (a noticed node is flushed
    and planned away before it goes)."""
    spot_provider: SpotProvider = "aws"
    """Whose instance metadata spot_watch reads: "aws", "gcp", "azure", or "auto" (tries each)."""
    request_fleet: bool = False
    """Ask the Ray autoscaler (its public SDK, request_resources) for the nodes of the cluster file's node types
    that the plan needs: each type's max at the start, a reclaimed node's replacement, and less once the plan
    leaves nodes of a type idle (they do not pay). The job waits up to fleet_wait_s for its first nodes."""
    fleet_wait_s: float = 300.0
    """request_fleet: how long the start waits for the requested nodes (it then trains on those that came)."""
    max_recoveries: int = 5
    """Recoveries allowed while the job makes no progress (see recovery_window_steps); one more failure then
    stops the job (its newest committed step secured first)."""
    recovery_window_steps: int = 10
    """Recoveries count against max_recoveries until the job has completed this many steps beyond the newest
    step it had reached when they happened."""

    def __post_init__(self):
        if self.storage is not None and (not isinstance(self.storage, dict) or "kind" not in self.storage):
            raise ConfigError(f"storage={self.storage!r} must be a tier spec; build it with storage_spec(url)")
        hints = _hints()
        for f in fields(self):         # a wrong type from Python is one line here, not a confusing failure later
            check_type(getattr(self, f.name), hints[f.name], f"TrainJob: {f.name}")
        if isinstance(self.global_batch, bool) or not isinstance(self.global_batch, int) or self.global_batch < 1:
            raise ConfigError(f"global_batch={self.global_batch!r} must be a positive integer")
        if self.micro_batch is not None:
            check_micro_batch(self.global_batch, self.micro_batch)
        if self.eval_every and self.data is None:
            raise ConfigError(f"eval_every={self.eval_every} needs data (a dataset with a validation split)")
        if self.eval_batches < 1:
            raise ConfigError(f"eval_batches={self.eval_batches!r} must be >= 1")
        for name in ("checkpoint_every", "gc_every", "num_peers", "eval_every", "time_scale", "seed"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be >= 0")
        for name in ("seq_len", "priced_seq_len"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name}={value!r} must be a positive integer (or none)")
        for name in ("max_recoveries", "recovery_window_steps"):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), int) \
                    or getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be an integer >= 1")
        for name in ("loss_grace_s", "detect_timeout_s", "setup_timeout_s", "collective_timeout_s",
                     "plan_time_limit_s", "control_timeout_s", "dataset_cache_gb", "fleet_wait_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be > 0 seconds")
        if self.iteration_wall_s is not None and not self.iteration_wall_s > 0:
            raise ConfigError(f"iteration_wall_s={self.iteration_wall_s!r} must be > 0")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype={self.dtype!r}; valid: {', '.join(DTYPES)}")
        object.__setattr__(self, "dtype", DTYPE_NAMES[self.dtype])
        if isinstance(self.optimizer, dict):
            object.__setattr__(self, "optimizer", OptimizerConfig.from_dict(self.optimizer))
        if not isinstance(self.optimizer, OptimizerConfig):
            raise ConfigError(f"optimizer={self.optimizer!r} must be an OptimizerConfig or a dict of its fields")
        if self.profile not in PROFILE_MODES and not self.profile.endswith(".json"):
            raise ConfigError(f"profile={self.profile!r}; valid: {', '.join(PROFILE_MODES)}, or a profile DB .json")
        schedule_choices(self.schedule)
        check_recompute(self.recompute)
        check_sharding(self.optimizer_sharding)
        self.goal()
        if self.elastic and self.storage is None:
            raise ConfigError("an elastic job needs storage (a directory or s3://bucket/prefix): its durable "
                              "tier and resume point")
        if self.spot_provider not in PROVIDER_CHOICES:
            raise ConfigError(f"spot_provider={self.spot_provider!r}; valid: {', '.join(PROVIDER_CHOICES)}")
        if self.tensorboard is not None:
            check_available(self.tensorboard)
        object.__setattr__(self, "tracking", tuple(self.tracking))       # a job record's list
        check_trackers(self.tracking, tensorboard=self.tensorboard)

    @property
    def paced(self) -> bool:
        """Whether workers stretch their ops to emulated devices' predicted times."""
        return bool(self.time_scale or self.iteration_wall_s)

    def goal(self):
        """What the planner optimizes for this job (cost/money.py Goal)."""
        return goal_from(self.objective, self.prices, self.max_cost_per_hour, self.min_samples_per_s)

    def schedules(self) -> tuple[str, ...]:
        """The schedules the planner may choose from."""
        return schedule_choices(self.schedule)

    def to_dict(self) -> dict:
        return asdict(self)


@functools.cache
def _hints() -> dict:
    return typing.get_type_hints(TrainJob)


def job_from_dict(raw: dict) -> TrainJob:
    raw = dict(raw)
    if "lr" in raw:                     # a record written before the optimizer config: its constant rate
        raw["optimizer"] = {**raw.get("optimizer", {}), "lr": raw.pop("lr")}
    return dataclass_from_dict(TrainJob, raw, "train job")
