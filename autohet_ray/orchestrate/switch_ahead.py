"""The Ray side of prepared switches (job/notice_ahead.py): the next plan's workers join their process groups
and build their engines (Standby) while the current plan trains; at the switch the old workers flush and exit
and the standby ones restore the flushed step from the node stores. Standby actors request no GPU from Ray; on a
real GPU node each is pinned to a GPU of its own (WorkerGroup); docs/recovery.md says what they cost there."""
from __future__ import annotations

import threading
import time

import ray

from autohet_ray.elastic.keeper import start_keeper, stop_keeper
from autohet_ray.emulate.pacer import rank_pacers
from autohet_ray.job.foresight import Joining, foreseen_states
from autohet_ray.job.notice_ahead import hand_over, restart_planning, switch_when_ready
from autohet_ray.job.plan_choice import choose_plan, state_key
from autohet_ray.orchestrate.worker_group import WorkerGroup, kill_actors, worker_actor
from autohet_ray.plan.schema import plan_summary
from autohet_ray.recovery.states import State, transition


class Standby:
    """The next plan's workers (`reuse`: node -> actors started ahead), set up in a thread: groups, engines."""

    def __init__(self, ctl, plan: dict, reuse: dict | None = None):
        self.found = ctl.discover()
        self.plan, self.evaluation, _, _ = choose_plan(
            ctl.job, found=self.found, profile=ctl.profile, priced_model=ctl.priced_model,
            seq_len=ctl.priced_seq_len, plan=plan, first=False, cache=ctl.plan_cache)
        self.group = WorkerGroup(ctl.executed_plan(self.plan), self.found.node_ids, reuse=dict(reuse or {}),
                                 loss_grace_s=ctl.job.loss_grace_s, gpus=0.0,
                                 real_gpu_nodes=frozenset(n.name for n in self.found.nodes if not n.emulated))
        pacers = rank_pacers(self.plan, self.found.cluster, ctl.priced_model, ctl.profile, self.evaluation,
                             time_scale=ctl.time_scale or ctl.job.time_scale,
                             iteration_wall_s=ctl.job.iteration_wall_s)[0] if ctl.job.paced else None
        self.setup, self.error = None, None
        self._thread = threading.Thread(target=self._build, args=(ctl.job, ctl.model, pacers), daemon=True,
                                        name="autohet-standby")
        self._thread.start()

    def _build(self, job, model, pacers) -> None:
        try:
            self.setup = self.group.setup(model_spec=model.to_dict(), seed=job.seed, optimizer=job.optimizer.to_dict(),
                                          dtype=job.dtype, collective_timeout_s=job.collective_timeout_s,
                                          timeout_s=job.setup_timeout_s, pacers=pacers)
        except Exception as err:               # noqa: BLE001 - prepared again (job/notice_ahead.py)
            self.error = f"{type(err).__name__}: {err}"

    def ready(self) -> bool:
        return not self._thread.is_alive()

    def drop(self) -> None:
        self._thread.join(5.0)
        self.group.kill()


def switch_to_standby(ctl, prep, reason: str) -> dict:
    """Flush (no step is lost), stop the old workers, restore the flushed step into `prep`'s standby ones. A
    node lost meanwhile raises GroupFailure (the controller recovers it from the flushed step)."""
    start, standby = time.perf_counter(), prep.standby
    ctl.flush()
    completed, flushed = ctl.step_index, time.perf_counter()
    ctl.state = transition(ctl.state, State.REPLANNING)
    if ctl.planning_ahead is not None:
        ctl.planning_ahead.stop()
    ctl.group.kill(wait_s=10.0)
    stopped = time.perf_counter()
    ctl.found, ctl.plan, ctl.evaluation, ctl.group = standby.found, standby.plan, standby.evaluation, standby.group
    ctl.plan_source = "planned ahead"
    ctl.start_keepers()
    hand_over(prep)
    report = {"reason": reason, "groups_built_ahead": True, "flush_s": flushed - start, "stop_s": stopped - flushed,
              "keepers_s": time.perf_counter() - stopped, "replan_s": 0.0, "restart_s": 0.0,
              "prepared_s": start - prep.since, "standby_setup_s": standby.setup["setup_s"],
              "plan": plan_summary(ctl.plan), "num_ranks": len(ctl.group.actors),
              "reused_actors": len(ctl.group.actors), "predicted_iteration_s": ctl.evaluation.iteration_time_s}
    report |= ctl.resume_on_group("local_first")
    ctl.state = transition(ctl.state, State.RUNNING)
    return ctl.recovery.replanned(report | {"switch_s": time.perf_counter() - start}, completed)


def prepare_join(ctl, joined: list[str], earlier: Joining | None) -> Joining:
    """Plan the state with the joined nodes first (then the other foreseen ones) and start their workers
    (those an `earlier` preparation started on nodes still joined are kept)."""
    kept = {n: a for n, a in earlier.actors.items() if n in joined} if earlier is not None else {}
    if earlier is not None:
        drop_standby(earlier)
        kill_actors([a for n, actors in earlier.actors.items() if n not in joined for a in actors])
    found = ctl.discover()
    restart_planning(ctl, foreseen_states(ctl.found.cluster, joined=found.cluster), found)
    per_node = {n.name: n for n in found.nodes if n.name in joined}
    actors = {name: kept.get(name) or [worker_actor(n.node_id, 0) for _ in range(n.num_gpus)]
              for name, n in per_node.items()}
    started = [a.where.remote() for node_actors in actors.values() for a in node_actors]   # process + imports
    started += [start_keeper(ctl.job_id, n.node_id, label=f"keeper-{name}").directory.remote()
                for name, n in per_node.items() if name not in ctl.keeper_specs]      # its node store
    return Joining(joined=joined, key=state_key(found.cluster), base=state_key(ctl.found.cluster),
                   actors=actors, started=started, node_ids={name: n.node_id for name, n in per_node.items()})


def join_ahead(ctl, joined: list[str]) -> dict | None:
    """A join prepared while the job trains: the switch's report once plan, workers and node stores are up."""
    if ctl.joining is None or ctl.joining.joined != joined:       # more joined (or fewer): extend
        ctl.joining = prepare_join(ctl, joined, ctl.joining)
    started = ctl.joining.started
    if started and len(ray.wait(started, num_returns=len(started), timeout=0)[0]) < len(started):
        return None                           # train on; switch at a later step boundary
    prepared = sum(len(a) for a in ctl.joining.actors.values())
    report = switch_when_ready(ctl, ctl.joining, f"node(s) {joined} joined", reuse=ctl.joining.actors)
    if report is not None:
        ctl.joining = None
        report["prepared_workers"] = prepared
    return report


def drop_standby(prep) -> None:
    if prep is not None and prep.standby is not None:
        prep.standby.drop()
        prep.standby = None


def drop_preparations(ctl, names: tuple[str, ...] = ("joining", "leaving")) -> None:
    """Drop a join's and a notice's preparation (a loss meanwhile, or the job ends): their standby groups, the
    joined nodes' workers and the node stores started for them."""
    for name in names:
        prep = getattr(ctl, name)
        drop_standby(prep)
        if isinstance(prep, Joining):
            kill_actors([a for actors in prep.actors.values() for a in actors])
            for node, node_id in prep.node_ids.items():
                if node not in ctl.keeper_specs:
                    stop_keeper(ctl.job_id, node_id)
        setattr(ctl, name, None)
