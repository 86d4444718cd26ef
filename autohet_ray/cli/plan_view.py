"""`autohet show`: a plan's pipeline timeline (which stage runs which micro-batch when) and memory per stage.

Durations come from the plan's `predicted` section (each stage's forward, backward and weight-gradient seconds
per micro-batch, each link's seconds, each stage's gradient-sync end and optimizer step), so the picture is in
seconds and shows the stages the cost model keeps busy. Plans written before those were recorded are drawn
with stage times proportional to the layers held (labelled "relative"). Identical pipelines are drawn once.
"""
from __future__ import annotations

from dataclasses import dataclass

from autohet_ray.cli.units import plural, seconds
from autohet_ray.cost.sharding import equal_slices, shard_ways
from autohet_ray.cost.timeline import Slot, simulate
from autohet_ray.plan.schedule import SPLIT_BACKWARD
from autohet_ray.plan.schema import Plan

MAX_TEXT_COLUMNS = 100
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22")
SYNC_COLOR, OPTIMIZER_COLOR = "#f0b429", "#303030"
TEXT_MARKS = {"sync": "~", "optimizer": "O"}


@dataclass(frozen=True)
class Row:
    """One drawn stage: its pipeline (the first of `copies` identical ones), its slots and its tail."""
    pipeline: int
    stage: int
    copies: int
    slots: tuple[Slot, ...]
    sync: tuple[float, float] | None         # (start, end) of the exposed gradient sync
    optimizer: tuple[float, float] | None


def _pipeline_key(plan: Plan, k: int) -> tuple:
    p = plan.pipelines[k]
    return (p.num_microbatches, plan.micro_batch_of(k),
            tuple((s.layers, s.tp, s.device_type) for s in p.stages))


def _durations(plan: Plan, k: int):
    """(fwd, bwd, wgrad, links, back links) of pipeline k; seconds when the plan carries them, else relative."""
    pred, split = plan.predicted, plan.schedule in SPLIT_BACKWARD
    if pred is not None and pred.stages:
        stages, links = pred.stages[k], pred.links[k]
        return ([s.fwd_s for s in stages], [s.bwd_s for s in stages], [s.wgrad_s for s in stages],
                [x.activation_s for x in links], [x.gradient_s for x in links])
    fwd = [float(s.num_layers) for s in plan.pipelines[k].stages]
    zeros = [0.0] * (len(fwd) - 1)
    return fwd, [(1.0 if split else 2.0) * f for f in fwd], (fwd if split else [0.0] * len(fwd)), zeros, zeros


def in_seconds(plan: Plan) -> bool:
    return plan.predicted is not None and bool(plan.predicted.stages)


def timeline_rows(plan: Plan) -> list[Row]:
    split = plan.schedule in SPLIT_BACKWARD
    seen: dict[tuple, int] = {}
    for k in range(len(plan.pipelines)):
        seen.setdefault(_pipeline_key(plan, k), k)
    copies = {first: sum(1 for k in range(len(plan.pipelines)) if _pipeline_key(plan, k) == key)
              for key, first in seen.items()}
    rows = []
    for k in sorted(copies):
        fwd, bwd, wgrad, links, back = _durations(plan, k)
        slots = simulate(fwd, bwd if split else [b + w for b, w in zip(bwd, wgrad)], links,
                         plan.pipelines[k].num_microbatches, plan.schedule, wgrad if split else None, back)
        for j in range(len(fwd)):
            mine = tuple(s for s in slots if s.stage == j)
            sync = optimizer = None
            if in_seconds(plan):
                t = plan.predicted.stages[k][j]
                done = max(s.end_s for s in mine)
                sync = (done, t.sync_end_s) if t.sync_end_s > done else None
                start = max(done, t.sync_end_s)
                optimizer = (start, start + t.optimizer_s)
            rows.append(Row(k, j, copies[k], mine, sync, optimizer))
    return rows


def _label(plan: Plan, row: Row) -> str:
    stage = plan.pipelines[row.pipeline].stages[row.stage]
    copies = f" ({row.copies} pipelines)" if row.copies > 1 else ""
    return (f"p{row.pipeline} s{row.stage} {stage.device_type}x{stage.tp} "
            f"L[{stage.layers[0]},{stage.layers[1]}){copies}")


def _sizes(plan: Plan) -> str:
    sizes = sorted({plan.micro_batch_of(k) for k in range(len(plan.pipelines))})
    return str(sizes[0]) if len(sizes) == 1 else "per pipeline " + "/".join(map(str, sizes))


def _horizon(rows: list[Row]) -> float:
    ends = [s.end_s for r in rows for s in r.slots] + [r.optimizer[1] for r in rows if r.optimizer]
    return max(ends)


def timeline_text(plan: Plan) -> str:
    rows = timeline_rows(plan)
    horizon = _horizon(rows)
    scale = MAX_TEXT_COLUMNS / horizon
    unit = f"{horizon / MAX_TEXT_COLUMNS * 1e3:.2f} ms per column" if in_seconds(plan) else \
        "time relative to layers held"
    lines = [f"{plan.model}: {plural(len(plan.pipelines), 'pipeline')}, global batch {plan.global_batch}, "
             f"micro-batch {_sizes(plan)}, {plan.schedule} (F = forward, B = backward, W = weight gradients, "
             f"~ = gradient sync, O = optimizer; {unit})"]
    if plan.predicted:
        lines.append(f"predicted {seconds(plan.predicted.iteration_time_s)}/iteration, "
                     f"{plan.predicted.samples_per_s:.1f} samples/s [{plan.predicted.profile_kind}"
                     f"{', ' + plan.predicted.dtype if plan.predicted.dtype else ''}]")
    width = max(len(_label(plan, r)) for r in rows) + 1
    for r in rows:
        cells = [" "] * (MAX_TEXT_COLUMNS + 1)
        spans = [(s.start_s, s.end_s, s.kind) for s in r.slots]
        spans += [(a, b, TEXT_MARKS[name]) for name, span in (("sync", r.sync), ("optimizer", r.optimizer))
                  if span for a, b in (span,)]
        for start, end, mark in spans:
            for c in range(int(start * scale), max(int(start * scale) + 1, int(end * scale))):
                cells[min(c, MAX_TEXT_COLUMNS)] = mark
        lines.append(f"{_label(plan, r):<{width}}|{''.join(cells)}|")
    lines += _memory_lines(plan)
    return "\n".join(lines)


def _memory_lines(plan: Plan) -> list[str]:
    if not (plan.predicted and plan.predicted.peak_memory_bytes_per_device):
        return []
    mem, cap = plan.predicted.peak_memory_bytes_per_device, plan.predicted.capacity_bytes_per_device
    cells = []
    for r in timeline_rows(plan):
        stage = plan.pipelines[r.pipeline].stages[r.stage]
        key = f"{stage.node}:{stage.devices[0]}"
        used = f"{mem.get(key, 0) / 1e9:.1f}"
        cells.append(f"p{r.pipeline}s{r.stage}={used}" + (f"/{cap[key] / 1e9:.1f}" if key in cap else ""))
    return ["peak memory per stage (GB" + (" used/usable" if cap else "") + "): " + ", ".join(cells)]


def slice_note(plan: Plan, k: int, j: int, model=None) -> str:
    """Under uneven slices (Stage.slice_weight), the share of its parameters' optimizer state stage j of
    pipeline k keeps, e.g. ", keeps 25% (uneven slices)"; "" under equal slices."""
    if equal_slices(plan) or len(plan.pipelines) < 2:
        return ""
    return f", keeps {1 / shard_ways(plan, k, j, model):.0%} (uneven slices)"


def device_colors(plan: Plan) -> dict[str, str]:
    types = list(dict.fromkeys(s.device_type for p in plan.pipelines for s in p.stages))
    return {t: PALETTE[i % len(PALETTE)] for i, t in enumerate(types)}


KIND_STYLE = {"F": {"alpha": 0.45}, "B": {"alpha": 1.0}, "W": {"alpha": 0.8, "hatch": "////"}}
KIND_NAMES = {"F": "forward", "B": "backward", "W": "weight gradients"}


def _draw_timeline(ax, plan: Plan, rows: list[Row], colors: dict[str, str]) -> None:
    label_slots = max(len(r.slots) for r in rows) <= 48
    for y, r in enumerate(rows):
        color = colors[plan.pipelines[r.pipeline].stages[r.stage].device_type]
        for s in r.slots:
            ax.barh(y, s.end_s - s.start_s, left=s.start_s, height=0.8, color=color, edgecolor="white",
                    linewidth=0.4, **KIND_STYLE[s.kind])
            if label_slots:
                ax.text((s.start_s + s.end_s) / 2, y, str(s.microbatch), ha="center", va="center", fontsize=6)
        for span, c in ((r.sync, SYNC_COLOR), (r.optimizer, OPTIMIZER_COLOR)):
            if span:
                ax.barh(y, span[1] - span[0], left=span[0], height=0.8, color=c, edgecolor="white", linewidth=0.4)
    for y, (a, b) in enumerate(zip(rows, rows[1:]), start=1):
        if a.pipeline != b.pipeline:
            ax.axhline(y - 0.5, color="black", linewidth=0.6)
    if plan.predicted and in_seconds(plan):
        ax.axvline(plan.predicted.iteration_time_s, color="black", linestyle="--", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [_label(plan, r) for r in rows], fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, _horizon(rows) * 1.01)
    ax.set_xlabel("seconds (predicted)" if in_seconds(plan) else "time (relative: the plan records no durations)")
    ax.grid(axis="x", linewidth=0.3, alpha=0.5)


def _draw_memory(bx, plan: Plan, rows: list[Row], colors: dict[str, str]) -> None:
    mem = plan.predicted.peak_memory_bytes_per_device if plan.predicted else {}
    cap = plan.predicted.capacity_bytes_per_device if plan.predicted else {}
    top = 0.0
    for y, r in enumerate(rows):
        stage = plan.pipelines[r.pipeline].stages[r.stage]
        key = f"{stage.node}:{stage.devices[0]}"
        used, usable = mem.get(key, 0) / 1e9, cap.get(key, 0) / 1e9
        if usable:
            bx.barh(y, usable, height=0.8, color="#eeeeee", edgecolor="#999999", linewidth=0.5)
            bx.plot([usable, usable], [y - 0.45, y + 0.45], color="black", linewidth=1.5)
        bx.barh(y, used, height=0.5, color=colors[stage.device_type])
        bx.text(max(used, usable), y, f" {used:.1f}" + (f"/{usable:.0f}" if usable else ""), va="center",
                fontsize=6)
        top = max(top, used, usable)
    bx.set_ylim(len(rows) - 0.5, -0.5)
    bx.set_yticks([])
    bx.set_xlim(0, top * 1.25 or 1)
    bx.set_xlabel("peak memory per GPU, GB\n(bar: predicted; box, black mark: usable capacity)", fontsize=8)


def _legend(ax, colors: dict[str, str]) -> None:
    from matplotlib.patches import Patch  # lazy: matplotlib, for a drawing only
    handles = [Patch(color=c, label=t) for t, c in colors.items()]
    handles += [Patch(facecolor="#555555", label=KIND_NAMES[k], **KIND_STYLE[k]) for k in KIND_STYLE]
    handles += [Patch(color=SYNC_COLOR, label="gradient sync (exposed)"), Patch(color=OPTIMIZER_COLOR,
                                                                               label="optimizer")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12 - 1.2 / (3 + ax.get_ylim()[0])),
              ncol=min(len(handles), 9), fontsize=7, frameon=False)


def draw_plan(plan: Plan, path: str) -> None:
    import matplotlib  # lazy: matplotlib, for a drawing only
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib, for a drawing only
    rows, colors = timeline_rows(plan), device_colors(plan)
    height = 1.9 + 0.32 * len(rows)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(16, height), gridspec_kw={"width_ratios": [4, 1]}, sharey=False)
    _draw_timeline(ax, plan, rows, colors)
    _draw_memory(bx, plan, rows, colors)
    title = f"{plan.model} on {plan.cluster or 'cluster'}: {plan.num_devices} GPUs, " \
        f"{plural(len(plan.pipelines), 'pipeline')}, global batch {plan.global_batch}, micro-batch {_sizes(plan)}, " \
        f"{plan.schedule}"
    if plan.predicted:
        title += (f"\npredicted {seconds(plan.predicted.iteration_time_s)}/iteration (dashed), "
                  f"{plan.predicted.samples_per_s:.1f} samples/s [{plan.predicted.profile_kind} profile"
                  f"{', ' + plan.predicted.dtype if plan.predicted.dtype else ''}]")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    _legend(ax, colors)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)
