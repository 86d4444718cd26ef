"""A job's record (job.json in its storage: its id and its TrainJob fields, the format of a job file), the one
reader of it: `autohet resume` and `autohet export` read it, and `autohet train` refuses a storage that holds a
job already. Every field is checked, and a malformed record is one ConfigError naming the file. Reads only:
nothing in the storage is created or touched here (a directory that does not exist yet stays so)."""
from __future__ import annotations

import os

from autohet_ray import ConfigError
from autohet_ray.checkpoint.errors import CheckpointError, ChunkMissingError
from autohet_ray.checkpoint.steps import load_manifest
from autohet_ray.checkpoint.tier_specs import direct_tier
from autohet_ray.cluster.spec import cluster_from_dict
from autohet_ray.config_io import parse_json, text_field
from autohet_ray.job.config import job_from_dict
from autohet_ray.model.spec import model_from_dict
from autohet_ray.safe_names import plain_name
from autohet_ray.storage import job_files
from autohet_ray.storage.spec import check_storage, location

CHECKS = ("all", "model", "id")


def read_job_record(storage: dict, *, check: str = "all", missing_ok: bool = False) -> tuple[str, dict] | None:
    """(job id, TrainJob fields) of the job that wrote `storage` (a tier spec); ConfigError when the storage
    holds a malformed job.json, or none (None instead with `missing_ok`). `check`: "all" fields (a resume runs
    them all), the "model" and the dataset only (what an export reads), or the job "id" only."""
    where = location(storage, job_files.JOB_FILE)
    try:
        text = job_files.read_text(storage, job_files.JOB_FILE)
    except IsADirectoryError:
        raise ConfigError(f"{where} is a directory, not a job record") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where} is not UTF-8 text: it is no job record") from None
    if text is None:
        if missing_ok:
            return None
        raise ConfigError(f"{where} does not exist: the storage holds no autohet job; give the --storage a job "
                          "wrote to")
    return job_record_from_text(text, where, check=check)


def job_record_from_text(text: str, where: str, *, check: str = "all") -> tuple[str, dict]:
    assert check in CHECKS, check
    raw = parse_json(text, where)
    if not isinstance(raw, dict) or not isinstance(raw.get("job"), dict) or "job_id" not in raw:
        raise ConfigError(f"{where} holds no job (a JSON object with 'job_id' and 'job' is expected)")
    job_id = plain_name(raw["job_id"], where=where, field="job_id")   # it names node stores removed at close
    job = raw["job"]
    if check == "all":
        check_job_fields(job, where)
    elif check == "model":
        check_model_and_data(job, where)
    return job_id, job


def newest_committed_step(spec: dict) -> tuple[int | None, int]:
    """(the newest step whose manifest is valid, or None; how many manifests the storage holds)."""
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
        record = read_job_record(spec, check="id", missing_ok=True)
        job = f"job {record[0]}" if record else "a job without job.json"
    except ConfigError:
        record, job = (), "a job whose job.json is unreadable"
    newest, manifests = newest_committed_step(spec)
    if record is None and not manifests:
        return
    committed = (f"newest committed step {newest}" if newest is not None else
                 f"no valid committed step among {manifests} manifests" if manifests else "no committed step yet")
    raise ConfigError(f"storage {url!r} already holds {job} ({committed}); continue it with "
                      f"`autohet resume --storage {url}`, or give another --storage for a new job")


def check_model_and_data(job: dict, where: str) -> None:
    if "model" not in job:
        raise ConfigError(f"{where}: job has no 'model'")
    model_from_dict(job["model"], source=f"{where}: job.model")
    if job.get("data") is not None:
        text_field(job["data"], f"{where}: job.data")


def check_job_fields(job: dict, where: str) -> None:
    """ConfigError naming the field unless `job` builds a TrainJob whose model and cluster are valid."""
    if not job:
        raise ConfigError(f"{where}: job is empty; it must hold the TrainJob fields")
    try:
        job_from_dict(job)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    model_from_dict(job["model"], source=f"{where}: job.model")
    cluster_from_dict(job["cluster"], source=f"{where}: job.cluster")
    if job.get("priced_as") is not None:
        model_from_dict(job["priced_as"], source=f"{where}: job.priced_as")
