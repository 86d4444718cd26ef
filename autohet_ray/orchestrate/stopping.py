"""Where a job's newest committed step is, and getting it into two places fast when the job is stopped.

`ray job stop`, a spot reclaim or Kubernetes sends SIGTERM and SIGKILL a few seconds later (Ray: 3 s), while
reaching the storage may take minutes. So a stopping job first commits its newest completed step to the node
stores (fast, local), checks that every chunk of it has two copies (node stores, the storage), prints where
it is and the `autohet resume` command, and only then uploads to the storage (Controller.close). A SIGKILL
at any point leaves a resumable state: node stores are served by detached keepers, which outlive the driver.
"""
from __future__ import annotations

import sys

import ray

from autohet_ray.checkpoint.errors import CheckpointError
from autohet_ray.elastic.report import report_failure
from autohet_ray.orchestrate.worker_group import GroupFailure
from autohet_ray.storage.spec import location

FAST_TIMEOUT_S = 2.0        # a stopping job's node-store commit and second copies (Ray kills it 3 s after SIGTERM)


def resume_command(ctl) -> str:
    """The exact `autohet resume` command that continues this job (to its target step, when it is not reached)."""
    storage = ctl.job.storage
    endpoint = f" --endpoint-url {storage['endpoint_url']}" if storage.get("endpoint_url") else ""
    newest = max(ctl.committer.committed, default=0) if ctl.committer else 0
    steps = f" --steps {ctl.target_steps}" if ctl.target_steps and ctl.target_steps > newest else ""
    return f"autohet resume --storage {location(storage, '').rstrip('/')}{endpoint}{steps}"


def newest_places(ctl) -> dict:
    """{"step": the newest committed step (None: none), "stores": the live node stores holding a copy of
    some chunk of it, "copies": the fewest copies any chunk of it has (the storage counts as one),
    "in_storage": whether the storage holds it}."""
    committer = ctl.committer
    step = max(committer.committed, default=None)
    in_storage = step is not None and step in committer.cloud_committed
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
            ctl.flush(FAST_TIMEOUT_S, wait_cloud=False)
        except (GroupFailure, CheckpointError, ray.exceptions.RayError) as err:
            report_failure(ctl.step_index, "node-store commit on stopping", None, err)
    places = newest_places(ctl)
    if places["step"] is not None and places["copies"] < 2 and ctl.committer.rereplicate_newest():
        copies = ctl.committer.copies
        ray.wait(copies, num_returns=len(copies), timeout=FAST_TIMEOUT_S)
        places = newest_places(ctl)
    print(f"autohet: {signal_name}: {describe_places(ctl, places)}; if this process is killed now, "
          f"`{resume_command(ctl)}` continues from it. Copying it to the storage now.", file=sys.stderr,
          flush=True)
    return places


def describe_places(ctl, places: dict) -> str:
    if places["step"] is None:
        return "no step committed yet"
    where = [f"node stores {', '.join(places['stores'])}"] if places["stores"] else []
    where += [f"the storage {location(ctl.job.storage, '')}"] if places["in_storage"] else []
    return (f"committed step {places['step']} is in {' and '.join(where) or 'no live store'} "
            f"({places['copies']} cop{'y' if places['copies'] == 1 else 'ies'} of each chunk at least)")


def not_in_storage_message(ctl, outcome: dict) -> str:
    """Why the run's newest step is not in the storage, where it is instead, and the resume command."""
    newest_stored = max(ctl.committer.cloud_committed, default=None)
    places = newest_places(ctl)
    storage = location(ctl.job.storage, "").rstrip("/")
    lines = [f"autohet: step {outcome['completed']} did not reach the storage {storage}"
             + (f" ({outcome['error']})" if outcome.get("error") else "")
             + f"; the newest step there is {newest_stored}."]
    if places["step"] is not None and not places["in_storage"] and places["stores"]:
        dirs = ", ".join(f"{spec['name']}: {spec['dir']}" for _node, spec in sorted(ctl.keeper_specs.items())
                         if spec["name"] in places["stores"])
        lines.append(f"autohet: {describe_places(ctl, places)}, kept for job {ctl.job_id} ({dirs}); while "
                     f"their nodes live, `{resume_command(ctl)}` continues from it.")
    elif newest_stored is not None:
        lines.append(f"autohet: `{resume_command(ctl)}` continues from step {newest_stored}.")
    else:
        lines.append("autohet: no step of this job was committed anywhere; `autohet train` starts it again.")
    return "\n".join(lines)
