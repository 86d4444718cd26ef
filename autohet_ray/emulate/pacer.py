"""Device emulation clock: stretch each runtime op to the duration the cost model predicts for the emulated
device or link, times a time-scale factor. Only the clock differs from a real run; everything it paces
(compute, gloo p2p and collectives) really runs.

Targets per op (seconds at time scale 1), the same figures `cost.evaluate_plan` prices a plan with:
forward / backward / wgrad: this stage's per-micro-batch time split by the layer forward fraction (and, under a
split-backward schedule, the weight-gradient share into wgrad); send_activation /
send_grad: the link to the next / previous stage; grad_sync: what this device's cross-pipeline all-reduces add
after its last gradient action (the cost model posts them during that action; the part it overlaps is not paced);
optimizer: this stage's optimizer step (the cost model ends each stage with its own sync and optimizer).
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
    """`pace(op, elapsed_s)` sleeps until the op has lasted targets[op] * time_scale."""
    targets: dict[str, float]
    time_scale: float
    overruns: dict[str, int] = field(default_factory=dict)    # ops whose real run exceeded their target
    overrun_s: float = 0.0
    debt_s: float = 0.0          # real time this rank is behind its emulated schedule in the current step
    sleep: Callable[[float], None] = time.sleep

    def __post_init__(self):
        assert self.time_scale > 0, self.time_scale
        missing = set(PACED_OPS) - set(self.targets)
        assert not missing, f"emulation targets lack {sorted(missing)}"

    def pace(self, op: str, elapsed_s: float, **info) -> None:
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
        if target > 0 and elapsed_s > target:
            self.overruns[op] = self.overruns.get(op, 0) + 1
            self.overrun_s += elapsed_s - target
        left = target - elapsed_s - self.debt_s
        if left > 0:
            self.sleep(left)
        self.debt_s = max(0.0, -left)
        if op in ("grad_sync", "optimizer"):     # grad_sync waits for the other pipelines: that pays the debt
            self.debt_s = 0.0

    def report(self) -> dict:
        """Overruns since the last report (an overrun makes the emulated clock run slow)."""
        out = {"overruns": dict(self.overruns), "overrun_s": self.overrun_s}
        self.overruns, self.overrun_s = {}, 0.0
        return out
