"""The console of `autohet train` and `autohet resume`: Controller.run with its launch, re-plans, recoveries and
steps printed as they happen, and a stop signal ending the run with the signal's exit status."""
from __future__ import annotations

import sys

from autohet_ray.cli.signals import as_raised, stopped_by

BAR_WIDTH = 20


def run_in_console(ctl, target: int, *, restore: str | None = None, spot_provider: str | None = None) -> dict:
    """Controller.run until step `target`, printed; the run's summary."""
    try:
        out = ctl.run(target, restore=restore, spot_provider=spot_provider, stopped_by=stopped_by,
                      on_event=_Console(ctl, target), lease=False)      # the command holds the lease already
    except BaseException:
        if stopped_by() is None:
            raise
        raise as_raised(stopped_by()) from None
    if out["failure"]:
        print(f"autohet: stopped: {out['failure']}", file=sys.stderr, flush=True)
    return out


class _Console:
    def __init__(self, ctl, target: int):
        self.ctl, self.target, self.tag = ctl, target, " (emulated)" if ctl.job.paced else ""

    def __call__(self, kind: str, report: dict) -> None:
        if kind == "launched":
            self._launched(report)
        elif kind == "replanned":
            print(f"re-planned: {report.get('reason', '')} -> {report['plan']}")
        elif kind == "recovered":
            print(f"recovered ({report['message']}) onto {report['plan']} from step {report['restored_step']}: "
                  f"{report['bytes_by_tier']} bytes, {report['total_s']:.1f} s")
        elif kind == "step":
            self._step(report)
        elif kind == "closed" and report.get("step") is not None and report.get("where"):
            print(f"committed step {report['step']} is in {report['where']}", flush=True)

    def _launched(self, launch: dict) -> None:
        ctl, plan = self.ctl, self.ctl.plan
        shape = " | ".join("+".join(f"{s.device_type}x{s.tp}[{s.layers[0]},{s.layers[1]})" for s in p.stages)
                           + f" m={p.num_microbatches}x{plan.micro_batch_of(k)}" for k, p in enumerate(plan.pipelines))
        print(f"data: {ctl.data.describe()}")
        print(f"plan ({plan.schedule}): {shape}")
        print(f"  predicted {ctl.evaluation.iteration_time_s:.4f} s/iteration, {ctl.evaluation.samples_per_s:.1f} "
              f"samples/s{self.tag}; profile {ctl.profile.kind}  [{launch['seconds']:.1f} s]")
        for name, t in ctl.baselines.items():
            print(f"  vs {name}: predicted {t:.4f} s/iteration -> gain {t / ctl.evaluation.iteration_time_s:.2f}x")
        if launch.get("time_scale"):
            print(f"  time scale {launch['time_scale']:.3g} wall s per emulated s (emulated)")
        if launch.get("restored_step") is not None:
            print(f"restored step {launch['restored_step']} ({launch['bytes_by_tier']} bytes)")

    def _step(self, m: dict) -> None:
        tag, target = self.tag, self.target
        filled = BAR_WIDTH * min(m["step"], target) // target
        bar = "[" + "#" * filled + "." * (BAR_WIDTH - filled) + "]"
        print(f"{bar} step {m['step']}/{target}: loss {m['loss']:.4f}  lr {m['lr']:.3g}  {_speed(m)}{tag}  "
              f"{m['wall_s']:.2f} s  {m['samples_per_s']:.1f} samples/s measured vs "
              f"{m['predicted_samples_per_s']:.1f} predicted{tag}"
              + (f"  val loss {m['val_loss']:.4f}" if "val_loss" in m else ""), flush=True)


def _speed(m: dict) -> str:
    """tokens/s and MFU (overall, and per GPU type when the plan mixes types) of one step's metrics."""
    by_type = m["mfu_by_device_type"]
    types = " (" + ", ".join(f"{t} {100 * v:.3g}%" for t, v in by_type.items()) + ")" if len(by_type) > 1 else ""
    return f"{m['tokens_per_s']:.4g} tok/s  MFU {100 * m['mfu']:.3g}%{types}"
