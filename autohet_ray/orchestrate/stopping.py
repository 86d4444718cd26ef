"""Where a job's newest committed step is, and getting it into two places fast when the job is stopped.

`ray job stop`, a spot reclaim or Kubernetes sends SIGTERM and SIGKILL a few seconds later (Ray: 3 s), while
reaching the storage may take minutes. So a stopping job first commits its newest completed step to the node
stores (fast, local), checks that every chunk of it has two copies (node stores, the storage), prints where
it is and the `autohet resume` command, and only then uploads to the storage (Controller.close). A SIGKILL
at any point leaves a resumable state: node stores are served by detached keepers, which outlive the driver.
"""
from __future__ import annotations

import logging

import ray

from autohet_ray.checkpoint.errors import CheckpointError
from autohet_ray.orchestrate.worker_group import GroupFailure
from autohet_ray.recovery.exit_messages import describe_places, not_in_storage_message, resume_command
from autohet_ray.recovery.report import report_failure

log = logging.getLogger(__name__)

FAST_TIMEOUT_S = 2.0        # a stopping job's node-store commit and second copies (Ray kills it 3 s after SIGTERM)


def resume_command_of(ctl) -> str:
    newest = max(ctl.committer.committed, default=0) if ctl.committer else 0
    return resume_command(ctl.job.storage, newest, ctl.target_steps)


def newest_places(ctl) -> dict:
    """{"step": the newest committed step (None: none), "stores": the live node stores holding a copy of
    some chunk of it, "copies": the fewest copies any chunk of it has (the storage counts as one),
    "in_storage": whether the storage holds it}."""
    committer = ctl.committer
    step = max(committer.committed, default=None)
    in_storage = step is not None and step in committer.storage_committed
    places = {"step": step, "stores": [], "copies": int(in_storage), "in_storage": in_storage}
    if step is None or not committer.keepers:
        return places
    try:
        manifest = ctl.committer.newest_manifest()
    except (CheckpointError, ray.exceptions.RayError):
        return places
    if manifest is None:
        return places
    live = set(committer.node_of_store())
    held = [live & set(r.replicas) for r in manifest.records]
    places["stores"] = sorted(set().union(*held)) if held else []
    places["copies"] = min((len(h) for h in held), default=0) + int(in_storage)
    return places


def secure_nodes_first(ctl, signal_name: str) -> dict:
    """On a stop signal: commit the newest completed step to the node stores, give each of its chunks a
    second copy where it has one, and print where it is and how to resume. Returns newest_places."""
    if ctl.committer.keepers:                # a plain job's commit is the storage's: Controller.secure's work
        try:
            ctl.flush(FAST_TIMEOUT_S, wait_storage=False)
        except (GroupFailure, CheckpointError, ray.exceptions.RayError) as err:
            report_failure(ctl.step_index, "node-store commit on stopping", None, err)
    places = newest_places(ctl)
    if places["step"] is not None and places["copies"] < 2 and ctl.committer.rereplicate_newest():
        copies = ctl.committer.copies
        ray.wait(copies, num_returns=len(copies), timeout=FAST_TIMEOUT_S)
        places = newest_places(ctl)
    then = "" if places["in_storage"] else " Copying it to the storage now."
    log.warning(f"autohet: {signal_name}: {describe_places(ctl.job.storage, places)}; if this process is killed now, "
                f"`{resume_command_of(ctl)}` continues from it.{then}")
    return places


def not_in_storage(ctl, outcome: dict) -> str:
    """recovery/exit_messages.py's message on why the run's newest step is not in the storage."""
    return not_in_storage_message(outcome, newest_places(ctl), storage=ctl.job.storage, job_id=ctl.job_id,
                                  newest_stored=max(ctl.committer.storage_committed, default=None),
                                  keeper_specs=ctl.keeper_specs, resume=resume_command_of(ctl))
