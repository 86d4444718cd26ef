"""Device emulation clock: stretch each runtime op to the duration the cost model predicts for the emulated
device or link, times a time-scale factor. Only the clock differs from a real run; everything it paces
(compute, gloo p2p and collectives) really runs.

Targets per op (seconds at time scale 1), the same figures `cost.evaluate_plan` prices a plan with:
forward / backward / wgrad: this stage's per-micro-batch time split by the layer forward fraction (and, under a
split-backward schedule, the weight-gradient share into wgrad); send_activation /
send_grad: the link to the next / previous stage; grad_sync: what this device's cross-pipeline all-reduces add
after its last gradient action (the cost model posts them during that action; the part it overlaps is not paced),
paced from the end of the stage's last compute op: everything the stage waits for after it (the flush of its
last sends, which waits for a slower receiver; the all-reduces, which wait for slower pipelines) is part of
that exposed time, so it is counted once; optimizer: this stage's optimizer step (the cost model ends each stage
with its own sync and optimizer).
A send is held for its link time (so the peer receives it that much later) and the sender is credited with
that time on its next ops (the cost model overlaps links with compute, so the link must not lengthen the
sender's own schedule).
Receives are not paced: waiting for a peer is real.

Jitter of the real CPU work (other processes share the cores) is absorbed by carrying debt: when an op's real
run exceeds its target, the excess is taken off the following ops' sleeps within the same step (reset after
the optimizer), so each emulated device keeps its predicted pace on average; time spent waiting in a receive
pays the debt off too (the emulated device would have waited as well). Ops that overran are counted
(grad_sync's count includes waiting for slower pipelines).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from autohet_ray.cluster.spec import Cluster
from autohet_ray.cost.evaluate import Evaluation, plan_tables
from autohet_ray.model.spec import ModelSpec
from autohet_ray.plan.schedule import SPLIT_BACKWARD
from autohet_ray.plan.rankmap import build_rank_map
from autohet_ray.plan.schema import Plan
from autohet_ray.profile.db import ProfileDB

PACED_OPS = ("forward", "backward", "wgrad", "send_activation", "send_grad", "grad_sync", "optimizer")
UNPACED_OPS = ("recv_activation", "recv_grad")
SEND_OPS = ("send_activation", "send_grad")
COMPUTE_OPS = ("forward", "backward", "wgrad")


def emulation_targets(plan: Plan, cluster: Cluster, model: ModelSpec, profile: ProfileDB,
                      ev: Evaluation) -> list[dict[str, float]]:
    """Per plan rank, op name -> predicted seconds (time scale 1) by the plan's evaluation `ev`. Plain data."""
    tables = plan_tables(plan, cluster, model, profile)
    out = []
    for info in build_rank_map(plan, model.num_layers).ranks:
        k, j = info.pipeline, info.stage
        stages = plan.pipelines[k].stages
        gc = tables[k].get(stages[j].device_type, stages[j].tp)
        last = j == len(stages) - 1
        split = plan.schedule in SPLIT_BACKWARD
        fwd, bwd, wgrad = gc.stage_split(stages[j].num_layers, j == 0, last, split)
        if not split:
            bwd, wgrad = bwd + wgrad, 0.0
        links, back = ev.link_times_s[k], ev.back_link_times_s[k]
        out.append({"forward": fwd, "backward": bwd, "wgrad": wgrad,
                    "send_activation": links[j] if j < len(links) else 0.0,
                    "send_grad": back[j - 1] if j > 0 else 0.0,
                    "grad_sync": ev.sync_exposed_s.get(f"{info.node}:{info.device}", 0.0),
                    "optimizer": gc.optimizer_s(stages[j].num_layers, j == 0, last)})
    return out


def rank_pacers(plan: Plan, cluster: Cluster, model: ModelSpec, profile: ProfileDB, evaluation: Evaluation, *,
                time_scale: float, iteration_wall_s: float | None = None) -> tuple[list[dict], float]:
    """(EmulationPacer arguments per plan rank, the time scale). A zero `time_scale` is chosen so that one
    predicted iteration (of the plan's `evaluation`) lasts `iteration_wall_s` on the wall."""
    if not time_scale:
        assert iteration_wall_s, "give time_scale or iteration_wall_s"
        time_scale = iteration_wall_s / evaluation.iteration_time_s
    targets = emulation_targets(plan, cluster, model, profile, evaluation)
    return [{"targets": t, "time_scale": time_scale} for t in targets], time_scale


@dataclass(kw_only=True)
class EmulationPacer:
    """`pace(op, elapsed_s)` sleeps until the op has lasted targets[op] * time_scale.

    grad_sync is paced over a window that starts when the stage's last compute op ended, not when the op
    itself started: between the two the stage already waited (the bridge's flush of its last sends waits for a
    slow receiver), and that wait is part of the exposed sync the cost model predicts."""
    targets: dict[str, float]
    time_scale: float
    overruns: dict[str, int] = field(default_factory=dict)    # ops whose real run exceeded their target
    overrun_s: float = 0.0
    debt_s: float = 0.0          # real time this rank is behind its emulated schedule in the current step
    sleep: Callable[[float], None] = time.sleep
    now: Callable[[], float] = time.perf_counter
    phases: dict[str, float] = field(default_factory=dict)    # the last step's, real seconds (see end_step)
    _step_start: float | None = None
    _compute_end: float | None = None      # when this step's last compute op ended (after its pacing)
    _debt_at_compute_end: float = 0.0

    def __post_init__(self):
        assert self.time_scale > 0, self.time_scale
        missing = set(PACED_OPS) - set(self.targets)
        assert not missing, f"emulation targets lack {sorted(missing)}"

    def pace(self, op: str, elapsed_s: float, **info) -> None:
        if self._step_start is None:
            self._step_start = self.now() - elapsed_s
        if op in UNPACED_OPS:          # waiting for a peer catches this rank up with its emulated schedule
            self.debt_s = max(0.0, self.debt_s - elapsed_s)
            return
        assert op in self.targets, f"unknown runtime op {op!r}; known: {PACED_OPS + UNPACED_OPS}"
        target = self.targets[op] * self.time_scale
        if op in SEND_OPS:               # hold the message for the link time, then credit the sender with it
            if target > elapsed_s:
                self.sleep(target - elapsed_s)
            self.debt_s += max(target, elapsed_s)
            return
        if op == "grad_sync":
            self._pace_sync(target, elapsed_s)
            return
        self._count_overrun(op, target, elapsed_s)
        self._sleep_off(target - elapsed_s - self.debt_s)
        if op in COMPUTE_OPS:
            self._compute_end, self._debt_at_compute_end = self.now(), self.debt_s
        if op == "optimizer":
            self.phases["optimizer_s"] = self.now() - self._step_start - self.phases.get("sync_end_s", 0.0)
            self.debt_s = 0.0

    def _pace_sync(self, target: float, elapsed_s: float) -> None:
        """Sleep until `target` after the last compute op ended (less the debt the rank had then)."""
        if self._compute_end is None:     # no compute op this step: the op's own run is the window
            since, debt = elapsed_s, self.debt_s
        else:
            since, debt = self.now() - self._compute_end, self._debt_at_compute_end
        self._count_overrun("grad_sync", target, since)
        self._sleep_off(target - since - debt)
        self.debt_s = 0.0                 # the sync waits for the other pipelines: that pays the debt
        end = self.now() - self._step_start
        compute_end = (self._compute_end or self.now()) - self._step_start
        self.phases = {"compute_end_s": compute_end, "sync_s": end - compute_end, "sync_end_s": end}

    def _count_overrun(self, op: str, target: float, took_s: float) -> None:
        if target > 0 and took_s > target:
            self.overruns[op] = self.overruns.get(op, 0) + 1
            self.overrun_s += took_s - target

    def _sleep_off(self, left: float) -> None:
        """Sleep `left` seconds; a negative `left` is debt carried to the next ops."""
        if left > 0:
            self.sleep(left)
        self.debt_s = max(0.0, -left)

    def end_step(self) -> None:
        """A step (or an evaluation) ended: the next op starts a new schedule with no debt."""
        self._step_start, self._compute_end, self._debt_at_compute_end, self.debt_s = None, None, 0.0, 0.0

    def report(self) -> dict:
        """Overruns since the last report (an overrun makes the emulated clock run slow) and the last step's
        phases in real seconds from its first op: `compute_end_s` (the last compute op ended), `sync_s` (from
        then to the end of grad_sync, the flush of the last sends included), `optimizer_s`."""
        out = {"overruns": dict(self.overruns), "overrun_s": self.overrun_s,
               "phases": {k: v for k, v in self.phases.items() if k != "sync_end_s"}}
        self.overruns, self.overrun_s = {}, 0.0
        return out
