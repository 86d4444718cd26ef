"""`autohet show`: a plan's pipeline timeline (which stage runs which micro-batch when) and memory bars."""
from __future__ import annotations

from autohet_ray.cost.timeline import Slot, simulate
from autohet_ray.plan.schedule import SPLIT_BACKWARD
from autohet_ray.plan.schema import Plan

MAX_TEXT_COLUMNS = 100
SLOT_COLORS = {"F": "tab:blue", "B": "tab:orange", "W": "tab:green"}


def _slots(plan: Plan) -> list[list[Slot]]:
    """Per pipeline, its schedule's timeline with stage times proportional to layers (backward = 2 x forward,
    split evenly into B and W under a split-backward schedule); relative, since a plan file has no profile."""
    out = []
    split = plan.schedule in SPLIT_BACKWARD
    for p in plan.pipelines:
        fwd = [s.num_layers for s in p.stages]
        out.append(simulate(fwd, [(1 if split else 2) * f for f in fwd], [0.0] * (len(fwd) - 1),
                            p.num_microbatches, plan.schedule, fwd if split else None))
    return out


def _sizes(plan: Plan) -> str:
    sizes = sorted({plan.micro_batch_of(k) for k in range(len(plan.pipelines))})
    return str(sizes[0]) if len(sizes) == 1 else "per pipeline " + "/".join(map(str, sizes))


def timeline_text(plan: Plan) -> str:
    timelines = _slots(plan)
    horizon = max(s.end_s for t in timelines for s in t)
    scale = MAX_TEXT_COLUMNS / horizon
    lines = [f"{plan.model}: {len(plan.pipelines)} pipelines, global batch {plan.global_batch}, "
             f"micro-batch {_sizes(plan)}, {plan.schedule} (F = forward, B = backward, W = weight gradients; "
             "time relative to layers held)"]
    if plan.predicted:
        lines.append(f"predicted {plan.predicted.iteration_time_s:.3f} s/iteration, "
                     f"{plan.predicted.samples_per_s:.1f} samples/s [{plan.predicted.profile_kind}]")
    for k, (p, slots) in enumerate(zip(plan.pipelines, timelines)):
        for j, stage in enumerate(p.stages):
            row = [" "] * (MAX_TEXT_COLUMNS + 1)
            for s in (s for s in slots if s.stage == j):
                for c in range(int(s.start_s * scale), max(int(s.start_s * scale) + 1, int(s.end_s * scale))):
                    row[min(c, MAX_TEXT_COLUMNS)] = s.kind
            label = f"p{k} s{j} {stage.device_type}x{stage.tp} L[{stage.layers[0]},{stage.layers[1]})"
            lines.append(f"{label:<28}|{''.join(row)}|")
    if plan.predicted and plan.predicted.peak_memory_bytes_per_device:
        lines.append("peak memory per device (GB): " + ", ".join(
            f"{d}={b / 1e9:.1f}" for d, b in sorted(plan.predicted.peak_memory_bytes_per_device.items())))
    return "\n".join(lines)


def draw_plan(plan: Plan, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    timelines = _slots(plan)
    rows = [(k, j) for k, p in enumerate(plan.pipelines) for j in range(len(p.stages))]
    mem = plan.predicted.peak_memory_bytes_per_device if plan.predicted else {}
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, 1 + 0.4 * len(rows)), gridspec_kw={"width_ratios": [3, 1]})
    for y, (k, j) in enumerate(rows):
        for s in (s for s in timelines[k] if s.stage == j):
            ax.barh(y, s.end_s - s.start_s, left=s.start_s, color=SLOT_COLORS[s.kind], edgecolor="white")
            ax.text((s.start_s + s.end_s) / 2, y, str(s.microbatch), ha="center", va="center", fontsize=6)
    labels = [f"p{k} s{j} {plan.pipelines[k].stages[j].device_type}x{plan.pipelines[k].stages[j].tp}"
              for k, j in rows]
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("time (relative; blue = forward, orange = backward, green = weight gradients)")
    ax.set_title(f"{plan.model}: {plan.schedule} timeline per pipeline")
    devices = sorted(mem)
    bx.barh(range(len(devices)), [mem[d] / 1e9 for d in devices])
    bx.set_yticks(range(len(devices)), devices, fontsize=6)
    bx.invert_yaxis()
    bx.set_xlabel("predicted peak memory (GB)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
