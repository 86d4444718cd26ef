"""A storage belongs to one job: its job.json, read and checked, and the refusal of a new job in a storage that
already holds one. Reads only: nothing in the storage is created or touched here (a directory that does not
exist yet stays so)."""
from __future__ import annotations

import json
import os

from autohet_ray import ConfigError
from autohet_ray.checkpoint.errors import CheckpointError, ChunkMissingError
from autohet_ray.checkpoint.tier_specs import direct_tier
from autohet_ray.safe_names import plain_name
from autohet_ray.storage import job_files
from autohet_ray.storage.spec import check_storage, location


def read_job_record(spec: dict) -> dict | None:
    """{"job_id", "job"} of the storage's job.json, None when there is none; ConfigError (one line) when it is
    not such a record, or its job id is no plain name (it names the job's node stores and actors)."""
    text = job_files.read_text(spec, job_files.JOB_FILE)
    if text is None:
        return None
    where = location(spec, job_files.JOB_FILE)
    try:
        record = json.loads(text)
    except ValueError as err:
        raise ConfigError(f"{where} is not valid JSON ({err}); it is not a job record autohet wrote") from None
    if not isinstance(record, dict) or not isinstance(record.get("job"), dict):
        raise ConfigError(f"{where} holds no job (a JSON object with 'job_id' and 'job' is expected)")
    plain_name(record.get("job_id"), where=where, field="job_id")
    return record


def newest_committed_step(spec: dict) -> tuple[int | None, int]:
    """(the newest step whose manifest is valid, or None; how many manifests the storage holds)."""
    from autohet_ray.checkpoint.steps import load_manifest  # lazy: torch (manifests hash with the codec)
    if spec["kind"] == "dir" and not os.path.isdir(spec["path"]):
        return None, 0                            # (a directory tier would make the directory)
    tier = direct_tier(spec)
    steps = tier.list_manifests()
    for step in sorted(steps, reverse=True):
        try:
            load_manifest(tier, step)
        except (CheckpointError, ChunkMissingError, ConfigError):     # damaged, or crafted (safe_names)
            continue
        return step, len(steps)
    return None, len(steps)


def refuse_existing_job(spec: dict, url: str) -> None:
    """ConfigError (one line) when the storage `url` already holds a job: a job.json or any manifest. Reads
    only; a directory that does not exist holds nothing."""
    if spec["kind"] == "dir" and not os.path.isdir(spec["path"]):
        return                                     # nothing there, or no directory (check_storage says so)
    if spec["kind"] == "s3":
        check_storage(spec)                        # a missing bucket or credentials: their own message
    try:
        record = read_job_record(spec)
        job = f"job {record['job_id']}" if record else "a job without job.json"
    except ConfigError:
        record, job = {}, "a job whose job.json is unreadable"
    newest, manifests = newest_committed_step(spec)
    if record is None and not manifests:
        return
    committed = (f"newest committed step {newest}" if newest is not None else
                 f"no valid committed step among {manifests} manifests" if manifests else "no committed step yet")
    raise ConfigError(f"storage {url!r} already holds {job} ({committed}); continue it with "
                      f"`autohet resume --storage {url}`, or give another --storage for a new job")
