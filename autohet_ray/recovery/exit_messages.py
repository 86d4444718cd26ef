"""What a stopping or closing job prints about its newest committed step: where it is (`places`, see
orchestrate/stopping.py's newest_places), and the exact `autohet resume` command that continues the job."""
from __future__ import annotations

from autohet_ray.checkpoint.tier_specs import location


def resume_command(storage: dict, newest: int, target_steps: int | None) -> str:
    """The `autohet resume` command that continues the job of `storage` from committed step `newest` (to
    `target_steps`, when that is not reached)."""
    endpoint = f" --endpoint-url {storage['endpoint_url']}" if storage.get("endpoint_url") else ""
    steps = f" --steps {target_steps}" if target_steps and target_steps > newest else ""
    return f"autohet resume --storage {location(storage, '').rstrip('/')}{endpoint}{steps}"


def describe_places(storage: dict, places: dict) -> str:
    if places["step"] is None:
        return "no step committed yet"
    where = [f"node stores {', '.join(places['stores'])}"] if places["stores"] else []
    where += [f"the storage {location(storage, '')}"] if places["in_storage"] else []
    return (f"committed step {places['step']} is in {' and '.join(where) or 'no live store'} "
            f"({places['copies']} cop{'y' if places['copies'] == 1 else 'ies'} of each chunk at least)")


def not_in_storage_message(outcome: dict, places: dict, *, storage: dict, newest_stored: int | None,
                           keeper_specs: dict[str, dict], job_id: str, resume: str) -> str:
    """Why the run's newest step (`outcome["completed"]`) is not in the storage, where it is instead, and the
    resume command (`resume`). `newest_stored`: the newest step the storage holds."""
    lines = [f"autohet: step {outcome['completed']} did not reach the storage {location(storage, '').rstrip('/')}"
             + (f" ({outcome['error']})" if outcome.get("error") else "")
             + f"; the newest step there is {newest_stored}."]
    if places["step"] is not None and not places["in_storage"] and places["stores"]:
        dirs = ", ".join(f"{spec['name']}: {spec['dir']}" for _node, spec in sorted(keeper_specs.items())
                         if spec["name"] in places["stores"])
        lines.append(f"autohet: {describe_places(storage, places)}, kept for job {job_id} ({dirs}); while "
                     f"their nodes live, `{resume}` continues from it.")
    elif newest_stored is not None:
        lines.append(f"autohet: `{resume}` continues from step {newest_stored}.")
    else:
        lines.append("autohet: no step of this job was committed anywhere; `autohet train` starts it again.")
    return "\n".join(lines)
