"""Reading a job's record (job.json in its storage: its id and TrainJob fields), as `autohet resume` and
`autohet export` do: every field is checked, and a malformed record is one ConfigError naming the file."""
from __future__ import annotations

from autohet_ray import ConfigError
from autohet_ray.cluster.spec import cluster_from_dict
from autohet_ray.config_io import mapping, parse_json, text_field
from autohet_ray.job.config import job_from_dict
from autohet_ray.model.spec import model_from_dict
from autohet_ray.safe_names import plain_name
from autohet_ray.storage import job_files
from autohet_ray.storage.spec import location


def read_job_record(storage: dict, *, whole: bool = True) -> tuple[str, dict]:
    """(job id, TrainJob fields) of the job that wrote `storage` (a tier spec); ConfigError when the storage
    holds no job.json or a malformed one. `whole`: every field is checked (a resume runs them all); else
    only the model and the dataset (what an export reads)."""
    where = location(storage, job_files.JOB_FILE)
    try:
        text = job_files.read_text(storage, job_files.JOB_FILE)
    except IsADirectoryError:
        raise ConfigError(f"{where} is a directory, not a job record") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where} is not UTF-8 text: it is no job record") from None
    if text is None:
        raise ConfigError(f"{where} does not exist: the storage holds no autohet job; give the --storage a job "
                          "wrote to")
    return job_record_from_text(text, where, whole=whole)


def job_record_from_text(text: str, where: str, *, whole: bool = True) -> tuple[str, dict]:
    raw = mapping(parse_json(text, where), where)
    if "job" not in raw or "job_id" not in raw:
        raise ConfigError(f"{where} must hold an object with 'job_id' and 'job'; it holds keys {sorted(raw)}")
    job_id = plain_name(raw["job_id"], where=where, field="job_id")   # it names node stores removed at close
    job = mapping(raw["job"], f"{where}: job")
    if whole:
        check_job_fields(job, where)
    else:
        check_model_and_data(job, where)
    return job_id, job


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
