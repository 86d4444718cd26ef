"""The job's files beside its checkpoints in its storage (a tier spec, storage/spec.py): job.json (the job id and
config), profile.json (the profile every plan is priced with), plan.json (the plan running now) and
metrics.jsonl (one line per step, appended as each step completes)."""
from __future__ import annotations

import os

from autohet_ray.storage.spec import location

JOB_FILE, PROFILE_FILE, PLAN_FILE, METRICS_FILE = "job.json", "profile.json", "plan.json", "metrics.jsonl"


def _s3(spec: dict):
    from autohet_ray.checkpoint.tiers.s3 import S3Config, make_client
    endpoint_url = spec.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL")
    return make_client(S3Config(bucket=spec["bucket"], endpoint_url=endpoint_url))


def write_text(spec: dict, name: str, text: str) -> str:
    """Write `name` under the storage (atomically in a directory: write, then rename); returns its location.
    S3 goes through boto3 (endpoint from the spec or AWS_ENDPOINT_URL, credentials as boto3 finds them)."""
    if spec["kind"] == "dir":
        os.makedirs(spec["path"], exist_ok=True)
        path = location(spec, name)
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
        return path
    _s3(spec).put_object(Bucket=spec["bucket"], Key=spec.get("prefix", "") + name, Body=text.encode())
    return location(spec, name)


def read_text(spec: dict, name: str) -> str | None:
    """The text of `name` under the storage, None when there is none."""
    if spec["kind"] == "dir":
        try:
            with open(location(spec, name)) as f:
                return f.read()
        except FileNotFoundError:
            return None
    client = _s3(spec)
    try:
        return client.get_object(Bucket=spec["bucket"], Key=spec.get("prefix", "") + name)["Body"].read().decode()
    except client.exceptions.NoSuchKey:
        return None


class LineLog:
    """A text file of the storage that grows by one line at a time, durable after each `append` (a directory:
    appended and flushed; S3, which cannot append: the whole object rewritten)."""

    def __init__(self, spec: dict, name: str):
        self.spec, self.name = spec, name
        self.text = read_text(spec, name) or ""

    def append(self, line: str) -> None:
        assert "\n" not in line, line
        self.text += line + "\n"
        if self.spec["kind"] == "dir":
            os.makedirs(self.spec["path"], exist_ok=True)
            with open(location(self.spec, self.name), "a") as f:
                f.write(line + "\n")
        else:
            write_text(self.spec, self.name, self.text)
