"""Recovery phases of a simulated event: detect, re-plan, restart workers, restore state, warm-up.

Fixed phases (detect, restart) come from a recovery measurement (benchmarks/recovery_bench.py's JSON line),
or from the stated defaults below; the restore scales with the bytes a node must read at a stated bandwidth;
re-planning is the planner's measured wall time, passed in; warm-up is a stated number of iterations of the
new plan. Every value carries its basis, which the replay prints.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field, replace

from autohet_ray import ConfigError

GB = 1e9

# Checkpointed training state per parameter: fp32 master weights + two fp32 AdamW moments (the bf16 weights
# are derived from the master copy), as the checkpoint tiers store it.
CHECKPOINT_BYTES_PER_PARAM = 12


@dataclass(frozen=True, kw_only=True)
class PhaseModel:
    detect_s: float                 # unannounced loss -> verdict (liveness probes + loss grace)
    restart_s: float                # stop survivors, start/reconfigure workers and process groups on the new plan
    local_Bps: float                # per-node read of its chunks from its own store or a peer's (bytes/s)
    cloud_Bps: float                # per-node download from cloud storage (bytes/s)
    cloud_upload_Bps: float         # per-node upload to cloud storage (bytes/s): periodic checkpoints
    warmup_iterations: float        # what the first step costs beyond a normal one, in iterations of the new plan
    switch_s: float | None = None   # plan-ahead: the switch onto workers started ahead (None: as restart_s)
    basis: dict[str, str] = field(default_factory=dict)

    @property
    def switch(self) -> float:
        """Seconds of a plan-ahead switch: switch_s, or the restart when none is given."""
        return self.restart_s if self.switch_s is None else self.switch_s

    def restore_s(self, bytes_per_node: float, tier: str) -> float:
        assert tier in ("local", "cloud"), tier
        return bytes_per_node / (self.local_Bps if tier == "local" else self.cloud_Bps)

    def phases(self, *, detect: bool, replan_s: float, bytes_per_node: float, tier: str,
               iteration_s: float, restart: bool = True) -> dict[str, float]:
        """Seconds of each phase; `detect` False for a planned change (a join, or a removal with notice)."""
        out = {"detect_s": self.detect_s if detect else 0.0, "replan_s": replan_s,
               "restart_s": self.restart_s if restart else 0.0,
               "restore_s": self.restore_s(bytes_per_node, tier),
               "warmup_s": self.warmup_iterations * iteration_s}
        out["total_s"] = sum(out.values())
        return out


DEFAULT_PHASES = PhaseModel(
    detect_s=3.0, restart_s=30.0, local_Bps=50 * GB, cloud_Bps=25 * GB / 8, cloud_upload_Bps=25 * GB / 8,
    warmup_iterations=1.0,
    basis={
        "detect_s": "assumed: the controller's default --loss-grace-s 3 (a silent node is declared lost after 3 s)",
        "restart_s": "assumed: 30 s to stop survivors, start workers and build NCCL groups at ~1000 ranks",
        "local_Bps": "assumed: every byte a node needs read from a peer over a 400 Gb/s NIC (50 GB/s); reads "
                     "from the node's own RAM store are faster",
        "cloud_Bps": "assumed: 25 Gb/s (3.1 GB/s) per node from S3 (a fleet restoring at once shares the "
                     "bucket's request rate; single instances reach up to 100 Gb/s)",
        "cloud_upload_Bps": "assumed: 25 Gb/s (3.1 GB/s) per node to S3",
        "warmup_iterations": "assumed: the first step after a restart costs one extra iteration",
        "switch_s": "= restart_s (plan-ahead only): the switch onto workers started ahead still rebuilds the "
                    "process groups over every rank, every process already running, as a recovery that keeps the "
                    "survivors' processes does; no measurement at ~1000 ranks separates the two",
    })


def last_json_line(path: str) -> dict:
    """The last line of a benchmark's output that holds a JSON object (every benchmark ends with one)."""
    with open(path) as f:
        lines = [ln for ln in f.read().splitlines() if ln.strip().startswith("{")]
    return json.loads(lines[-1])


def phases_from_recovery_bench(path: str, base: PhaseModel = DEFAULT_PHASES) -> PhaseModel:
    """Detect from a recovery_bench.py JSON line (its local-first recovery), the rest from `base`: detection
    does not scale with the model or the cluster; the restore scales with bytes (priced by bandwidth) and the
    restart with ranks (a 3-rank CPU run says little about 1000 GPUs: it is quoted in the basis only)."""
    try:
        measured = last_json_line(path)["local_first"]["phases"]
    except (OSError, IndexError, KeyError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: not a recovery_bench.py result with local_first.phases ({err})") from None
    detect, restart = float(measured["detect_s"]), float(measured.get("restart_s", 0.0))
    basis = dict(base.basis) | {
        "detect_s": f"measured by recovery_bench.py ({path}): detect_s {detect:.3f}",
        "restart_s": base.basis.get("restart_s", "") + f"; recovery_bench.py measured {restart:.3f} s for 3 "
                     "CPU ranks, which does not carry over to ~1000 GPU ranks",
    }
    return replace(base, detect_s=detect, basis=basis)


def phases_from_emulated_replay(path: str, base: PhaseModel = DEFAULT_PHASES) -> PhaseModel:
    """Detect and restart from an emulated replay's JSON line (benchmarks/spot_replay_emulated.py): detect is
    the median over its unannounced losses; restart the largest of the per-kind medians (joins start new
    workers, recoveries reuse the survivors': one restart figure serves both here, so the dearer one);
    restore, re-plan and warm-up stay priced as in `base` (they scale with bytes, with the cluster's planner
    time and with the plan)."""
    try:
        phases = last_json_line(path)["phases"]
        by_kind: dict[str, list[float]] = {}
        for p in phases:
            by_kind.setdefault(str(p["kind"]), []).append(float(p["restart_s"]))
        detects = [float(p["detect_s"]) for p in phases if p["kind"] == "recovery"]
    except (OSError, IndexError, KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"{path}: not a spot_replay_emulated.py result with per-change phases ({err})") from None
    if not by_kind:
        raise ConfigError(f"{path}: the emulated replay recorded no changes")
    medians = {kind: statistics.median(xs) for kind, xs in sorted(by_kind.items())}
    kind = max(medians, key=medians.get)
    basis = dict(base.basis)
    basis["restart_s"] = (f"measured: the emulated replay's ({path}) median restart per kind of change "
                          f"({', '.join(f'{k} {v:.2f} s over {len(by_kind[k])}' for k, v in medians.items())}), "
                          f"the largest ({kind}); on emulated single-GPU nodes of one machine (CPU compute, gloo): "
                          "process groups of ~1000 GPU ranks may take longer, see restart_s_for_goodput_0.90")
    detect = base.detect_s
    if detects:
        detect = statistics.median(detects)
        basis["detect_s"] = (f"measured: median over the {len(detects)} unannounced losses of the emulated replay "
                             f"({path}): {detect:.2f} s")
    return replace(base, detect_s=detect, restart_s=medians[kind], basis=basis)


def restart_from_fit(fit_report: dict, ranks: int, process_start_s: float) -> tuple[float, str]:
    """The restart phase at `ranks` from benchmarks/restart_scaling.py's fits (its JSON line, parsed): process
    groups created by their members only, engine build and state load, each fitted phase evaluated at `ranks`,
    plus `process_start_s` (stated: the fit reuses running processes and does not time starting them). (seconds,
    basis)."""
    fits = fit_report.get("fits") or {}
    phases = ("groups_members_only_s", "engine_s", "state_s")
    missing = [p for p in phases if p not in fits]
    if missing:
        raise ConfigError(f"restart fit: the report has no fit of {missing}; rerun benchmarks/restart_scaling.py")
    parts = {p: _fitted(fits[p], ranks) for p in phases}
    sizes = [row["ranks"] for row in fit_report.get("rows", [])]
    basis = (f"fitted (benchmarks/restart_scaling.py, measured at {sizes} ranks on one host, extrapolated to "
             f"{ranks}): " + ", ".join(f"{p.removesuffix('_s')} {fits[p]['form']} {v:.2f} s" for p, v in parts.items())
             + f"; + {process_start_s:g} s stated for starting a replacement's processes (not measured at scale)")
    return sum(parts.values()) + process_start_s, basis


def _fitted(fit: dict, ranks: int) -> float:
    if fit["form"] == "linear":
        return max(0.0, fit["linear"]["a"] + fit["linear"]["b"] * ranks)
    return fit["power"]["c"] * ranks ** fit["power"]["k"]
