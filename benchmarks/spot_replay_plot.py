"""The spot replay's PNG timeline (benchmarks/spot_replay.py): GPUs alive per type, and the ideal and achieved
samples/s of each system."""
from __future__ import annotations

import pathlib


def plot(path: str, timeline, series: dict, gpus_per_node) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    hours = lambda ts: [t / 3600 for t in ts]  # noqa: E731
    segs = timeline.segments()
    starts = hours([a for a, _, _ in segs]) + [timeline.window_s / 3600]
    for i, pool in enumerate(timeline.pools):
        gpus = [s[i] * gpus_per_node[i] for _, _, s in segs]
        on_demand = pool in series["on_demand"]
        top.step(starts, gpus + gpus[-1:], where="post", ls="--" if on_demand else "-", lw=2 if on_demand else 1,
                 label=f"{pool} ({'on demand' if on_demand else series['traces'][pool]})")
    top.set_ylabel("GPUs alive")
    top.legend(loc="lower left", ncol=2, fontsize=8)
    ideal = series["ideal"]
    bottom.step(starts, ideal + ideal[-1:], where="post", color="black", label="ideal (best plan for what is alive)")
    labels = {"ours": "ours (running)", "checkpoint_restart": "checkpoint-restart (running; work since its "
              "newest checkpoint is lost at each restart)", "no_replan": "no re-planning (running)"}
    for name, style in (("checkpoint_restart", "tab:red"), ("no_replan", "tab:gray"), ("ours", "tab:green")):
        xs, ys = [], []
        for a, b, r in series["achieved"][name]:
            xs += [a / 3600, a / 3600, b / 3600, b / 3600]
            ys += [0, r, r, 0]
        bottom.plot(xs, ys, color=style, lw=0.8, label=labels[name])
    bottom.set_ylabel("samples/s (cost model)")
    bottom.set_xlabel("hours")
    bottom.legend(loc="lower left", fontsize=8)
    fig.suptitle("Simulated spot replay (analytic profile: cost-model predictions)")
    fig.tight_layout()
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
