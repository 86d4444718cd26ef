"""The driver: an explicit state machine discover -> profile -> plan -> place -> train (recovery comes with the
recovery issue). Each phase is a method returning a plain-dict report; `advance()` runs the next one.
`DriverActor` is the same class as a Ray actor (num_cpus=0), so a job's control lives inside the cluster.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import replace

import ray

from autohet_ray import ConfigError
from autohet_ray.cluster.spec import cluster_from_dict
from autohet_ray.cost.evaluate import evaluate_plan
from autohet_ray.model.spec import model_from_dict
from autohet_ray.orchestrate.data import synthetic_batch
from autohet_ray.orchestrate.device_probe import discover_confirmed
from autohet_ray.orchestrate.discovery import check_plan_fits
from autohet_ray.orchestrate.job import TrainJob, job_from_dict
from autohet_ray.orchestrate.job_storage import write_text
from autohet_ray.orchestrate.pacer import emulation_targets
from autohet_ray.orchestrate.placement import place_plan, remove_groups
from autohet_ray.orchestrate.stage_group import StageGroup
from autohet_ray.plan.schema import plan_from_dict
from autohet_ray.profile.analytic import analytic_profile, with_micro_batches
from autohet_ray.profile.db import load_profile

STATES = ("new", "discovered", "profiled", "planned", "placed", "training", "done", "failed")
PHASES = {"new": "discover", "discovered": "profile", "profiled": "plan", "planned": "place"}


class Driver:
    def __init__(self, job: dict):
        self.job: TrainJob = job_from_dict(job)
        self.run_model = model_from_dict(self.job.model)
        self.model = model_from_dict(self.job.priced_as) if self.job.priced_as else self.run_model
        self.seq_len = self.job.seq_len or self.run_model.max_seq_len
        self.priced_seq_len = self.job.priced_seq_len or self.seq_len
        self.state = "new"
        self.found = self.profile_db = self.plan = self.evaluation = self.baselines = None
        self.slots, self.group, self.step_index = [], None, 0
        self.time_scale = self.job.time_scale
        self._rendezvous = None
        self.history: list[dict] = []

    # -- state machine -------------------------------------------------------------------------------------
    def _enter(self, expected: str, new: str) -> None:
        if self.state != expected:
            raise RuntimeError(f"driver is {self.state!r}; this phase needs state {expected!r}")
        self.state = new

    def advance(self) -> dict:
        """Run the next setup phase (discover, profile, plan, place); failures move the driver to 'failed'."""
        if self.state not in PHASES:
            raise RuntimeError(f"driver is {self.state!r}; nothing to advance (call step() when placed)")
        phase = PHASES[self.state]
        start = time.perf_counter()
        try:
            report = getattr(self, f"run_{phase}")()
        except BaseException:
            self.state = "failed"
            self.close()
            raise
        return {"phase": phase, "state": self.state, "seconds": time.perf_counter() - start, **report}

    def get_state(self) -> str:
        return self.state

    # -- phases ----------------------------------------------------------------------------------------------
    def run_discover(self) -> dict:
        base = cluster_from_dict(self.job.cluster) if self.job.cluster else None
        self.found = discover_confirmed(base, timeout_s=self.job.placement_timeout_s)
        self._enter("new", "discovered")
        return {"cluster": self.found.cluster.to_dict(), "emulated": self.found.emulated,
                "nodes": [{"name": n.name, "node_id": n.node_id, "device": n.device_type, "gpus": n.num_gpus}
                          for n in self.found.nodes]}

    def run_profile(self) -> dict:
        mode = self.job.profile
        if mode == "analytic":
            self.profile_db = analytic_profile(self.model, self.found.cluster, self.priced_seq_len,
                                               with_micro_batches(self.job.micro_batch))
        elif mode == "measured":
            from autohet_ray.orchestrate.profiling import profile_cluster
            self.profile_db = profile_cluster(self.found, self.model, self.priced_seq_len,
                                              cache_dir=self.job.profile_cache)
        else:
            self.profile_db = load_profile(mode)
        self._enter("discovered", "profiled")
        return {"profile_kind": self.profile_db.kind, "entries": len(self.profile_db.entries),
                "meta": self.profile_db.meta}

    def run_plan(self) -> dict:
        cluster = self.found.cluster
        if self.job.plan is not None:
            plan = plan_from_dict(self.job.plan)
            solve_s, baselines = 0.0, {}
        else:
            from autohet_ray.planner import plan_with_baselines
            result, found = plan_with_baselines(cluster=cluster, model=self.model, profile=self.profile_db,
                                                global_batch=self.job.global_batch, seq_len=self.priced_seq_len,
                                                micro_batch=self.job.micro_batch,
                                                time_limit_s=self.job.plan_time_limit_s,
                                                schedules=self.job.schedules())
            plan, solve_s = result.plan, result.solve_time_s
            baselines = {n: b.evaluation.iteration_time_s for n, b in found.items() if b.evaluation is not None}
        check_plan_fits(plan, self.found)
        self.evaluation = evaluate_plan(plan, cluster, self.model, self.profile_db)
        if not self.evaluation.feasible:
            raise ConfigError(f"the plan does not fit: {self.evaluation.reason}")
        self.plan = plan.with_predicted(self.evaluation.predicted())
        self.baselines = baselines
        self._enter("profiled", "planned")
        return {"plan": self.plan.to_dict(), "predicted_iteration_s": self.evaluation.iteration_time_s,
                "predicted_samples_per_s": self.evaluation.samples_per_s, "solve_s": solve_s,
                "baselines_iteration_s": baselines}

    def executed_plan(self):
        """The plan the stage actors execute: the priced plan on the model (and sequence length) that runs."""
        return replace(self.plan, model=self.run_model.name, model_spec=self.run_model.to_dict(),
                       seq_len=self.seq_len)

    def run_place(self) -> dict:
        job = self.job
        self.slots = place_plan(self.plan, self.found, timeout_s=job.placement_timeout_s)
        self.group = StageGroup(self.slots)
        pacers = [None] * len(self.group.actors)
        if job.emulate:
            if job.iteration_wall_s is not None:
                self.time_scale = job.iteration_wall_s / self.evaluation.iteration_time_s
            targets = emulation_targets(self.plan, self.found.cluster, self.model, self.profile_db, self.evaluation)
            pacers = [{"targets": t, "time_scale": self.time_scale} for t in targets]
        refs = [actor.setup.remote(plan=self.executed_plan().to_dict(), model_spec=self.run_model.to_dict(),
                                   seed=job.seed, lr=job.lr, dtype=job.dtype, pacer=pacers[r],
                                   collective_timeout_s=job.collective_timeout_s, **self._address())
                for r, actor in enumerate(self.group.actors)]
        setups = self.group.gather(refs, timeout_s=job.placement_timeout_s + 120)
        self._enter("planned", "placed")
        if job.storage:
            write_text(job.storage, "plan.json", self.plan.to_json(), job.endpoint_url)
        return {"ranks": len(setups), "locations": self.group.locations, "time_scale": self.time_scale,
                "setup_s": max(s["setup_s"] for s in setups)}

    def _address(self) -> dict:
        """Rendezvous through the driver: rank 0's node address and a free port there."""
        if self._rendezvous is None:
            single = self.found.single_host
            self.group.locations = self.group.call("where", timeout_s=self.job.placement_timeout_s)
            addr, port = self.group.gather([self.group.actors[0].free_port.remote(single)], 60)[0]
            self._rendezvous = {"master_addr": addr, "master_port": port, "world_size": len(self.group.actors),
                                "socket_ifname": "lo" if single else os.environ.get("GLOO_SOCKET_IFNAME")}
        return self._rendezvous

    def step(self) -> dict:
        """One training step on every stage actor; per-step metrics (emulated figures say so)."""
        if self.state not in ("placed", "training"):
            raise RuntimeError(f"driver is {self.state!r}; step() needs a placed plan")
        self.state = "training"
        job = self.job
        batch = ray.put(synthetic_batch(vocab_size=self.run_model.vocab_size, global_batch=job.global_batch,
                                        seq_len=self.seq_len, seed=job.seed, step=self.step_index))
        start = time.perf_counter()
        try:
            outs = self.group.call("train_step", batch)
        except BaseException:
            self.state = "failed"
            self.close()
            raise
        wall = time.perf_counter() - start
        self.step_index += 1
        metrics = self._metrics(outs, wall)
        self.history.append(metrics)
        if self.step_index >= job.steps:
            self.state = "done"
            self._save_history()
        return metrics

    def _metrics(self, outs: list[dict], wall: float) -> dict:
        job, ev = self.job, self.evaluation
        scale = self.time_scale if job.emulate else 1.0
        m = {"step": self.step_index, "loss": outs[0]["loss"], "grad_norm": outs[0]["grad_norm"],
             "wall_s": wall, "emulated": job.emulate, "time_scale": scale,
             "iteration_s": wall / scale, "samples_per_s": job.global_batch / (wall / scale),
             "predicted_iteration_s": ev.iteration_time_s, "predicted_samples_per_s": ev.samples_per_s,
             "profile_kind": self.profile_db.kind}
        if job.emulate:
            m["overruns"] = sum(sum(o["emulation"]["overruns"].values()) for o in outs)
            m["overrun_s"] = max(o["emulation"]["overrun_s"] for o in outs)
            by_op: dict[str, int] = {}
            for o in outs:
                for op, n in o["emulation"]["overruns"].items():
                    by_op[op] = by_op.get(op, 0) + n
            m["overruns_by_op"] = by_op
            m["op_seconds_max"] = {op: max(o["timings"].get(op, 0.0) for o in outs) for op in outs[0]["timings"]}
        return m

    def _save_history(self) -> None:
        if self.job.storage:
            write_text(self.job.storage, "metrics.jsonl", "".join(json.dumps(m) + "\n" for m in self.history),
                       self.job.endpoint_url)

    def stage_state(self, rank: int) -> dict:
        return ray.get(self.group.actors[rank].state_dict.remote())

    def close(self) -> None:
        if self.group is not None:
            self.group.kill()
            self.group = None
        if self.slots:
            remove_groups(self.slots)
            self.slots = []


DriverActor = ray.remote(num_cpus=0, max_restarts=0)(Driver)
