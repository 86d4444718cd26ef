"""A job file: one YAML holding a whole training job, read by `autohet train --config FILE` (and `jobs/train.py`).

Its keys are TrainJob's fields plus Launch's (how this run goes: `steps`, `emulate`). The mapping fields may be
given by reference: `model` (and `priced_as`) a preset name, a model YAML or `hf:DIR`; `cluster` and `plan` a
file; `storage` a directory or s3://bucket/prefix. Relative paths are relative to the working directory, as a
flag's are. Resolved, a job is the `job` of the record its storage keeps (job.json), and `autohet train
--print-config` writes it in this format: a job record or a printed config is a job file too."""
from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import MISSING, dataclass, fields

from autohet_ray import ConfigError
from autohet_ray.cluster.spec import cluster_from_dict, load_cluster
from autohet_ray.config_io import dataclass_from_dict, mapping, read_structured
from autohet_ray.job.config import TrainJob
from autohet_ray.job.schema import job_file_schema, schema_errors
from autohet_ray.model.spec import load_model, model_from_dict
from autohet_ray.plan.schema import load_plan, plan_from_dict
from autohet_ray.storage.spec import storage_spec

REFERENCES = {"model": "PRESET|FILE|hf:DIR", "priced_as": "PRESET|FILE|hf:DIR", "cluster": "FILE",
              "plan": "FILE", "storage": "DIR|s3://BUCKET/PREFIX"}
ABSOLUTE_PATHS = ("init_from", "tensorboard", "profile_cache")     # kept absolute in the job record


@dataclass(frozen=True, kw_only=True)
class Launch:
    """How `autohet train` runs a job; not part of the job record (`autohet resume` says its own)."""
    __pydantic_config__ = {"use_attribute_docstrings": True}     # job/schema.py: docstrings as descriptions

    steps: int
    """Train until this total step count."""
    emulate: bool = False
    """Emulated GPUs: pace each op to the profile's prediction (starts a local emulated cluster from the job's
    cluster unless --address or RAY_ADDRESS names one)."""

    def __post_init__(self):
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ConfigError(f"steps={self.steps!r} must be a positive integer")


def job_keys() -> list[str]:
    return [f.name for f in fields(TrainJob)] + [f.name for f in fields(Launch)]


def read_job_file(path: str) -> dict:
    """The fields a job file sets (a job record's `job`, when it is one); ConfigError naming the file and
    the field when a key is no field."""
    raw = mapping(read_structured(path, "job"), f"job file {path!r}")
    if set(raw) == {"job_id", "job"}:                  # a job record (job.json) read as a job file
        raw = mapping(raw["job"], f"job file {path!r}: job")
    for key in raw:
        if key not in job_keys():
            raise ConfigError(f"job file {path!r}: unknown field {key!r}; valid: {', '.join(job_keys())}")
    wrong = schema_errors(raw, job_schema())
    if wrong:
        raise ConfigError(f"job file {path!r}: {wrong} (the job file schema: docs/job-schema.json)")
    return dict(raw)


@functools.cache
def job_schema() -> dict:
    """The JSON Schema every job file is checked against (job/schema.py)."""
    return job_file_schema(Launch, REFERENCES)


def resolve(name: str, value, *, endpoint_url: str | None = None):
    """A field's value from what a job file or a flag gives: references loaded, paths made absolute."""
    if value is None:
        return None
    if name in ("model", "priced_as"):
        spec = load_model(value) if isinstance(value, str) else model_from_dict(mapping(value, name), source=name)
        return spec.to_dict()
    if name == "cluster":
        spec = load_cluster(value) if isinstance(value, str) else cluster_from_dict(mapping(value, name),
                                                                                    source=name)
        return spec.to_dict()
    if name == "plan":
        return (load_plan(value) if isinstance(value, str) else plan_from_dict(mapping(value, name))).to_dict()
    if name == "storage" and isinstance(value, str):
        return storage_spec(value, endpoint_url=endpoint_url)
    if name in ABSOLUTE_PATHS and isinstance(value, str):
        return os.path.abspath(value)
    return value


def merge(file_fields: dict, flag_fields: dict) -> dict:
    """The file's fields with the flags' over them; a nested mapping (optimizer) field by field."""
    out = dict(file_fields)
    for key, value in flag_fields.items():
        if isinstance(value, dict) and key not in REFERENCES and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def resolve_all(raw: dict, *, where: str | None, from_file: set, endpoint_url: str | None = None) -> dict:
    """Every field resolved; an error in one the file set names the file."""
    out = {}
    for name, value in raw.items():
        try:
            out[name] = resolve(name, value, endpoint_url=endpoint_url)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {name}: {exc}" if name in from_file and where else str(exc)) from None
    return out


def split_launch(raw: dict) -> tuple[dict, dict]:
    """(TrainJob fields, Launch fields) of a merged job."""
    launch_names = {f.name for f in fields(Launch)}
    return ({k: v for k, v in raw.items() if k not in launch_names},
            {k: v for k, v in raw.items() if k in launch_names})


def _required(name: str, what: str, where: str | None) -> ConfigError:
    flag = "--" + name.replace("_", "-")
    return ConfigError(f"{name}: {what}; give {flag}" + (f" or {name}: in {where}" if where else ""))


def build_launch(raw: dict, where: str | None) -> Launch:
    if "steps" not in raw:
        raise _required("steps", "how many steps to train", where)
    return dataclass_from_dict(Launch, raw, "launch")


def check_required(raw: dict, where: str | None) -> None:
    """ConfigError naming the first TrainJob field without a default that neither the file nor a flag gives."""
    for f in fields(TrainJob):
        if f.default is MISSING and f.default_factory is MISSING and raw.get(f.name) is None:
            raise _required(f.name, "the job needs one", where)


def file_names(raw: dict) -> set:
    """The fields a job file sets, a nested mapping's (optimizer) by their own names too."""
    names = set(raw)
    for key, value in raw.items():
        if isinstance(value, dict) and key not in REFERENCES:
            names |= set(value)
    return names


def blamed(exc: ConfigError, where: str | None, from_file: set) -> ConfigError:
    """`exc` naming the job file when the field it names (`name=...`) came from there."""
    found = re.search(r"(\w+)=", str(exc))
    if where and found and found.group(1) in from_file:
        return ConfigError(f"{where}: {exc}")
    return exc


if __name__ == "__main__":             # python -m autohet_ray.job.file > docs/job-schema.json
    print(json.dumps(job_schema(), indent=1))
