"""Experiment tracking: a run in TensorBoard, MLflow or Weights & Biases (the job's `tracking`). Each tracker
gets the resolved job as parameters, the plan and its predicted figures, every step's figures (loss, tokens/s,
step time and its measured parts, MFU per GPU type, ...: the numbers of its metrics.jsonl line), the recovery
events (a loss, a re-plan, a switch), and (MLflow) the committed checkpoint's manifest as an artifact.

Trackers run on a thread of their own, so a slow or vanished tracking server never holds a step; a tracker that
fails is logged once, as a warning, and dropped, and training goes on."""
from __future__ import annotations

import importlib
import json
import logging
import os
import queue
import threading
import time

from autohet_ray import ConfigError
from autohet_ray.metrics.tensorboard import TensorBoardLog, scalars_of

log = logging.getLogger(__name__)

TRACKERS = ("tensorboard", "mlflow", "wandb")
PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}
CLOSE_TIMEOUT_S = 30.0            # what closing waits for the trackers to send what they hold


def check_trackers(names, *, tensorboard: str | None) -> None:
    """ConfigError naming the tracker and its install command when one cannot run."""
    for name in names:
        if name not in TRACKERS:
            raise ConfigError(f"tracking: {name!r}; valid: {', '.join(TRACKERS)}")
        if name == "tensorboard" and tensorboard is None:
            raise ConfigError("tracking: tensorboard needs tensorboard: DIR (where its events go)")
        try:
            importlib.import_module(PACKAGES[name])
        except ImportError:
            raise ConfigError(f"tracking: {name} needs the {PACKAGES[name]} package: "
                              f"pip install 'autohet_ray[{name}]'") from None


def flat(doc: dict, prefix: str = "") -> dict[str, str]:
    """A nested mapping as {"a.b": "value"} (parameters of a tracker are flat text)."""
    out = {}
    for key, value in doc.items():
        if isinstance(value, dict) and value:
            out |= flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = json.dumps(value) if not isinstance(value, str) else value
    return out


def step_scalars(metrics: dict) -> dict[str, float]:
    """The numbers of a step's metrics line a tracker plots (per-type and per-device ones as "mfu/H100")."""
    out = scalars_of(metrics)
    for key in ("compute_s", "data_wait_s", "wall_s", "snapshot_copy_s", "snapshot_wait_s",
                "predicted_iteration_s", "overrun_s"):
        if isinstance(metrics.get(key), (int, float)):
            out[key] = float(metrics[key])
    return out


class _TensorBoard:
    def __init__(self, job: dict, job_id: str):
        self.log = TensorBoardLog(job["tensorboard"])

    def started(self, params: dict, plan: dict) -> None:
        self.log.writer.add_text("plan", json.dumps(plan))

    def step(self, metrics: dict) -> None:
        self.log.append(metrics)

    def event(self, kind: str, report: dict) -> None:
        self.log.writer.add_text(f"event/{kind}", json.dumps(report, default=str))

    def artifact(self, name: str, text: str) -> None:
        pass                          # TensorBoard keeps no files; the manifest stays in the storage

    def close(self) -> None:
        self.log.close()


class _MLflow:
    def __init__(self, job: dict, job_id: str):
        from mlflow.tracking import MlflowClient  # lazy: the optional mlflow package
        uri = job.get("mlflow_uri") or os.environ.get("MLFLOW_TRACKING_URI") or os.path.abspath("mlruns")
        if "://" not in uri:          # a directory: MLflow 3 keeps its file store only on this opt-in
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        project = job["tracking_project"]
        found = self.client.get_experiment_by_name(project)
        experiment = found.experiment_id if found else self.client.create_experiment(project)
        self.run_id = self.client.create_run(experiment, run_name=job_id, tags={"autohet.job_id": job_id}).info.run_id

    def started(self, params: dict, plan: dict) -> None:
        from mlflow.entities import Param  # lazy: the optional mlflow package
        items = [Param(k, v[:6000]) for k, v in flat(params).items()]
        for start in range(0, len(items), 100):           # MLflow takes at most 100 parameters per batch
            self.client.log_batch(self.run_id, params=items[start:start + 100])
        self.client.log_dict(self.run_id, plan, "plan.json")
        for key, value in (plan.get("predicted") or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.client.log_metric(self.run_id, f"predicted.{key}", float(value), step=0)

    def step(self, metrics: dict) -> None:
        from mlflow.entities import Metric  # lazy: the optional mlflow package
        now = int(time.time() * 1000)
        # "mfu.H20": a file store keeps "mfu" as a file, so "mfu/H20" cannot be a path under it
        self.client.log_batch(self.run_id, metrics=[Metric(k.replace("/", "."), v, now, metrics["step"])
                                                    for k, v in step_scalars(metrics).items()])

    def event(self, kind: str, report: dict) -> None:
        count = getattr(self, "events", 0) + 1
        self.events = count
        self.client.set_tag(self.run_id, f"event.{count}.{kind}", json.dumps(report, default=str)[:5000])

    def artifact(self, name: str, text: str) -> None:
        self.client.log_text(self.run_id, text, name)

    def close(self) -> None:
        self.client.set_terminated(self.run_id, "FINISHED")


class _WandB:
    def __init__(self, job: dict, job_id: str):
        import wandb  # lazy: the optional wandb package
        self.wandb = wandb
        self.run = wandb.init(project=job["tracking_project"], name=job_id, id=job_id, reinit="create_new")

    def started(self, params: dict, plan: dict) -> None:
        self.run.config.update(flat(params))
        self.run.summary.update({f"predicted/{k}": v for k, v in (plan.get("predicted") or {}).items()
                                 if isinstance(v, (int, float))})
        self.run.summary["plan"] = json.dumps(plan)

    def step(self, metrics: dict) -> None:
        self.run.log(step_scalars(metrics), step=metrics["step"])

    def event(self, kind: str, report: dict) -> None:
        self.run.tags = (*self.run.tags, kind)
        self.run.summary[f"event/{kind}"] = json.dumps(report, default=str)

    def artifact(self, name: str, text: str) -> None:
        self.run.summary[name] = text

    def close(self) -> None:
        self.run.finish()


KINDS = {"tensorboard": _TensorBoard, "mlflow": _MLflow, "wandb": _WandB}


class Tracking:
    """The job's trackers behind one queue and one thread. Every call returns at once; `close` waits up to
    CLOSE_TIMEOUT_S for what is queued."""

    def __init__(self, names, job: dict, job_id: str):
        self.trackers: dict[str, object] = {}
        self.queue: queue.Queue = queue.Queue()
        for name in names:
            self._call(name, lambda name=name: self.trackers.__setitem__(name, KINDS[name](job, job_id)))
        self.thread = threading.Thread(target=self._drain, name="autohet-tracking", daemon=True)
        self.thread.start()

    def started(self, params: dict, plan: dict) -> None:
        self.queue.put(("started", (params, plan)))

    def step(self, metrics: dict) -> None:
        self.queue.put(("step", (metrics,)))

    def event(self, kind: str, report: dict) -> None:
        self.queue.put(("event", (kind, report)))

    def artifact(self, name: str, text: str) -> None:
        self.queue.put(("artifact", (name, text)))

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        self.queue.put(("close", ()))
        self.queue.put(None)
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            log.warning("autohet: tracking: the trackers did not finish within %.0f s; what they still hold is "
                        "dropped", timeout_s)

    def _drain(self) -> None:
        while (item := self.queue.get()) is not None:
            method, args = item
            for name, tracker in list(self.trackers.items()):
                self._call(name, lambda: getattr(tracker, method)(*args))

    def _call(self, name: str, call) -> None:
        try:
            call()
        except Exception as err:       # noqa: BLE001 - a tracker never stops training: logged once, dropped
            self.trackers.pop(name, None)
            log.warning("autohet: tracking: %s failed (%s: %s); the run goes on without it", name,
                        type(err).__name__, str(err).splitlines()[0] if str(err) else "")


def start_tracking(job, job_id: str) -> Tracking | None:
    """The job's trackers (its `tracking`, and TensorBoard whenever it has a `tensorboard` directory)."""
    names = [*dict.fromkeys([*(["tensorboard"] if job.tensorboard else []), *job.tracking])]
    return Tracking(names, job.to_dict(), job_id) if names else None
