"""The plan: versioned JSON that the planner writes and the runtime executes.

Pipelines are data-parallel replicas; each has its own stages (a TP group of one GPU type on one node, with a
contiguous layer range [start, end) over transformer layers), its own micro-batch count and, optionally, its
own micro-batch size (default: the plan's `micro_batch`), so that the batch can be split across pipelines of
different speeds in steps finer than one micro-batch. The embedding belongs to every pipeline's first stage
and the head to its last stage. Pipeline k takes the samples after those of pipelines 0 .. k-1.
`schedule` names the pipeline schedule every pipeline runs (see plan/schedule.py: "1f1b" or "zb-h1").
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace

from autohet_ray import ConfigError
from autohet_ray.config_io import mapping, parse_json, read_text_file, text_field
from autohet_ray.plan.schedule import PLAN_SCHEDULES

SCHEMA_VERSION = 3           # 2: optional per-pipeline micro_batch; 3: schedule (older plans are read as 1f1b)
READABLE_VERSIONS = (1, 2, 3)
RECOMPUTE_MODES = ("none", "full", "auto")     # what a planning request may ask for (planner/passes/recompute.py)


# optimizer state sharding a planning request may ask for (planner/passes/sharding.py)
SHARDING_MODES = ("none", "dp", "auto")


def check_sharding(mode: str) -> None:
    if mode not in SHARDING_MODES:
        raise ConfigError(f"optimizer_sharding={mode!r}; valid: {', '.join(SHARDING_MODES)}")


def check_recompute(mode: str) -> None:
    if mode not in RECOMPUTE_MODES:
        raise ConfigError(f"recompute={mode!r}; valid: {', '.join(RECOMPUTE_MODES)}")


@dataclass(frozen=True, kw_only=True)
class Stage:
    layers: tuple[int, int]          # [start, end) transformer layers
    tp: int
    device_type: str
    node: str
    devices: tuple[int, ...]         # GPU indices on `node`; len == tp
    recompute: bool = False          # recompute each layer's activations in its backward (keep only its input)
    shard_optimizer: bool = False    # shard its units' optimizer state across their holders (runtime/shard_sync.py)
    slice_weight: float = 1.0        # its slices' size relative to its co-holders' (planner/passes/slice_sizes.py)

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]

    def to_dict(self) -> dict:
        out = {"layers": list(self.layers), "tp": self.tp, "device_type": self.device_type,
               "node": self.node, "devices": list(self.devices)}
        if self.recompute:
            out["recompute"] = True
        if self.shard_optimizer:
            out["shard_optimizer"] = True
        if self.slice_weight != 1.0:
            out["slice_weight"] = self.slice_weight
        return out


@dataclass(frozen=True, kw_only=True)
class Pipeline:
    num_microbatches: int
    stages: tuple[Stage, ...]
    micro_batch: int | None = None   # samples per micro-batch in this pipeline; None: the plan's

    def to_dict(self) -> dict:
        out = {"num_microbatches": self.num_microbatches, "stages": [s.to_dict() for s in self.stages]}
        if self.micro_batch is not None:
            out["micro_batch"] = self.micro_batch
        return out


@dataclass(frozen=True, kw_only=True)
class StageTimes:
    """A stage's predicted seconds: forward, backward (input gradients only under a split-backward schedule)
    and weight-gradient action of one micro-batch; when, from the iteration's start, its gradients are
    synchronized across pipelines; and its optimizer step."""
    fwd_s: float
    bwd_s: float
    wgrad_s: float
    sync_end_s: float
    optimizer_s: float


@dataclass(frozen=True, kw_only=True)
class LinkTimes:
    """Predicted seconds of one micro-batch's activation to the next stage and of its gradient back."""
    activation_s: float
    gradient_s: float


@dataclass(frozen=True, kw_only=True)
class Predicted:
    iteration_time_s: float
    samples_per_s: float
    peak_memory_bytes: int                              # max over devices
    peak_memory_bytes_per_device: dict[str, int] = field(default_factory=dict)   # "node:gpu" -> bytes
    profile_kind: str = "analytic"                      # "analytic" (from the catalog) or "measured"
    # optional (plans written before these existed have none): per pipeline, per stage / per boundary
    stages: tuple[tuple[StageTimes, ...], ...] = ()
    links: tuple[tuple[LinkTimes, ...], ...] = ()
    capacity_bytes_per_device: dict[str, int] = field(default_factory=dict)     # usable for training
    dtype: str = ""                                     # the dtype the prediction prices ("" if not recorded)

    def to_dict(self) -> dict:
        out = {"iteration_time_s": self.iteration_time_s, "samples_per_s": self.samples_per_s,
               "peak_memory_bytes": self.peak_memory_bytes,
               "peak_memory_bytes_per_device": dict(self.peak_memory_bytes_per_device),
               "profile_kind": self.profile_kind}
        if self.stages:
            out["stages"] = [[asdict(s) for s in p] for p in self.stages]
            out["links"] = [[asdict(link) for link in p] for p in self.links]
        if self.capacity_bytes_per_device:
            out["capacity_bytes_per_device"] = dict(self.capacity_bytes_per_device)
        if self.dtype:
            out["dtype"] = self.dtype
        return out


@dataclass(frozen=True, kw_only=True)
class Plan:
    model: str
    global_batch: int                # samples per iteration
    micro_batch: int                 # samples per micro-batch
    seq_len: int
    pipelines: tuple[Pipeline, ...]
    model_spec: dict | None = None   # full ModelSpec fields, so a custom model travels with the plan
    cluster: str = ""
    predicted: Predicted | None = None
    schedule: str = "1f1b"           # pipeline schedule of every pipeline (plan/schedule.py)

    def __post_init__(self):
        if self.schedule not in PLAN_SCHEDULES:
            raise ConfigError(f"plan: schedule={self.schedule!r}; valid: {', '.join(PLAN_SCHEDULES)}")

    def micro_batch_of(self, k: int) -> int:
        """Samples per micro-batch in pipeline k."""
        mb = self.pipelines[k].micro_batch
        return self.micro_batch if mb is None else mb

    def samples_of(self, k: int) -> int:
        return self.pipelines[k].num_microbatches * self.micro_batch_of(k)

    def sample_offset(self, k: int) -> int:
        """Index of pipeline k's first sample in the global batch."""
        return sum(self.samples_of(i) for i in range(k))

    @property
    def num_devices(self) -> int:
        return sum(s.tp for p in self.pipelines for s in p.stages)

    def with_predicted(self, predicted: Predicted) -> "Plan":
        return replace(self, predicted=predicted)

    def with_schedule(self, schedule: str) -> "Plan":
        return self if schedule == self.schedule else replace(self, schedule=schedule, predicted=None)

    def with_recompute(self, flags) -> "Plan":
        """The plan with stage j of pipeline k recomputing iff flags[k][j] (or every stage iff `flags` is a bool)."""
        pick = (lambda k, j: flags) if isinstance(flags, bool) else (lambda k, j: bool(flags[k][j]))
        pipelines = tuple(replace(p, stages=tuple(replace(s, recompute=pick(k, j)) for j, s in enumerate(p.stages)))
                          for k, p in enumerate(self.pipelines))
        return replace(self, pipelines=pipelines, predicted=None)

    def with_optimizer_sharding(self, flags) -> "Plan":
        """The plan with stage j of pipeline k sharding its optimizer state iff flags[k][j] (or every stage iff
        `flags` is a bool)."""
        pick = (lambda k, j: flags) if isinstance(flags, bool) else (lambda k, j: bool(flags[k][j]))
        pipelines = tuple(replace(p, stages=tuple(replace(s, shard_optimizer=pick(k, j))
                                                  for j, s in enumerate(p.stages)))
                          for k, p in enumerate(self.pipelines))
        return replace(self, pipelines=pipelines, predicted=None)

    def with_slice_weights(self, weights) -> "Plan":
        """The plan with stage j of pipeline k sizing its slices of sharded optimizer state by weights[k][j]."""
        pipelines = tuple(replace(p, stages=tuple(replace(s, slice_weight=float(weights[k][j]))
                                                  for j, s in enumerate(p.stages)))
                          for k, p in enumerate(self.pipelines))
        return replace(self, pipelines=pipelines, predicted=None)

    def slice_weights(self) -> tuple[tuple[float, ...], ...]:
        return tuple(tuple(s.slice_weight for s in p.stages) for p in self.pipelines)

    def recompute_flags(self) -> tuple[tuple[bool, ...], ...]:
        return tuple(tuple(s.recompute for s in p.stages) for p in self.pipelines)

    def to_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "model": self.model, "model_spec": self.model_spec,
                "cluster": self.cluster, "global_batch": self.global_batch, "micro_batch": self.micro_batch,
                "seq_len": self.seq_len, "schedule": self.schedule, "pipelines": [p.to_dict() for p in self.pipelines],
                "predicted": self.predicted.to_dict() if self.predicted else None}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def plan_summary(plan: Plan) -> list[list[str]]:
    """Per pipeline, its stages as 'node:device xTP [start,end)'."""
    return [[f"{s.node}:{s.device_type}x{s.tp}[{s.layers[0]},{s.layers[1]})" for s in p.stages]
            for p in plan.pipelines]


def _need(raw: dict, key: str, where: str):
    if not isinstance(raw, dict) or key not in raw:
        raise ConfigError(f"plan: {where} is missing {key!r}")
    return raw[key]


def _int(value, where: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"plan: {where}={value!r} must be an integer >= {minimum}")
    return value


def _stage_from_dict(raw: dict, where: str) -> Stage:
    layers = _need(raw, "layers", where)
    if not (isinstance(layers, (list, tuple)) and len(layers) == 2):
        raise ConfigError(f"plan: {where}.layers={layers!r} must be [start, end)")
    devices = _need(raw, "devices", where)
    if not isinstance(devices, (list, tuple)):
        raise ConfigError(f"plan: {where}.devices={devices!r} must be a list of GPU indices")
    return Stage(layers=(_int(layers[0], f"{where}.layers[0]"), _int(layers[1], f"{where}.layers[1]")),
                 tp=_int(_need(raw, "tp", where), f"{where}.tp", 1),
                 device_type=text_field(_need(raw, "device_type", where), f"plan: {where}.device_type"),
                 node=text_field(_need(raw, "node", where), f"plan: {where}.node"),
                 devices=tuple(_int(d, f"{where}.devices") for d in devices),
                 recompute=_bool(raw.get("recompute", False), f"{where}.recompute"),
                 shard_optimizer=_bool(raw.get("shard_optimizer", False), f"{where}.shard_optimizer"),
                 slice_weight=check_slice_weight(raw.get("slice_weight", 1.0), f"{where}.slice_weight"))


def check_slice_weight(value, where: str) -> float:
    """A stage's relative slice size: a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"plan: {where}={value!r} must be a finite number > 0 (a stage's slice size relative "
                          "to its co-holders'; 1 for equal slices)")
    return float(value)


def _bool(value, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"plan: {where}={value!r} must be true or false")
    return value


def _timed(cls, raw, where: str):
    names = [f.name for f in fields(cls)]
    if not isinstance(raw, dict) or set(raw) != set(names):
        raise ConfigError(f"plan: {where}={raw!r} must hold exactly {names}")
    try:
        return cls(**{n: float(raw[n]) for n in names})
    except (TypeError, ValueError):
        raise ConfigError(f"plan: {where}={raw!r}: every value must be a number of seconds") from None


def _nested(cls, raw, where: str) -> tuple:
    if not isinstance(raw, list) or not all(isinstance(p, list) for p in raw):
        raise ConfigError(f"plan: {where} must be a list (per pipeline) of lists")
    return tuple(tuple(_timed(cls, x, f"{where}[{k}][{j}]") for j, x in enumerate(p)) for k, p in enumerate(raw))


def _predicted_from_dict(raw: dict | None) -> Predicted | None:
    if not raw:
        return None
    try:
        return Predicted(
            iteration_time_s=float(raw["iteration_time_s"]), samples_per_s=float(raw["samples_per_s"]),
            peak_memory_bytes=int(raw["peak_memory_bytes"]),
            peak_memory_bytes_per_device={k: int(v) for k, v in
                                          (raw.get("peak_memory_bytes_per_device") or {}).items()},
            profile_kind=str(raw.get("profile_kind", "analytic")),
            stages=_nested(StageTimes, raw["stages"], "predicted.stages") if "stages" in raw else (),
            links=_nested(LinkTimes, raw.get("links", []), "predicted.links") if "stages" in raw else (),
            capacity_bytes_per_device={k: int(v) for k, v in
                                       (raw.get("capacity_bytes_per_device") or {}).items()},
            dtype=str(raw.get("dtype", "")))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"plan: predicted is malformed ({type(exc).__name__}: {exc})") from None


def plan_from_dict(raw) -> Plan:
    if not isinstance(raw, dict):
        raise ConfigError("plan: expected a JSON object")
    version = raw.get("schema_version")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise ConfigError(f"plan: schema_version={version!r}; this version reads schema_version "
                          f"{' or '.join(map(str, READABLE_VERSIONS))}")
    pipelines_raw = _need(raw, "pipelines", "plan")
    if not isinstance(pipelines_raw, list) or not pipelines_raw:
        raise ConfigError("plan: 'pipelines' must be a non-empty list")
    pipelines = []
    for k, p in enumerate(pipelines_raw):
        stages_raw = _need(p, "stages", f"pipelines[{k}]")
        if not isinstance(stages_raw, list) or not stages_raw:
            raise ConfigError(f"plan: pipelines[{k}].stages must be a non-empty list")
        stages = tuple(_stage_from_dict(s, f"pipelines[{k}].stages[{j}]") for j, s in enumerate(stages_raw))
        mb = p.get("micro_batch") if version >= 2 else None
        pipelines.append(Pipeline(num_microbatches=_int(_need(p, "num_microbatches", f"pipelines[{k}]"),
                                                        f"pipelines[{k}].num_microbatches", 1), stages=stages,
                                  micro_batch=None if mb is None else _int(mb, f"pipelines[{k}].micro_batch", 1)))
    model_spec = raw.get("model_spec")
    if model_spec is not None:
        mapping(model_spec, "plan: model_spec")
    return Plan(model=text_field(_need(raw, "model", "plan"), "plan: model"), model_spec=model_spec,
                cluster=text_field(raw.get("cluster", ""), "plan: cluster"),
                global_batch=_int(_need(raw, "global_batch", "plan"), "global_batch", 1),
                micro_batch=_int(_need(raw, "micro_batch", "plan"), "micro_batch", 1),
                seq_len=_int(_need(raw, "seq_len", "plan"), "seq_len", 1), pipelines=tuple(pipelines),
                schedule=text_field(raw.get("schedule", "1f1b"), "plan: schedule") if version >= 3 else "1f1b",
                predicted=_predicted_from_dict(raw.get("predicted")))


def plan_from_json(text: str) -> Plan:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"plan: not valid JSON ({exc})") from None
    return plan_from_dict(raw)


def load_plan(path: str) -> Plan:
    return plan_from_dict(parse_json(read_text_file(path, "plan"), f"plan file {path!r}"))
