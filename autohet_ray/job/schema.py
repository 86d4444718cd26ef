"""The JSON Schema of a job file, generated from TrainJob and Launch by pydantic's TypeAdapter (each field's type,
choices, default and docstring); `docs/job-schema.json` is its published copy (regenerate with
`python -m autohet_ray.job.file > docs/job-schema.json`), and job/file.py checks every job file against it.

A job file may name a mapping field by reference (`model: small-gpt`, `cluster: FILE`): those fields take text
as well as a mapping."""
from __future__ import annotations

from dataclasses import fields

from autohet_ray.job.config import TrainJob

SCHEMA_URL = "https://json-schema.org/draft/2020-12/schema"
TYPE_WORDS = {"integer": "an integer", "number": "a number", "string": "text", "object": "a mapping",
              "boolean": "true or false", "array": "a list", "null": "none"}


def job_file_schema(launch_cls, references: dict) -> dict:
    """The schema of a job file: TrainJob's fields and `launch_cls`'s, no others; the fields in `references`
    also as text."""
    from pydantic import TypeAdapter  # lazy: pydantic (a slow import; only a job file's check needs it)
    job, launch = TypeAdapter(TrainJob).json_schema(), TypeAdapter(launch_cls).json_schema()
    for name, metavar in references.items():
        prop = job["properties"][name]
        prop.pop("additionalProperties", None)
        kinds = prop.pop("anyOf", None) or [{"type": prop.pop("type")}]
        prop["anyOf"] = [{"type": "string", "description": metavar}, *kinds]
    schema = {"$schema": SCHEMA_URL, "title": "autohet job file",
              "description": "A whole training job for `autohet train --config FILE` and `autohet plan --config "
                             "FILE`: TrainJob's fields and Launch's.",
              "type": "object", "properties": job["properties"] | launch["properties"],
              "required": sorted(set(job.get("required", [])) | set(launch.get("required", []))),
              "additionalProperties": False, "$defs": job.get("$defs", {})}
    for definition in schema["$defs"].values():
        definition["additionalProperties"] = False
    assert set(schema["properties"]) == {f.name for f in fields(TrainJob)} | {f.name for f in fields(launch_cls)}
    return schema


def schema_errors(raw: dict, schema: dict) -> str | None:
    """The first way `raw` breaks `schema`, as `field: what is wrong`; None when it conforms. `required` is not
    checked here: a flag may give a required field."""
    from jsonschema import Draft202012Validator  # lazy: jsonschema (only a job file's check needs it)
    lenient = schema | {"required": []}
    errors = sorted(Draft202012Validator(lenient).iter_errors(raw), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    return _short(errors[0], ".".join(map(str, errors[0].absolute_path)))


def _short(error, where: str) -> str:
    """One line naming the field, its value and what the schema wants."""
    if error.validator == "enum":
        return f"{where}={error.instance!r}; valid: {', '.join(map(str, error.validator_value))}"
    if error.validator in ("type", "anyOf"):
        kinds = [error.validator_value] if error.validator == "type" else \
            [k.get("type", "?") for k in error.validator_value]
        return f"{where}={error.instance!r} must be {' or '.join(TYPE_WORDS.get(k, str(k)) for k in kinds)}"
    return f"{where or 'the file'}: {error.message.splitlines()[0]}"
