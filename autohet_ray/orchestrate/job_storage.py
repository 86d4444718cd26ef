"""Where `autohet train` keeps its plan and per-step metrics: a local directory or s3://bucket/prefix."""
from __future__ import annotations

import os

from autohet_ray.orchestrate.elastic_tiers import storage_spec


def write_text(storage: str, name: str, text: str, endpoint_url: str | None = None) -> str:
    """Write `name` under `storage` (atomically in a directory: write, then rename); returns its location.
    S3 goes through boto3 (endpoint from `endpoint_url` or AWS_ENDPOINT_URL, credentials as boto3 finds them)."""
    spec = storage_spec(storage)
    if spec["kind"] == "dir":
        os.makedirs(spec["path"], exist_ok=True)
        path = os.path.join(spec["path"], name)
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
        return path
    from autohet_ray.checkpoint.tiers.s3 import S3Config, make_client
    key = spec["prefix"] + name
    endpoint_url = endpoint_url or os.environ.get("AWS_ENDPOINT_URL")
    client = make_client(S3Config(bucket=spec["bucket"], endpoint_url=endpoint_url))
    client.put_object(Bucket=spec["bucket"], Key=key, Body=text.encode())
    return f"s3://{spec['bucket']}/{key}"
