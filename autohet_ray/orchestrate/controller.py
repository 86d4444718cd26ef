"""The one controller of every training job, elastic or not, from every entry point (CLI, `ray job submit`,
a Python program):

    summary = Controller(job).run(steps)   # job: TrainJob (plain data); start, the loop, close

or step by step: `ctl.start()` (discover, profile once, plan, node stores, workers), `ctl.step()` (a lost node
inside it is recovered), `ctl.close()`.

The controller is a state machine: State, and TRANSITIONS, the only moves it makes (recovery/states.py).
Recovery decides what a failure, a spot notice or a joined node calls for (recovery/policy.py, decisions as
plain data); the controller carries each decision out, through the live job's workers and stores
(orchestrate/live_job.py). `close()` is the
exit path of every ending: a normal end, SIGINT/SIGTERM, an exception; it never removes a node store before the
newest committed step is safe in the storage.
"""
from __future__ import annotations

import logging
import signal
import time
from dataclasses import replace

import ray

from autohet_ray import ConfigError
from autohet_ray.checkpoint.keys import manifest_key
from autohet_ray.cluster.live import check_types
from autohet_ray.data.training import TrainingData
from autohet_ray.elastic.commit import Committer
from autohet_ray.elastic.keeper import stop_keeper
from autohet_ray.elastic.liveness import detect_failure
from autohet_ray.elastic.recovery import healthy
from autohet_ray.elastic.spot import draining_nodes, stop_watching, watch_nodes
from autohet_ray.job.config import TrainJob
from autohet_ray.job.notice_ahead import earliest_deadline, hand_over_wait_s, notice_ahead, switch_now
from autohet_ray.job.plan_choice import state_key
from autohet_ray.job.record import refuse_existing_job
from autohet_ray.metrics.step import run_figures
from autohet_ray.metrics.tracking import start_tracking
from autohet_ray.orchestrate import switch_ahead
from autohet_ray.orchestrate.discovery import live_nodes
from autohet_ray.orchestrate.fleet import Fleet
from autohet_ray.orchestrate.live_job import LiveJob
from autohet_ray.orchestrate.stopping import not_in_storage, secure_nodes_first
from autohet_ray.orchestrate.worker_group import GroupFailure, rescue_orphans
from autohet_ray.recovery.decisions import Relaunch, RecoveryFailed, Salvage, StepFailed, Stop
from autohet_ray.recovery.policy import store_only_nodes
from autohet_ray.recovery.states import State, transition
from autohet_ray.storage import job_files
from autohet_ray.storage.dataset_cache import held_dataset
from autohet_ray.storage.lease import storage_lease
from autohet_ray.storage.spec import storage_url
from autohet_ray.storage.sweep import StorageSweeper, sweep_or_warn

log = logging.getLogger(__name__)

LEAVING = "spot notice or drain: the node is leaving"     # why a leaving node's store is dropped (printed)


class Controller(LiveJob):
    def __init__(self, job: TrainJob, *, job_id: str | None = None, profile=None):
        """`job_id`/`profile`: those of a job resumed from its storage (default: a new job, profiled anew)."""
        super().__init__(job, job_id=job_id, profile=profile)
        self.state = State.NEW
        self.board = None                    # the job's spot-notice board, once watch_spot started watchers
        self.target_steps: int | None = None   # the step the caller trains to (named in the resume command)
        self.prepare_joins = True            # plan-ahead: a join's plan and workers are made while this plan trains
        self.prepare_notices = True          # ... and a noticed removal's, when its deadline leaves time
        self.groups_ahead = True             # ... the next plan's process groups too (switch_ahead.Standby)
        self.joining, self.leaving = None, None   # a join's and a notice's preparation (Joining, Leaving)
        self.switch_side = switch_ahead        # the Ray side of the prepared switches job/notice_ahead.py makes
        self.fleet: Fleet | None = None        # the autoscaler request (job.request_fleet), once started

    def start(self, *, restore: str | None = None) -> dict:
        """Discover, profile once, start node stores, plan, place and (with restore='cloud_only' or
        'local_first') load the newest committed step. Returns the launch report."""
        assert self.state is State.NEW, self.state
        self.recovery.drained(draining_nodes())
        if self.job.request_fleet and self.base_cluster.types:
            self.fleet = Fleet(self.base_cluster)
            self.fleet.start(self.discover, self.job.fleet_wait_s)
        self.found = self.discover(confirm=True)
        check_types(self.found, live_nodes(), autoscaled=self.fleet is not None)
        if self.profile is None:
            from autohet_ray.orchestrate.profiling import job_profile  # lazy: torch, for a measured profile only
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
            self.committer = Committer(keeper_specs=self.keeper_specs, storage=self.job.storage,
                                       extra={"job_id": self.job_id}, gc_every=self.job.gc_every,
                                       control_timeout_s=self.job.control_timeout_s)
            self.committer.step_extra = self.data.state
            self.metrics_log = job_files.LineLog(self.job.storage, job_files.METRICS_FILE)
        self.tracking = start_tracking(self.job, self.job_id)
        report = self.launch(restore)
        if self.tracking is not None:
            self.tracking.started(self.job.to_dict() | {"job_id": self.job_id}, self.plan.to_dict())
        self.state = transition(self.state, State.RUNNING)
        return report

    def run(self, steps: int, *, restore: str | None = None, spot_provider: str | None = None, on_event=None,
            stopped_by=None, lease: bool = True) -> dict:
        """Start, train until step `steps` (an elastic job acts on spot notices, drains and joined nodes between
        steps) and close on every exit path. `on_event(kind, report)` hears "launched", "replanned",
        "recovered", "step" and "closed"; `stopped_by()`: the number of the stop signal that ended the run, if one
        did (close then secures the newest step in node stores first). The run's summary; "failure": why the job
        stopped early (a step raised, recovery gave up), after securing its newest committed step. With `lease`
        the run holds its storage's lease, and a new job (no `restore`) refuses a storage that holds a job
        already, as `autohet train` and `resume` do; False when the caller holds the lease itself."""
        if not lease or self.job.storage is None:
            return self._run(steps, restore, spot_provider, on_event, stopped_by)
        url = storage_url(self.job.storage)
        with storage_lease(self.job.storage, url, job_id=self.job_id):
            if restore is None:
                refuse_existing_job(self.job.storage, url)
            return self._run(steps, restore, spot_provider, on_event, stopped_by)

    def _run(self, steps: int, restore: str | None, spot_provider: str | None, on_event, stopped_by) -> dict:
        on_event = self._tracked(on_event or (lambda kind, report: None))
        launch, events, failure, stopping, self.target_steps = {}, [], None, None, steps
        try:
            start = time.perf_counter()
            launch = self.start(restore=restore)
            on_event("launched", {**launch, "seconds": time.perf_counter() - start})
            if spot_provider:
                self.watch_spot(provider=spot_provider)
            while self.step_index < steps:
                self._ask_fleet()
                if self.job.elastic:
                    events += self._between_steps(on_event)
                metrics = self.step()
                if "recovery" in metrics:
                    self._ask_fleet(lost=True)
                    events.append(metrics["recovery"])
                    on_event("recovered", metrics["recovery"])
                on_event("step", metrics)
        except (RecoveryFailed, StepFailed) as err:    # the job stops; close() secures its newest committed step
            failure = str(err)
        except BaseException:
            signum = stopped_by() if stopped_by is not None else None
            stopping = signal.Signals(signum).name if signum is not None else None
            raise
        finally:
            secured = self.close(stopping=stopping)
            on_event("closed", secured)
        return {"job_id": self.job_id, "launch": launch, "events": events, "secured": secured, "failure": failure,
                "steps": [{k: m[k] for k in ("step", "loss", "lr", "wall_s")} for m in self.history],
                "committed": self.committer.committed[-1:] if self.committer else [],
                "storage_committed": self.committer.storage_committed[-1:] if self.committer else [],
                "standby_failures": list(self.recovery.standby_failures),
                **run_figures(self.history, self.job.paced, self.job.global_batch)}

    def _ask_fleet(self, *, lost: bool = False) -> None:
        """The running plan's fleet (job.request_fleet): a lost node's replacement asked for, idle nodes given back."""
        if self.fleet is not None:
            self.fleet.after_plan(self.found.cluster, {s["node"] for s in self.group.slots}, lost=lost)

    def _between_steps(self, on_event) -> list[dict]:
        """Spot notices / drains first (flush, then re-plan without those nodes), then nodes that joined."""
        events = []
        for check in (self.check_notices, self.check_joins):
            try:
                report = check()
            except GroupFailure as failure:         # a node lost during the switch: recovered as any loss
                report = self._recover_switch(failure)
            if report is not None and report.get("plan"):
                events.append(report)
                on_event("recovered" if report.get("during_switch") else "replanned", report)
        return events

    def step(self, fault_hook=None) -> dict:
        """One training step (and the commit of the previous snapshot meanwhile). A lost node or worker is
        recovered, as often as it happens, also during recovery; the metrics of the first completed step then
        carry the recovery report."""
        assert self.state is State.RUNNING, self.state
        recovered = None
        while True:
            try:
                metrics = self._step_once(fault_hook)
                break
            except GroupFailure as failure:
                fault_hook = None
                recovered = self._recover(failure)
        self.recovery.progressed(self.step_index)
        if recovered is None:
            return metrics
        recovered["first_step_s"] = metrics["wall_s"]
        recovered["total_s"] = time.perf_counter() - recovered.pop("started_at")
        return {**metrics, "recovery": recovered}

    def close(self, stopping: str | None = None) -> dict:
        """End the job (on every exit path): the newest committed step reaches the storage before any node
        store is removed; when it cannot, the node stores are kept and the message says where and how to
        resume. `stopping`: the signal that stops the job; the newest step is then first secured in the node
        stores, and where it is printed (orchestrate/stopping.py). Returns {"step", "where"} of the secured
        step, "completed" (the newest step the job reached), "in_storage" (whether the storage holds it) and
        "error" when securing failed."""
        if self.state is State.CLOSED:
            return {}
        if self.planning_ahead is not None:      # no new planning competes with securing the newest step
            self.planning_ahead.stop()
        switch_ahead.drop_preparations(self)
        if stopping and self.committer is not None and self.group is not None:
            secure_nodes_first(self, stopping)
        try:
            outcome = self.secure()
        except BaseException as err:            # noqa: BLE001 - whatever failed, the stores must be kept
            outcome = {"step": None, "error": f"{type(err).__name__}: {err}"}
        if self.committer is not None:
            outcome["completed"] = max(self.step_index, *self.committer.committed, 0)
            outcome["in_storage"] = outcome["completed"] in {0, *self.committer.storage_committed}
        if self.tracking is not None and outcome.get("step") and outcome.get("in_storage"):
            self.tracking.artifact(f"manifest-step-{outcome['step']}.json",
                                   job_files.read_text(self.job.storage, manifest_key(outcome["step"])) or "")
        self._release()
        if outcome.get("in_storage") is False:
            log.warning(not_in_storage(self, outcome))
        if "error" not in outcome:               # else kept: the message above says where and how to resume
            dropped = self.committer.dropped.remaining() if self.committer else []
            for spec in [*self.keeper_specs.values(), *dropped]:
                stop_keeper(self.job_id, spec["node_id"])
        self.state = transition(self.state, State.CLOSED)
        return outcome

    def _release(self) -> None:
        """Stop the workers (before the stores go: a worker may still be writing one), the planning, the spot
        watchers and the committer; release the data. The node stores stay (close decides)."""
        self.inflight = []
        if self.planning_ahead is not None:
            self.planning_ahead.wait(self.job.plan_time_limit_s + 10.0)
        if self.group is not None:
            self.group.kill(wait_s=10.0)
            self.group = None
        if self.board is not None:           # watchers were started (watch_spot)
            stop_watching(self.job_id)
        if self.committer is not None:
            try:
                self.committer.close()
            except Exception as err:             # noqa: BLE001 - a failed collection of old steps loses nothing
                log.warning(f"autohet: collecting old checkpoint steps failed: {err}")
        if self.committer is not None:           # the storage was in use (a failed start touches nothing)
            sweep_or_warn(self.sweeper.at_close, self.job.storage, "close")
        if self.data is not None:
            self.data.close()
        if self.dataset_hold is not None:
            self.dataset_hold.release()            # the cache may evict the dataset once no job holds it
        if self.tracking is not None:
            self.tracking.close()

    def _tracked(self, on_event):
        """`on_event` that also hands the trackers each recovery, re-plan and switch."""
        def both(kind: str, report: dict) -> None:
            if self.tracking is not None and kind in ("recovered", "replanned", "switched"):
                self.tracking.event(kind, report)
            on_event(kind, report)
        return both

    # -- carrying out recovery's decisions -----------------------------------------------------------------
    def _recover(self, failure: GroupFailure) -> dict:
        """Recover from a failed step, round after round (a loss while relaunching starts the next); the report
        of every phase (step() adds the first step)."""
        stop = self.recovery.on_failure(failure, completed=self.step_index)
        switch_ahead.drop_preparations(self)      # prepared for the state before the loss: stale
        while stop is None:
            self.state = transition(self.state, State.RECOVERING)
            node_ids = {**{n: s["node_id"] for n, s in self.keeper_specs.items()}, **self.found.node_ids}
            stores = store_only_nodes(self.committer.keepers if self.committer else (), self.group.slots)
            decision = self.recovery.diagnose(
                failure, node_ids=node_ids, keeps_checkpoints=self.committer is not None,
                healthy=lambda: healthy(self.group, node_ids, stores),
                detect=lambda: detect_failure(self.group, node_ids, failure, job_id=self.job_id, store_nodes=stores,
                                              timeout_s=self.job.detect_timeout_s, loss_grace_s=self.job.loss_grace_s))
            if isinstance(decision, Stop):
                stop = decision
                break
            report, reuse = self._salvage(decision)
            relaunch = self.recovery.relaunch(decision.lost["message"], reuse,
                                              nothing_committed=not self.committer.committed)
            try:
                return self.recovery.recovered(report | self._relaunch(relaunch))
            except GroupFailure as again:
                stop, failure = self.recovery.lost_again(again, report), again
        raise stop.error from failure

    def _recover_switch(self, failure: GroupFailure) -> dict:
        """A node lost during a switch (its flush, or the new group's restore): recovered like a loss in a step,
        from the steps completed before it (the flushed step: none is lost); the stores of nodes that are leaving
        are dropped, as the switch would have."""
        report = self._recover(failure)
        report["total_s"] = time.perf_counter() - report.pop("started_at")
        leaving = [n for n, spec in self.keeper_specs.items() if spec["node_id"] in self.recovery.draining]
        report["handed_over_bytes"] = self.committer.hand_over_stores(leaving, LEAVING, self.job.control_timeout_s)
        return report | {"during_switch": True}

    def _salvage(self, decision: Salvage) -> tuple[dict, dict[str, list]]:
        """Drop the lost nodes' stores, start staging the next plan's copies, and keep the survivors' processes
        (first rewriting the chunks only they still hold). (The salvage report, node name -> idle actors)."""
        lost, committer, start = decision.lost, self.committer, time.perf_counter()
        for node in lost["lost_nodes"]:
            committer.drop_keeper(node, lost["message"])
        self.recovery.start_stage_in(committer, plan_cache=self.plan_cache, cluster=self.found.cluster,
                                     lost_nodes=lost["lost_nodes"], model=self.model)
        step, orphans = committer.orphans_of_newest()
        rescued, errors, nodes = {}, [], [slot["node"] for slot in self.group.slots]
        reuse = self.group.salvage(self.inflight, set(lost["dead_ranks"]), before_reset=lambda alive: rescued.update(
            rescue_orphans(alive, nodes, step, orphans, errors)))
        self.inflight = []
        salvage = {f"salvage_{k}": v for k, v in self.group.salvage_phases.items()}
        committer.forget_pending()
        rereplicated = committer.rereplicate_newest(also_held=rescued)
        return {"detect_s": decision.detect_s, "salvage_s": time.perf_counter() - start, **salvage, **lost,
                "orphaned_chunks": len(orphans), "rescued_chunks": len(rescued), "rescue_errors": errors,
                "rereplicated_chunks": rereplicated}, reuse

    def _relaunch(self, decision: Relaunch) -> dict:
        """Rediscover the live nodes, give new ones a node store, plan, restart and restore (as decided)."""
        self.state = transition(self.state, State.REPLANNING)
        start = time.perf_counter()
        self.found = self.discover()
        discover_s = time.perf_counter() - start
        if self.job.elastic:
            self.start_keepers()                    # a joined node's store: a new actor there (timed apart)
        report = {"reason": decision.reason, "discover_s": discover_s,
                  "keepers_s": time.perf_counter() - start - discover_s,
                  **self.launch(decision.restore_from, decision.reuse, decision.plan)}
        if decision.restore_from is None:
            report |= {"restored_step": 0, "restarted_from_init": True}
        self.state = transition(self.state, State.RUNNING)
        return report

    def replan(self, *, reason: str = "requested", plan: dict | None = None, extra: dict | None = None) -> dict:
        """A planned re-plan on the live nodes: flush, keep the workers' processes (and take `extra`'s: node
        name -> workers started ahead), relaunch from the flushed step."""
        self.flush()
        reuse, completed = self.group.salvage([], set()), self.step_index
        for node, actors in (extra or {}).items():
            reuse.setdefault(node, []).extend(actors)
        nothing_committed = self.committer is not None and not self.committer.committed
        relaunch = self.recovery.relaunch(reason, reuse, nothing_committed=nothing_committed, plan=plan,
                                          planned=True)
        return self.recovery.replanned(self._relaunch(relaunch), completed)

    # -- events between steps ----------------------------------------------------------------------------------
    def watch_spot(self, **watcher_options):
        """Start a spot-notice watcher on every node of the job; the job's notice board."""
        self.board = watch_nodes([n.node_id for n in self.found.nodes], job_id=self.job_id,
                                 **{"provider": self.job.spot_provider, "control_timeout_s": self.job.control_timeout_s,
                                    **watcher_options})
        return self.board

    def check_notices(self, board=None) -> dict | None:
        """Act on spot notices (the job's notice board) and on Ray's drain signal between steps: with time to
        spare, prepare the state without the noticed nodes while training on, then (at a later boundary) flush,
        switch and acknowledge (the watcher then drains its node); else flush, acknowledge and re-plan at once.
        No step is lost either way. None when nothing is pending or the switch is being prepared."""
        assert self.state is State.RUNNING, self.state
        board, wait_s = board if board is not None else self.board, self.job.control_timeout_s
        notices = ray.get(board.pending.remote(), timeout=wait_s) if board is not None else {}
        names, drains = {n.node_id: n.name for n in self.found.nodes}, draining_nodes()
        decision = self.recovery.on_notices(set(notices), set(drains), names)
        if decision is None:
            return None
        leaving = {i for i, n in names.items() if n in decision.leaving}
        deadline = earliest_deadline(notices, drains, leaving)
        report, start = None, time.perf_counter()
        if decision.leaving and self.prepare_notices and not switch_now(self, deadline, notices, leaving, time.time()):
            report = notice_ahead(self, decision.leaving, deadline)
            if report is None:
                return None                       # train on; switch at a later step boundary
        switch_ahead.drop_preparations(self, ("leaving",))
        self.flush()
        flush_s = report["flush_s"] if report else time.perf_counter() - start
        handed_over = self.committer.hand_over_stores(
            decision.leaving, LEAVING, hand_over_wait_s(deadline, notices, leaving, time.time(), wait_s))
        for node_id in decision.ack:
            ray.get(board.ack.remote(node_id), timeout=wait_s)
        if not decision.leaving:
            return {"nodes": [], "flush_s": flush_s}
        report = report or self.replan(reason=f"spot notice: node(s) {decision.leaving} will be preempted")
        return report | {"nodes": decision.leaving, "flush_s": flush_s, "notice_deadline_s": deadline,
                         "handed_over_bytes": handed_over}

    def check_joins(self, plan: dict | None = None) -> dict | None:
        """Re-plan onto nodes that joined since the last plan: named nodes of the cluster file back again, and any
        live node of one of its node types, whatever its id (replacement spot nodes the autoscaler brought); None
        when none joined, or while the join is prepared (orchestrate/switch_ahead.py). `plan`: run this plan
        instead of planning."""
        assert self.state is State.RUNNING, self.state
        try:
            available = set(self.discover().node_ids)
        except ConfigError:          # no usable node at all: the next step fails and is recovered as a loss
            return None
        grow = self.recovery.on_joins({n.name for n in self.found.nodes}, available)
        if self.joining is not None and (grow is None or self.joining.base != state_key(self.found.cluster)):
            switch_ahead.drop_preparations(self, ("joining",))   # the nodes left, or a node was lost meanwhile
        if grow is None:
            return None
        if self.prepare_joins and plan is None:
            report = switch_ahead.join_ahead(self, grow.joined)
            return None if report is None else {"joined": grow.joined, **report}
        return {"joined": grow.joined, **self.replan(reason=f"node(s) {grow.joined} joined", plan=plan)}

    def mark_fault(self) -> None:
        """Tests and benchmarks note when they inject a failure (detection is timed from here)."""
        self.recovery.mark_fault()

    def set_storage_every(self, steps: int) -> None:
        """Change the storage cadence between steps (0: node stores only); the last step is flushed first."""
        assert self.state is State.RUNNING, self.state
        self.flush()
        self.job = replace(self.job, checkpoint_every=steps)
        self.configure_snapshots()

    set_cloud_every = set_storage_every      # deprecated name (benchmarks/recovery_bench.py calls it)
