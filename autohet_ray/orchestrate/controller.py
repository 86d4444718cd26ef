"""The one controller of every training job, elastic or not, from every entry point.

    ctl = Controller(job)                  # job: TrainJob (plain data)
    ctl.start()                            # discover, profile once, plan, node stores, workers
    for _ in range(n): ctl.step()          # a lost node inside step() is recovered (elastic.recovery)
    ctl.close()                            # the newest committed step reaches the storage, then stores go

States: new -> running -> recovering -> replanning -> running ... -> closed.
Elastic jobs snapshot every step into node stores (commit of step N while step N+1 computes) and into the
storage every `checkpoint_every` steps; plain jobs write every `checkpoint_every` steps (and the final step)
straight to the storage. `close()` is the exit path of every ending: a normal end, SIGINT/SIGTERM, an
exception; it never removes a node store before the newest committed step is safe in the storage.
"""
from __future__ import annotations

import json
import sys
import time
import uuid
from dataclasses import replace

import ray

from autohet_ray.cluster.live import describe, without_nodes
from autohet_ray.cluster.spec import cluster_from_dict
from autohet_ray.data.training import TrainingData
from autohet_ray.elastic import recovery
from autohet_ray.elastic.budget import RecoveryBudget
from autohet_ray.elastic.commit import Committer
from autohet_ray.elastic.keeper import keeper_specs, stop_keeper
from autohet_ray.elastic.report import report_failure
from autohet_ray.elastic.restore import restore_newest
from autohet_ray.elastic.snapshots import configure_snapshots
from autohet_ray.job.config import TrainJob
from autohet_ray.job.plan_ahead import start_planning_ahead
from autohet_ray.job.plan_choice import choose_plan
from autohet_ray.metrics.step import step_metrics
from autohet_ray.model.spec import model_from_dict
from autohet_ray.orchestrate.data_prepare import held_dataset
from autohet_ray.orchestrate.discovery import confirm_nodes, discover
from autohet_ray.orchestrate.stopping import not_in_storage_message, secure_nodes_first
from autohet_ray.orchestrate.worker_group import GroupFailure, WorkerGroup, kill_actors
from autohet_ray.storage import job_files
from autohet_ray.storage.spec import location
from autohet_ray.storage.sweep import StorageSweeper, sweep_or_warn


class Controller:
    def __init__(self, job: TrainJob, *, job_id: str | None = None, profile=None):
        """`job_id`/`profile`: those of a job resumed from its storage (default: a new job, profiled anew)."""
        self.job, self.job_id, self.profile = job, job_id or uuid.uuid4().hex[:12], profile
        self.model = model_from_dict(job.model)
        self.priced_model = model_from_dict(job.priced_as) if job.priced_as else self.model
        self.seq_len = job.seq_len or self.model.max_seq_len
        self.priced_seq_len = job.priced_seq_len or self.seq_len
        self.base_cluster = cluster_from_dict(job.cluster)
        self.state = "new"
        self.found = self.plan = self.evaluation = self.plan_source = self.group = self.committer = None
        self.data = self.metrics_log = self.tensorboard_log = self.board = None
        self.watching = False
        self.baselines: dict[str, float] = {}
        self.keeper_specs: dict[str, dict] = {}
        self.lost: list[str] = []
        self.draining: set[str] = set()      # ids of nodes with a spot notice or a Ray drain: planned around
        self.gone: set[str] = set()          # ids of nodes confirmed lost before Ray's health checks said so
        self.step_index = 0                  # completed optimizer steps of the live group
        self.history: list[dict] = []
        self.recoveries: list[dict] = []
        self.budget = RecoveryBudget(job.max_recoveries, job.recovery_window_steps)
        self.target_steps: int | None = None   # the step the caller trains to (named in the resume command)
        self.fault_at: float | None = None
        self.snapped: set[int] = set()       # steps the live group snapshotted
        self.inflight: list = []             # the running train_step calls (empty between steps)
        self.snapshots = True                # benchmarks toggle it to measure the snapshot cost
        self.restore_mode = "local_first"    # how recovery restores ("cloud_only": the baseline)
        self.plan_cache: dict[str, dict] = {}   # availability state (live nodes' GPUs) -> {"plan": the planner's}
        self.planning_ahead = None           # the PlanAhead thread of the states one loss away (elastic jobs)
        self.staging: list = []              # copies toward the next plan's nodes, started at a loss (recovery)
        self.time_scale = 0.0                # the emulated clock's scale, once the first launch fixed it
        self.started_at = time.time()        # temporaries in the storage older than this are a dead writer's
        self.sweeper: StorageSweeper | None = None

    # -- setup ---------------------------------------------------------------------------------------------
    def start(self, *, restore: str | None = None) -> dict:
        """Discover, profile once, start node stores, plan, place and (with restore='cloud_only' or
        'local_first') load the newest committed step. Returns the launch report."""
        from autohet_ray.elastic.spot import draining_nodes
        assert self.state == "new", self.state
        self.draining = set(draining_nodes())
        self.found = self.discover(confirm=True)
        if self.profile is None:
            from autohet_ray.orchestrate.profiling import job_profile
            self.profile = job_profile(self.job, found=self.found, priced_model=self.priced_model,
                                       cluster=self.base_cluster, seq_len=self.priced_seq_len)
        data, self.dataset_hold = held_dataset(self.job.data, (self.job.storage or {}).get("endpoint_url"),
                                               cache_gb=self.job.dataset_cache_gb)
        self.data = TrainingData(data=data, model=self.model, global_batch=self.job.global_batch,
                                 seq_len=self.seq_len, seed=self.job.seed)
        if self.job.storage:
            self._record_job()
            self.sweeper = StorageSweeper(self.job.storage, self.started_at)
            sweep_or_warn(self.sweeper.at_start, self.job.storage, "start")
            if self.job.elastic:
                self.start_keepers()
            self.committer = Committer(keeper_specs=self.keeper_specs, cloud_spec=self.job.storage,
                                       extra={"job_id": self.job_id}, gc_every=self.job.gc_every,
                                       control_timeout_s=self.job.control_timeout_s)
            self.committer.step_extra = self.data.state
            self.metrics_log = job_files.LineLog(self.job.storage, job_files.METRICS_FILE)
        if self.job.tensorboard:
            from autohet_ray.metrics.tensorboard import TensorBoardLog
            self.tensorboard_log = TensorBoardLog(self.job.tensorboard)
        report = self.launch(restore)
        self.state = "running"
        return report

    def discover(self, *, confirm: bool = False):
        """The live nodes of the cluster file, less those lost, draining or refusing connections; with
        `confirm`, each node's GPU type is confirmed by a task on it."""
        usable = recovery.usable_nodes(self)
        missing = recovery.dead_nodes(self, usable)
        if missing and confirm and not self.job.elastic:   # a plain job runs on the file's nodes, all of them
            discover(self.base_cluster, usable)            # the ConfigError naming what Ray has instead
        cluster = without_nodes(self.base_cluster, missing)
        found = discover(cluster, usable)
        return describe(cluster, confirm_nodes(list(found.nodes))) if confirm else found

    def _record_job(self) -> None:
        """The job id, its config and its profile, in the storage (for resume and every re-plan)."""
        storage = self.job.storage
        job_files.write_text(storage, job_files.JOB_FILE,
                               json.dumps({"job_id": self.job_id, "job": self.job.to_dict()}, indent=1))
        job_files.write_text(storage, job_files.PROFILE_FILE, json.dumps(self.profile.to_dict()))

    def start_keepers(self) -> None:
        """A node store (and its keeper) of this job on every live node that has none yet."""
        missing = {n.name: n.node_id for n in self.found.nodes if n.name not in self.keeper_specs}
        for name, spec in keeper_specs(self.job_id, missing).items():
            if self.committer is None:
                self.keeper_specs[name] = spec
            else:
                self.committer.add_keeper(name, spec)

    def launch(self, restore: str | None, reuse: dict[str, list] | None = None, plan: dict | None = None) -> dict:
        """Plan on self.found, start the workers, optionally restore, configure snapshots; phase seconds."""
        t0 = time.perf_counter()
        reuse = reuse if reuse is not None else {}
        try:
            self.plan = self._choose_plan(plan)
        except BaseException:                     # no group takes the salvaged workers: they must not linger
            kill_actors([a for actors in reuse.values() for a in actors])
            raise
        t1 = time.perf_counter()
        self.group = WorkerGroup(self.executed_plan(), self.found.node_ids, reuse=reuse,
                                 loss_grace_s=self.job.loss_grace_s)
        kill_actors([a for actors in reuse.values() for a in actors])
        pacers, paced = self._pacers()
        setup = self.group.setup(model_spec=self.model.to_dict(), seed=self.job.seed,
                                 optimizer=self.job.optimizer.to_dict(),
                                 dtype=self.job.dtype, collective_timeout_s=self.job.collective_timeout_s,
                                 timeout_s=self.job.setup_timeout_s, pacers=pacers)
        t2 = time.perf_counter()
        report = {"replan_s": t1 - t0, "restart_s": t2 - t1, "plan": recovery.plan_summary(self.plan),
                  "plan_source": self.plan_source, **paced,
                  **{f"restart_{k}": v for k, v in setup.items() if k != "setup_s"},
                  "num_ranks": len(self.group.actors), "reused_actors": self.group.num_reused,
                  "predicted_iteration_s": self.evaluation.iteration_time_s}
        self.step_index, self.snapped = 0, set()
        if restore:
            report |= recovery.wait_stage_in(self, self.job.setup_timeout_s)
            report |= restore_newest(self.group, self.committer, self.keeper_specs, self.job.storage, restore,
                                     self.job.setup_timeout_s)
            self.step_index = report["restored_step"]
            self.data.check(report.pop("recorded"), self.step_index)
            self.committer.note_restored(self.step_index)
        elif self.job.init_from:              # step 0 of a job that starts from a Hugging Face checkpoint
            outs = self.group.call("load_hf", self.job.init_from, timeout_s=self.job.setup_timeout_s)
            report["init_from_bytes"] = sum(o["bytes_read"] for o in outs)
        if self.committer is not None:
            start = time.perf_counter()
            self.configure_snapshots()
            report["configure_snapshots_s"] = time.perf_counter() - start
            job_files.write_text(self.job.storage, job_files.PLAN_FILE, self.plan.to_json())
        if self.job.elastic:
            self.planning_ahead = start_planning_ahead(self.job, found=self.found, profile=self.profile,
                                                       priced_model=self.priced_model, seq_len=self.priced_seq_len,
                                                       cache=self.plan_cache)
        return report

    def _choose_plan(self, plan: dict | None):
        if self.planning_ahead is not None:   # the state it plans now is waited for, no other is started
            self.planning_ahead.stop()
        chosen, self.evaluation, baselines, self.plan_source = choose_plan(
            self.job, found=self.found, profile=self.profile, priced_model=self.priced_model,
            seq_len=self.priced_seq_len, plan=plan, first=self.plan is None, cache=self.plan_cache)
        if baselines is not None:
            self.baselines = baselines
        return chosen

    def executed_plan(self):
        """The plan the workers execute: the priced plan on the model (and sequence length) that runs."""
        return replace(self.plan, model=self.model.name, model_spec=self.model.to_dict(), seq_len=self.seq_len)

    def _pacers(self) -> tuple[list[dict] | None, dict]:
        """Per rank, the emulated clock of the plan's devices (None when the job is not paced); the scale is
        fixed at the first launch, so re-plans keep one clock."""
        from autohet_ray.emulate.pacer import rank_pacers
        if not self.job.paced:
            return None, {}
        pacers, self.time_scale = rank_pacers(
            self.plan, self.found.cluster, self.priced_model, self.profile, self.evaluation,
            time_scale=self.time_scale or self.job.time_scale, iteration_wall_s=self.job.iteration_wall_s)
        return pacers, {"time_scale": self.time_scale}

    def configure_snapshots(self) -> None:
        configure_snapshots(self.group, self.keeper_specs, self.job.storage,
                            node_gpu={n.name: n.device_type for n in self.found.nodes},
                            num_peers=self.job.num_peers, cloud_every=self.job.checkpoint_every)

    # -- training --------------------------------------------------------------------------------------------
    def step(self, fault_hook=None) -> dict:
        """One training step (and the commit of the previous snapshot meanwhile). A lost node or worker is
        recovered, as often as it happens, also during recovery; the metrics of the first completed step then
        carry the recovery report."""
        assert self.state == "running", self.state
        recovered = None
        while True:
            try:
                metrics = self._step_once(fault_hook)
                break
            except GroupFailure as failure:
                self.budget.charge(failure, self.step_index + 1)   # a failure that keeps coming back: stop
                fault_hook, self.state = None, "recovering"
                recovered = recovery.recover(self, failure, mode=self.restore_mode)
                self.state = "running"
        self.budget.progressed(self.step_index)
        if recovered is None:
            return metrics
        recovered["first_step_s"] = metrics["wall_s"]
        recovered["total_s"] = time.perf_counter() - recovered.pop("started_at")
        return {**metrics, "recovery": recovered}

    def _step_once(self, fault_hook=None) -> dict:
        group = self.group
        start = time.perf_counter()
        batch = ray.put(self.data.batch(self.step_index))
        snap = self.committer is not None and self._snapshot_due(self.step_index + 1)
        self.inflight = [a.train_step.remote(batch, snapshot=snap) for a in group.actors]
        if fault_hook is not None:
            fault_hook(self)
        self._commit_previous(self.step_index)
        outs = group.gather(self.inflight)
        self.inflight = []
        self.step_index += 1
        if snap:
            self.snapped.add(self.step_index)
        metrics = self._metrics(outs, time.perf_counter() - start)
        if self.job.eval_every and self.step_index % self.job.eval_every == 0:
            metrics["val_loss"] = self.evaluate()
        return self._record(metrics)

    def evaluate(self) -> float:
        """The validation loss of the current weights: the mean over the job's validation batches, each run
        forward only by every pipeline on its share, as a training step would."""
        losses = [self.group.call("eval_step", ray.put(batch))[0]["loss"]
                  for batch in self.data.validation(self.job.eval_batches)]
        return sum(losses) / len(losses)

    def _snapshot_due(self, step: int) -> bool:
        return self.snapshots if self.job.elastic else self._is_cloud_step(step)

    def _commit_previous(self, step: int) -> None:
        """Commit the snapshot of `step` (taken after it) while the next step computes."""
        if step not in self.snapped or step in self.committer.committed:
            return
        self._commit(step, self.group.call("fast_records", step, timeout_s=120))
        self.committer.poll_cloud()
        self.committer.maybe_collect(step)

    def _commit(self, step: int, records: list[list]) -> None:
        """The node-store commit of `step` (plain jobs: the storage commit); an elastic job's storage step also
        starts its uploads."""
        self.committer.commit_fast(step, records)
        if self.job.elastic and self._is_cloud_step(step):
            self.committer.add_cloud(step, [a.cloud_records.remote(step) for a in self.group.actors])

    def _is_cloud_step(self, step: int) -> bool:
        return bool(self.job.checkpoint_every) and step % self.job.checkpoint_every == 0

    def _metrics(self, outs: list[dict], wall: float) -> dict:
        return step_metrics(outs, wall, step=self.step_index, job=self.job, evaluation=self.evaluation,
                            profile_kind=self.profile.kind, time_scale=self.time_scale,
                            data_wait_s=self.data.waited_s(), plan=self.plan, device=self.found.cluster.device,
                            # the emulated clock runs the priced model: its FLOPs are the ones counted
                            spec=self.priced_model if self.job.paced else self.model,
                            seq_len=self.priced_seq_len if self.job.paced else self.seq_len)

    def _record(self, metrics: dict) -> dict:
        self.history.append(metrics)
        if self.metrics_log is not None:
            self.metrics_log.append(json.dumps(metrics))
        if self.tensorboard_log is not None:
            self.tensorboard_log.append(metrics)
        return metrics

    # -- checkpoints and exits -------------------------------------------------------------------------------
    def flush(self, timeout_s: float = 600.0, *, wait_cloud: bool = True) -> dict:
        """Commit the newest completed step everywhere (a spot notice, a re-plan, or before stopping): its
        snapshot (taken now when it had none), the node-store commit, then (`wait_cloud`) every pending
        storage upload."""
        step, committer = self.step_index, self.committer
        if committer is None:
            return {}
        if step != 0 and step not in committer.committed:
            if step not in self.snapped and not self.inflight:     # nothing ran since: the live state is `step`
                self.group.call("snapshot_now", timeout_s=timeout_s)
                self.snapped.add(step)
            if step in self.snapped:
                self._commit(step, self.group.call("fast_records", step, timeout_s=timeout_s))
        committer.poll_cloud(wait=wait_cloud, timeout_s=timeout_s)
        return {"committed": committer.committed[-1:], "cloud_committed": committer.cloud_committed[-1:]}

    def secure(self, timeout_s: float = 600.0) -> dict:
        """Get the newest committed step into the storage: flush what the live group can still commit, then
        copy the newest node-store step to the storage if it is not there yet. Returns {"step", "where"}."""
        if self.committer is None:
            return {"step": None, "where": None}
        if self.group is not None and self.group.actors:
            try:
                self.flush(timeout_s)
            except (GroupFailure, ray.exceptions.RayError) as err:   # the group is broken: keep what is committed
                report_failure(self.step_index, "commit of the newest step (the newest committed one is kept)",
                               None, err)
        newest = max(self.committer.committed, default=None)
        if newest is not None and newest not in self.committer.cloud_committed:
            self.committer.promote(newest, timeout_s)
        return {"step": newest, "where": location(self.job.storage, "")}

    def close(self, stopping: str | None = None) -> dict:
        """End the job (on every exit path): the newest committed step reaches the storage before any node
        store is removed; when it cannot, the node stores are kept and the message says where and how to
        resume. `stopping`: the signal that stops the job; the newest step is then first secured in the node
        stores, and where it is printed (orchestrate/stopping.py). Returns {"step", "where"} of the secured
        step, "completed" (the newest step the job reached), "in_storage" (whether the storage holds it) and
        "error" when securing failed."""
        if self.state == "closed":
            return {}
        if self.planning_ahead is not None:      # no new planning competes with securing the newest step
            self.planning_ahead.stop()
        if stopping and self.committer is not None and self.group is not None:
            secure_nodes_first(self, stopping)
        try:
            outcome = self.secure()
        except BaseException as err:            # noqa: BLE001 - whatever failed, the stores must be kept
            outcome = {"step": None, "error": f"{type(err).__name__}: {err}"}
        if self.committer is not None:
            outcome["completed"] = max(self.step_index, *self.committer.committed, 0)
            outcome["in_storage"] = outcome["completed"] in {0, *self.committer.cloud_committed}
        self.inflight = []
        if self.planning_ahead is not None:
            self.planning_ahead.wait(self.job.plan_time_limit_s + 10.0)
        if self.group is not None:
            self.group.kill(wait_s=10.0)          # before the stores go: a worker may still be writing one
            self.group = None
        if self.watching:
            from autohet_ray.elastic.spot import stop_watching
            stop_watching(self.job_id)
        if self.committer is not None:
            try:
                self.committer.close()
            except Exception as err:             # noqa: BLE001 - a failed collection of old steps loses nothing
                print(f"autohet: collecting old checkpoint steps failed: {err}", file=sys.stderr)
        if self.committer is not None:           # the storage was in use (a failed start touches nothing)
            sweep_or_warn(self.sweeper.at_close, self.job.storage, "close")
        if self.data is not None:
            self.data.close()
        if getattr(self, "dataset_hold", None) is not None:
            self.dataset_hold.release()            # the cache may evict the dataset once no job holds it
        if self.tensorboard_log is not None:
            self.tensorboard_log.close()
        if outcome.get("in_storage") is False:
            print(not_in_storage_message(self, outcome), file=sys.stderr, flush=True)
        if "error" not in outcome:               # else kept: the message above says where and how to resume
            dropped = self.committer.dropped.remaining() if self.committer else []
            for spec in [*self.keeper_specs.values(), *dropped]:
                stop_keeper(self.job_id, spec["node_id"])
        self.state = "closed"
        return outcome

    # -- events between steps ----------------------------------------------------------------------------------
    def watch_spot(self, **watcher_options):
        """Start a spot-notice watcher on every node of the job; the job's notice board."""
        from autohet_ray.elastic.spot import watch_nodes
        self.watching = True
        self.board = watch_nodes([n.node_id for n in self.found.nodes], job_id=self.job_id,
                                 **{"provider": self.job.spot_provider, "control_timeout_s": self.job.control_timeout_s,
                                    **watcher_options})
        return self.board

    def check_notices(self, board=None) -> dict | None:
        return recovery.check_notices(self, board if board is not None else self.board)

    def check_joins(self, plan: dict | None = None) -> dict | None:
        return recovery.check_joins(self, plan)

    def replan(self, **kwargs) -> dict:
        return recovery.replan(self, **kwargs)

    def mark_fault(self) -> None:
        """Tests and benchmarks note when they inject a failure (detection is timed from here)."""
        self.fault_at = time.perf_counter()

    def set_cloud_every(self, steps: int) -> None:
        """Change the storage cadence between steps (0: node stores only); the last step is flushed first."""
        assert self.state == "running", self.state
        self.flush()
        self.job = replace(self.job, checkpoint_every=steps)
        self.configure_snapshots()
