"""S3 tier via boto3 (any endpoint URL: AWS, MinIO, moto's server).

Big chunks go up as multipart uploads whose parts run on a thread pool; botocore's "standard" retry mode
retries throttling and transient errors. S3 servers differ in checksum enforcement (moto accepts wrong
ones), so integrity is always checked client side against the manifest's hash. Manifests are committed
with a conditional PUT (`IfNoneMatch='*'`): at most one manifest per step, never overwritten.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timezone

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError

from autohet_ray import ConfigError
from autohet_ray.checkpoint.errors import ChunkMissingError, TierUnavailableError
from autohet_ray.checkpoint.faults import NO_FAULTS, Faults
from autohet_ray.checkpoint.keys import MANIFEST_PREFIX, manifest_key, step_of_key, step_of_manifest_key
from autohet_ray.checkpoint.tiers.base import resolve_existing_manifest

MiB = 1 << 20
_MISSING = {"NoSuchKey", "404", "NotFound"}
S3_DELETE_BATCH = 1000           # DeleteObjects takes at most 1000 keys per request


@dataclass(frozen=True, kw_only=True)
class S3Config:
    bucket: str
    """Bucket name (must exist)."""
    prefix: str = ""
    """Key prefix of this job's checkpoints, e.g. "jobs/run-7/" (empty or ending in '/')."""
    endpoint_url: str | None = None
    """S3 API endpoint; None for AWS's default."""
    region: str = "us-east-1"
    multipart_threshold: int = 64 * MiB
    """Chunks of at least this many bytes are uploaded in parts."""
    part_size: int = 16 * MiB
    """Size of each part (S3 needs >= 5 MiB except the last)."""
    num_upload_threads: int = 8
    """Parts uploaded at once per multipart upload."""
    max_attempts: int = 5
    """botocore attempts per request (standard retry mode: throttling, 5xx, connection errors)."""
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0

    def __post_init__(self):
        if not self.bucket:
            raise ConfigError("S3Config.bucket must be a bucket name, got an empty string")
        if self.prefix and not self.prefix.endswith("/"):
            raise ConfigError(f"S3Config.prefix must be empty or end with '/', got {self.prefix!r}")
        if self.part_size < 5 * MiB:
            raise ConfigError(f"S3Config.part_size must be >= 5 MiB (S3's minimum part), got {self.part_size}")
        if self.multipart_threshold < self.part_size:
            raise ConfigError(f"S3Config.multipart_threshold ({self.multipart_threshold}) must be >= "
                              f"part_size ({self.part_size})")
        if self.num_upload_threads < 1 or self.max_attempts < 1:
            raise ConfigError(f"S3Config: num_upload_threads ({self.num_upload_threads}) and max_attempts "
                              f"({self.max_attempts}) must be >= 1")


def make_client(config: S3Config, session=None):
    """A boto3 S3 client for `config` (credentials from the usual environment/config chain, as `session`, by
    default boto3's process-wide one, resolved and cached them)."""
    botocore_config = Config(
        region_name=config.region,
        retries={"max_attempts": config.max_attempts, "mode": "standard"},
        max_pool_connections=max(10, 2 * config.num_upload_threads),
        connect_timeout=config.connect_timeout_s, read_timeout=config.read_timeout_s,
    )
    return (session or boto3).client("s3", endpoint_url=config.endpoint_url, config=botocore_config)


def check_bucket(config: S3Config) -> None:
    """ConfigError, saying what is wrong, unless the bucket answers these credentials (HeadBucket, two quick
    attempts: a job should not start, then fail at its first upload)."""
    where = f"s3://{config.bucket}/{config.prefix}" + (f" at {config.endpoint_url}" if config.endpoint_url else "")
    client = make_client(replace(config, max_attempts=2, connect_timeout_s=5.0, read_timeout_s=10.0),
                         boto3.session.Session())          # credentials as they are now, not as first cached
    try:
        client.head_bucket(Bucket=config.bucket)
    except NoCredentialsError:
        raise ConfigError(f"{where}: no AWS credentials found; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                          "(or AWS_PROFILE, or run where an instance role applies)") from None
    except EndpointConnectionError as err:
        raise ConfigError(f"{where}: cannot reach the S3 endpoint ({err})") from None
    except ClientError as err:
        code = _code(err)
        what = ("the bucket does not exist" if code in _MISSING | {"NoSuchBucket"} else
                "access denied to the bucket with these credentials" if code in ("403", "AccessDenied", "Forbidden")
                else f"HeadBucket failed ({code or err})")
        raise ConfigError(f"{where}: {what}") from None
    except BotoCoreError as err:
        raise ConfigError(f"{where}: {err}") from None


def _code(err: ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


class S3Tier:
    def __init__(self, config: S3Config, *, name: str = "s3", client=None, faults: Faults = NO_FAULTS):
        self.name, self.config, self.faults = name, config, faults
        self.client = client if client is not None else make_client(config)
        self._parts_pool = ThreadPoolExecutor(config.num_upload_threads, thread_name_prefix=f"{name}-part")

    def _key(self, key: str) -> str:
        return self.config.prefix + key

    def _unavailable(self, what: str, err: Exception) -> TierUnavailableError:
        return TierUnavailableError(self.name, f"{what}: {err}")

    # chunks -----------------------------------------------------------------------------------------
    def put_chunk(self, key: str, blob: bytes) -> None:
        try:
            if len(blob) >= self.config.multipart_threshold:
                self._put_multipart(self._key(key), blob)
            else:
                self.client.put_object(Bucket=self.config.bucket, Key=self._key(key), Body=blob)
        except (ClientError, BotoCoreError) as err:
            raise self._unavailable(f"put {key!r}", err) from err

    def _put_multipart(self, s3_key: str, blob: bytes) -> None:
        bucket, size = self.config.bucket, self.config.part_size
        upload_id = self.client.create_multipart_upload(Bucket=bucket, Key=s3_key)["UploadId"]
        try:
            def put_part(number: int) -> dict:
                body = blob[(number - 1) * size: number * size]
                etag = self.client.upload_part(Bucket=bucket, Key=s3_key, UploadId=upload_id,
                                               PartNumber=number, Body=body)["ETag"]
                self.faults.maybe_fail("upload_part")
                return {"ETag": etag, "PartNumber": number}

            numbers = range(1, -(-len(blob) // size) + 1)
            parts = list(self._parts_pool.map(put_part, numbers))
            self.client.complete_multipart_upload(Bucket=bucket, Key=s3_key, UploadId=upload_id,
                                                  MultipartUpload={"Parts": parts})
        except BaseException:
            self._abort_quietly(s3_key, upload_id)   # best effort; the sweep removes what this misses
            raise

    def _abort_quietly(self, s3_key: str, upload_id: str) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=self.config.bucket, Key=s3_key, UploadId=upload_id)
        except (ClientError, BotoCoreError):
            pass

    def _get(self, s3_key: str, what: str) -> bytes:
        """One ranged GET of the first part; a big object's other parts are fetched in parallel."""
        try:
            first = self._get_range(s3_key, 0)
            total = int(first["ContentRange"].rsplit("/", 1)[1]) if first.get("ContentRange") else None
            head = first["Body"].read()
            if total is None or total <= len(head):
                return head
            starts = range(self.config.part_size, total, self.config.part_size)
            rest = self._parts_pool.map(lambda start: self._get_range(s3_key, start)["Body"].read(), starts)
            return b"".join([head, *rest])
        except ClientError as err:
            if _code(err) in _MISSING:
                raise ChunkMissingError(what, self.name) from None
            if _code(err) == "InvalidRange":             # an empty object has no byte 0
                return self.client.get_object(Bucket=self.config.bucket, Key=s3_key)["Body"].read()
            raise self._unavailable(f"get {what!r}", err) from err
        except BotoCoreError as err:
            raise self._unavailable(f"get {what!r}", err) from err

    def _get_range(self, s3_key: str, start: int) -> dict:
        end = start + self.config.part_size - 1
        return self.client.get_object(Bucket=self.config.bucket, Key=s3_key, Range=f"bytes={start}-{end}")

    def get_chunk(self, key: str) -> bytes:
        return self._get(self._key(key), key)

    def has(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.config.bucket, Key=self._key(key))
            return True
        except ClientError as err:
            if _code(err) in _MISSING:
                return False
            raise self._unavailable(f"head {key!r}", err) from err

    def list(self, prefix: str = "") -> list[str]:
        return [k for k in self._list_all(prefix) if not k.startswith(MANIFEST_PREFIX)]

    def _list_all(self, prefix: str) -> list[str]:
        keys = []
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.config.bucket, Prefix=self._key(prefix))
        for page in pages:
            keys.extend(obj["Key"][len(self.config.prefix):] for obj in page.get("Contents", []))
        return sorted(keys)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.config.bucket, Key=self._key(key))

    def delete_many(self, keys: list[str]) -> None:
        """DeleteObjects, up to S3's 1000 keys per request; a key it could not delete is an error."""
        for start in range(0, len(keys), S3_DELETE_BATCH):
            batch = [{"Key": self._key(k)} for k in keys[start:start + S3_DELETE_BATCH]]
            try:
                reply = self.client.delete_objects(Bucket=self.config.bucket,
                                                   Delete={"Objects": batch, "Quiet": True})
            except ClientError as err:
                raise self._unavailable(f"delete {len(batch)} keys", err) from err
            failed = reply.get("Errors", [])
            if failed:
                raise TierUnavailableError(self.name, f"delete: {len(failed)} of {len(batch)} keys failed, "
                                                      f"first {failed[0].get('Key')!r}: {failed[0].get('Code')}")

    # manifests --------------------------------------------------------------------------------------
    def put_manifest(self, step: int, body: bytes) -> None:
        s3_key = self._key(manifest_key(step))
        for _ in range(self.config.max_attempts):
            try:
                self.client.put_object(Bucket=self.config.bucket, Key=s3_key, Body=body, IfNoneMatch="*")
                return
            except ClientError as err:
                if _code(err) == "ConditionalRequestConflict":     # 409: a concurrent create; retry
                    time.sleep(0.05)
                    continue
                if _code(err) != "PreconditionFailed":
                    raise self._unavailable(f"commit manifest of step {step}", err) from err
                resolve_existing_manifest(self.name, step, self._get(s3_key, manifest_key(step)), body)
                return
        raise TierUnavailableError(self.name, f"manifest of step {step}: conditional PUT kept conflicting")

    def get_manifest(self, step: int) -> bytes:
        return self._get(self._key(manifest_key(step)), manifest_key(step))

    def list_manifests(self) -> list[int]:
        steps = (step_of_manifest_key(k) for k in self._list_all(MANIFEST_PREFIX))
        return sorted(s for s in steps if s is not None)

    def delete_manifest(self, step: int) -> None:
        self.delete(manifest_key(step))

    # maintenance ------------------------------------------------------------------------------------
    def sweep_multipart(self, older_than_s: float | None = None, *, through_step: int | None = None) -> list[str]:
        """Abort multipart uploads under this prefix that a dead writer left (invisible, but billed):
        those initiated more than `older_than_s` ago, and those of chunk keys of steps <= `through_step`
        (e.g. the newest committed step: nobody still writes those). Returns the keys aborted."""
        if older_than_s is None and through_step is None:
            raise ConfigError("sweep_multipart needs older_than_s or through_step (or both)")
        cutoff = None if older_than_s is None else datetime.now(timezone.utc).timestamp() - older_than_s
        aborted = []
        pages = self.client.get_paginator("list_multipart_uploads").paginate(
            Bucket=self.config.bucket, Prefix=self.config.prefix)
        for page in pages:
            for upload in page.get("Uploads", []):
                key = upload["Key"][len(self.config.prefix):]
                step = step_of_key(key)
                old = cutoff is not None and upload["Initiated"].timestamp() <= cutoff
                superseded = through_step is not None and step is not None and step <= through_step
                if old or superseded:
                    self.client.abort_multipart_upload(Bucket=self.config.bucket, Key=upload["Key"],
                                                       UploadId=upload["UploadId"])
                    aborted.append(key)
        return sorted(aborted)

    def multipart_ids(self) -> dict[str, str]:
        """Upload id -> key of the multipart uploads in progress (or abandoned) under this prefix."""
        pages = self.client.get_paginator("list_multipart_uploads").paginate(
            Bucket=self.config.bucket, Prefix=self.config.prefix)
        return {u["UploadId"]: u["Key"][len(self.config.prefix):] for p in pages for u in p.get("Uploads", [])}

    def abort_multipart(self, upload_ids) -> list[str]:
        """Abort those of these uploads that are still pending; returns their keys."""
        pending = self.multipart_ids()
        aborted = []
        for upload_id in sorted(set(upload_ids) & set(pending)):
            self.client.abort_multipart_upload(Bucket=self.config.bucket, Key=self._key(pending[upload_id]),
                                               UploadId=upload_id)
            aborted.append(pending[upload_id])
        return sorted(aborted)

    def pending_multipart(self) -> list[str]:
        """Keys of multipart uploads in progress (or abandoned) under this prefix."""
        pages = self.client.get_paginator("list_multipart_uploads").paginate(
            Bucket=self.config.bucket, Prefix=self.config.prefix)
        return sorted(u["Key"][len(self.config.prefix):] for p in pages for u in p.get("Uploads", []))

    def close(self) -> None:
        self._parts_pool.shutdown(wait=True)
