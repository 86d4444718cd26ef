"""The live job the controller drives (orchestrate/controller.py): the workers of its current plan, a training
step, and its checkpoints.

Elastic jobs snapshot every step into node stores (commit of step N while step N+1 computes) and into the
storage every `checkpoint_every` steps; plain jobs write every `checkpoint_every` steps (and the final step)
straight to the storage.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import replace

import ray

from autohet_ray.cluster.live import describe, without_nodes
from autohet_ray.cluster.spec import cluster_from_dict
from autohet_ray.elastic.keeper import keeper_specs
from autohet_ray.elastic.recovery import LiveRecovery
from autohet_ray.elastic.restore import restore_newest
from autohet_ray.elastic.snapshots import configure_snapshots
from autohet_ray.emulate.pacer import rank_pacers
from autohet_ray.job.config import TrainJob
from autohet_ray.job.plan_ahead import start_planning_ahead
from autohet_ray.job.plan_choice import choose_plan
from autohet_ray.metrics.step import step_metrics
from autohet_ray.model.spec import model_from_dict
from autohet_ray.orchestrate.discovery import confirm_nodes, discover
from autohet_ray.orchestrate.worker_group import GroupFailure, WorkerGroup, kill_actors
from autohet_ray.plan.schema import plan_summary
from autohet_ray.recovery.report import report_failure
from autohet_ray.storage import job_files
from autohet_ray.storage.spec import location
from autohet_ray.storage.sweep import StorageSweeper


class LiveJob:
    def __init__(self, job: TrainJob, *, job_id: str | None = None, profile=None):
        """`job_id`/`profile`: those of a job resumed from its storage (default: a new job, profiled anew)."""
        self.job, self.job_id, self.profile = job, job_id or uuid.uuid4().hex[:12], profile
        self.model = model_from_dict(job.model)
        self.priced_model = model_from_dict(job.priced_as) if job.priced_as else self.model
        self.seq_len = job.seq_len or self.model.max_seq_len
        self.priced_seq_len = job.priced_seq_len or self.seq_len
        self.base_cluster = cluster_from_dict(job.cluster)
        self.found = self.plan = self.evaluation = self.plan_source = self.group = self.committer = None
        self.data = self.dataset_hold = self.metrics_log = self.tracking = None
        self.baselines: dict[str, float] = {}
        self.keeper_specs: dict[str, dict] = {}
        self.recovery = LiveRecovery(max_recoveries=job.max_recoveries, window_steps=job.recovery_window_steps)
        self.step_index = 0                  # completed optimizer steps of the live group
        self.history: list[dict] = []
        self.snapped: set[int] = set()       # steps the live group snapshotted
        self.inflight: list = []             # the running train_step calls (empty between steps)
        self.snapshots = True                # benchmarks toggle it to measure the snapshot cost
        self.plan_cache: dict[str, dict] = {}   # availability state (live nodes' GPUs) -> {"plan": the planner's}
        self.planning_ahead = None           # the PlanAhead thread of the states one loss away (elastic jobs)
        self.time_scale = 0.0                # the emulated clock's scale, once the first launch fixed it
        self.started_at = time.time()        # temporaries in the storage older than this are a dead writer's
        self.sweeper: StorageSweeper | None = None

    def discover(self, *, confirm: bool = False):
        """The live nodes of the cluster file, less those lost, draining or refusing connections; with
        `confirm`, each node's GPU type is confirmed by a task on it."""
        usable = self.recovery.usable_nodes()
        missing = self.recovery.dead_nodes(self.base_cluster, usable)
        if missing and confirm and not self.job.elastic:   # a plain job runs on the file's nodes, all of them
            discover(self.base_cluster, usable)            # the ConfigError naming what Ray has instead
        cluster = without_nodes(self.base_cluster, missing)
        prefer = frozenset(self.found.node_ids.values()) if self.found is not None else frozenset()
        found = discover(cluster, usable, prefer)
        return describe(cluster, confirm_nodes(list(found.nodes)), prefer) if confirm else found

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
        report = {"replan_s": t1 - t0, "restart_s": t2 - t1, "plan": plan_summary(self.plan),
                  "plan_source": self.plan_source, **paced,
                  **{f"restart_{k}": v for k, v in setup.items() if k != "setup_s"},
                  "num_ranks": len(self.group.actors), "reused_actors": self.group.num_reused,
                  "predicted_iteration_s": self.evaluation.iteration_time_s}
        return report | self.resume_on_group(restore)

    def resume_on_group(self, restore: str | None) -> dict:
        """On the group just set up: restore (as `restore` says) or load the job's start, configure snapshots,
        plan ahead; the rest of the launch report. step_index changes only once the restore succeeded (a loss
        during it is recovered from the steps completed before)."""
        report, self.snapped = {}, set()
        if restore:
            report |= self.recovery.wait_stage_in(self.committer, self.job.setup_timeout_s)
            report |= restore_newest(self.group, self.committer, self.keeper_specs, self.job.storage, restore,
                                     self.job.setup_timeout_s)
            self.step_index = report["restored_step"]
            self.data.check(report.pop("recorded"), self.step_index)
            self.committer.note_restored(self.step_index)
        else:
            self.step_index = 0
            if self.job.init_from:              # step 0 of a job that starts from a Hugging Face checkpoint
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

    def executed_plan(self, plan=None):
        """The plan the workers execute: the priced plan (default: self.plan) on the model that runs."""
        return replace(plan or self.plan, model=self.model.name, model_spec=self.model.to_dict(), seq_len=self.seq_len)

    def _pacers(self) -> tuple[list[dict] | None, dict]:
        """Per rank, the emulated clock of the plan's devices (None when the job is not paced); the scale is
        fixed at the first launch, so re-plans keep one clock."""
        if not self.job.paced:
            return None, {}
        pacers, self.time_scale = rank_pacers(
            self.plan, self.found.cluster, self.priced_model, self.profile, self.evaluation,
            time_scale=self.time_scale or self.job.time_scale, iteration_wall_s=self.job.iteration_wall_s)
        return pacers, {"time_scale": self.time_scale}

    def configure_snapshots(self) -> None:
        configure_snapshots(self.group, self.keeper_specs, self.job.storage,
                            node_gpu={n.name: n.device_type for n in self.found.nodes},
                            num_peers=self.job.num_peers, storage_every=self.job.checkpoint_every)

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
        return self.snapshots if self.job.elastic else self._is_storage_step(step)

    def _commit_previous(self, step: int) -> None:
        """Commit the snapshot of `step` (taken after it) while the next step computes."""
        if step not in self.snapped or step in self.committer.committed:
            return
        self._commit(step, self.group.call("fast_records", step, timeout_s=120))
        self.committer.poll_storage()

    def _commit(self, step: int, records: list[list]) -> None:
        """The node-store commit of `step` (plain jobs: the storage commit); an elastic job's storage step also
        starts its uploads. Old steps are collected after every commit, whichever path made it (a flush too:
        a job that flushed every `gc_every`-th step never collected, and its node stores and storage grew by a
        step each step)."""
        self.committer.commit_fast(step, records)
        if self.job.elastic and self._is_storage_step(step):
            self.committer.add_storage(step, [a.storage_records.remote(step) for a in self.group.actors])
        self.committer.maybe_collect(step)

    def _is_storage_step(self, step: int) -> bool:
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
        if self.tracking is not None:
            self.tracking.step(metrics)
        return metrics

    def flush(self, timeout_s: float = 600.0, *, wait_storage: bool = True) -> dict:
        """Commit the newest completed step everywhere (a spot notice, a re-plan, or before stopping): its
        snapshot (taken now when it had none), the node-store commit, then (`wait_storage`) every pending
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
        committer.poll_storage(wait=wait_storage, timeout_s=timeout_s)
        return {"committed": committer.committed[-1:], "storage_committed": committer.storage_committed[-1:]}

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
        if newest is not None and newest not in self.committer.storage_committed:
            self.committer.promote(newest, timeout_s)
        return {"step": newest, "where": location(self.job.storage, "")}
