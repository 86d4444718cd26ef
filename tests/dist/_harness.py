"""Shared pieces of the distributed numerics tests: hand-written plans, batches, a worker that runs cases in
a spawned world, and the comparison with the single-process reference."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from autohet_ray.layout import covers_exactly
from autohet_ray.model.spec import PRESETS, ModelSpec
from autohet_ray.plan.schema import Pipeline, Plan, Stage
from autohet_ray.runtime import Engine, Reference

LR, WEIGHT_DECAY, MAX_GRAD_NORM = 1e-2, 0.1, 1.0
MICRO_BATCH, SEQ_LEN = 2, 8
GRAD_TOL, PARAM_TOL = 1e-5, 1e-4
DTYPE = torch.float64


def pipeline(num_microbatches: int, *stages: tuple[int, int, int], micro_batch: int | None = None) -> Pipeline:
    """stages: (start, end, tp) each; devices are numbered per pipeline on a fake node. `micro_batch`: this
    pipeline's own micro-batch size (default: the plan's)."""
    built, device = [], 0
    for start, end, tp in stages:
        built.append(Stage(layers=(start, end), tp=tp, device_type="cpu", node=f"n{num_microbatches}",
                           devices=tuple(range(device, device + tp))))
        device += tp
    return Pipeline(num_microbatches=num_microbatches, stages=tuple(built), micro_batch=micro_batch)


def make_plan(spec: ModelSpec, *pipelines: Pipeline) -> Plan:
    total = sum(p.num_microbatches * (p.micro_batch or MICRO_BATCH) for p in pipelines)
    return Plan(model=spec.name, global_batch=total, micro_batch=MICRO_BATCH, seq_len=SEQ_LEN,
                pipelines=tuple(pipelines))


def make_batch(spec: ModelSpec, plan: Plan, step: int) -> dict:
    g = torch.Generator().manual_seed(1000 + step)
    shape = (plan.global_batch, plan.seq_len)
    ids = torch.randint(0, spec.vocab_size, shape, generator=g)
    labels = torch.randint(0, spec.vocab_size, shape, generator=g)
    ignored = torch.rand(shape, generator=g) < (0.7 if spec.family == "bert" else 0.15)
    return {"input_ids": ids, "labels": labels.masked_fill(ignored, -100)}


@dataclass(frozen=True, kw_only=True)
class Case:
    name: str
    spec: ModelSpec
    pipelines: tuple[Pipeline, ...]
    steps: int = 3
    schedule: str = "1f1b"
    resume_after: int | None = None       # rebuild the engine from its state_dict after this many steps
    record_pacer: bool = False
    sync_bucket_elements: int | None = None   # None: the runtime's default (one bucket per run for tiny models)

    @property
    def plan(self) -> Plan:
        return make_plan(self.spec, *self.pipelines)


class RecordingPacer:
    def __init__(self):
        self.calls: list[tuple[str, dict]] = []

    def pace(self, op: str, elapsed_s: float, **info) -> None:
        assert elapsed_s >= 0
        self.calls.append((op, info))

    def end_step(self) -> None:
        pass


def _engine(case: Case, rank: int, overlap: list, pacer=None) -> Engine:
    engine = Engine(plan=case.plan, model_spec=case.spec, rank=rank, seed=7, lr=LR, weight_decay=WEIGHT_DECAY,
                    max_grad_norm=MAX_GRAD_NORM, dtype=DTYPE, schedule=case.schedule, pacer=pacer,
                    **({"sync_bucket_elements": case.sync_bucket_elements} if case.sync_bucket_elements else {}))
    sync, start = engine.grad_sync, engine.grad_sync.start

    def watched_start():            # records (buckets posted during the backward, buckets of this rank)
        overlap.append((sync._posted, len(sync.ops)))
        start()
    sync.start = watched_start
    return engine


def run_case(rank: int, case: Case) -> dict:
    pacer = RecordingPacer() if case.record_pacer else None
    overlap: list[tuple[int, int]] = []
    engine = _engine(case, rank, overlap, pacer)
    out = {"losses": [], "norms": [], "pace": None, "pipeline": engine.info.pipeline, "overlap": overlap,
           "groups_built": engine.groups_built}
    for step in range(case.steps):
        if case.resume_after is not None and step == case.resume_after:
            state = engine.state_dict()
            engine = _engine(case, rank, overlap)
            engine.load_state_dict(state)
        result = engine.train_step(make_batch(case.spec, case.plan, step))
        assert result["step"] == step + 1
        out["losses"].append(result["loss"])
        out["norms"].append(result["grad_norm"])
        if step == 0:
            out["grads"] = engine.grads()
    out["state"] = engine.state_dict()
    if pacer is not None:
        out["pace"] = pacer.calls
    return out


def run_cases(rank: int, world_size: int, cases: list[Case]) -> dict:
    return {case.name: run_case(rank, case) for case in cases}


def reference_run(case: Case) -> dict:
    ref = Reference(model_spec=case.spec, seed=7, lr=LR, weight_decay=WEIGHT_DECAY, max_grad_norm=MAX_GRAD_NORM,
                    dtype=DTYPE)
    out = {"losses": [], "norms": []}
    for step in range(case.steps):
        result = ref.train_step(make_batch(case.spec, case.plan, step))
        out["losses"].append(result["loss"])
        out["norms"].append(result["grad_norm"])
        if step == 0:
            out["grads"] = ref.grads()
    out["state"] = ref.state_dict()
    return out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    diff = float((a - b).norm())
    return diff / float(b.norm()) if float(b.norm()) > 0 else diff


@dataclass
class Report:
    worst_grad: float = 0.0
    worst_param: float = 0.0
    problems: list[str] = field(default_factory=list)


def compare(case: Case, per_rank: list[dict], ref: dict) -> Report:
    report = Report()
    for rank, got in enumerate(per_rank):
        for step, (loss, ref_loss) in enumerate(zip(got["losses"], ref["losses"])):
            if abs(loss - ref_loss) > PARAM_TOL * abs(ref_loss):
                report.problems.append(f"rank {rank} step {step} loss {loss} vs reference {ref_loss}")
        if abs(got["norms"][0] - ref["norms"][0]) > GRAD_TOL * ref["norms"][0]:
            report.problems.append(f"rank {rank} grad norm {got['norms'][0]} vs reference {ref['norms'][0]}")
        for key, tol, attr in (("grads", GRAD_TOL, "worst_grad"), ("state", PARAM_TOL, "worst_param")):
            for name, (tensor, shape, chunk) in got[key].items():
                if name == "optim.step":
                    continue
                err = _rel(tensor, ref[key][name][chunk.slices()])
                setattr(report, attr, max(getattr(report, attr), err))
                if err > tol:
                    report.problems.append(f"rank {rank} {key} {name} {chunk}: relative error {err:.2e}")
    _check_coverage(per_rank, ref, report)
    for rank, got in enumerate(per_rank):
        if any(posted != total for posted, total in got["overlap"]):
            report.problems.append(f"rank {rank}: buckets posted during the backward / all: {got['overlap']}")
    return report


def _check_coverage(per_rank: list[dict], ref: dict, report: Report) -> None:
    """Each pipeline holds every parameter and optimizer tensor of the model, in chunks that tile it."""
    for k in sorted({got["pipeline"] for got in per_rank}):
        chunks: dict[str, set] = {}
        for got in per_rank:
            if got["pipeline"] == k:
                for name, (_, shape, chunk) in got["state"].items():
                    chunks.setdefault(name, set()).add((tuple(shape), chunk))
        expected = set(ref["state"]) | {"optim.step"}
        if set(chunks) != expected:
            report.problems.append(f"pipeline {k}: state names differ from the reference: "
                                   f"{sorted(set(chunks) ^ expected)}")
        for name, held in chunks.items():
            shapes = {s for s, _ in held}
            if len(shapes) != 1 or not covers_exactly([c for _, c in held], shapes.pop()):
                report.problems.append(f"pipeline {k}: {name}: chunks {sorted(str(c) for _, c in held)} "
                                       "do not tile the tensor")


FAMILY_SPECS = {"gpt": PRESETS["tiny-gpt"], "llama": PRESETS["tiny-llama"], "bert": PRESETS["tiny-bert"]}
TP4_SPECS = {"gpt": PRESETS["tiny-gpt"], "llama": PRESETS["tiny-llama-kv4"], "bert": PRESETS["tiny-bert"]}
