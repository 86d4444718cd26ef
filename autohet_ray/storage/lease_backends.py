"""Create-if-absent, read and conditional remove of one small object (the storage lease, storage/lease.py), in a
directory or on S3. `read()` gives (the parsed record or None when it is not a JSON object, a version) or None
when there is no object; `remove(version)` removes the object only if it is still that version."""
from __future__ import annotations

import json
import os
import uuid

from autohet_ray import ConfigError
from autohet_ray.storage.spec import location

_TMP_MARK = ".tmp-"            # as the directory tier names its temporaries (swept, never listed)


def _parsed(raw: bytes) -> dict | None:
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


class DirObject:
    """`<dir>/<name>`, created by hard-linking a complete temporary file (the link fails if the name exists)."""

    def __init__(self, directory: str, name: str):
        self.directory, self.path = directory, os.path.join(directory, name)

    def _aside(self) -> str:
        return os.path.join(self.directory, f".{os.path.basename(self.path)}{_TMP_MARK}{uuid.uuid4().hex}")

    def create(self, body: bytes) -> bool:
        os.makedirs(self.directory, exist_ok=True)
        tmp = self._aside()
        with open(tmp, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, self.path)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        self._sync_directory()
        return True

    def _sync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def read(self) -> tuple[dict | None, bytes] | None:
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        return _parsed(raw), raw

    def remove(self, version: bytes) -> bool:
        """Move the file aside (atomic), then keep it removed only if it was `version`; another one is put
        back."""
        aside = self._aside()
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False
        try:
            with open(aside, "rb") as f:
                if f.read() == version:
                    return True
            try:
                os.link(aside, self.path)         # not the one judged: it goes back
            except FileExistsError:
                pass
            return False
        finally:
            os.unlink(aside)
            self._sync_directory()


class S3Object:
    """`s3://bucket/prefix<name>`: created with `If-None-Match: *`, removed with `If-Match: <ETag>`."""

    CONFLICT = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}
    MISSING = {"NoSuchKey", "404", "NotFound"}

    def __init__(self, spec: dict, name: str):
        from autohet_ray.checkpoint.tiers.s3 import S3Config, make_client  # lazy: boto3, for S3 only
        endpoint_url = spec.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL")
        self.client = make_client(S3Config(bucket=spec["bucket"], endpoint_url=endpoint_url))
        self.bucket, self.key, self.where = spec["bucket"], spec.get("prefix", "") + name, location(spec, name)

    def _code(self, err) -> str:
        return str(err.response.get("Error", {}).get("Code", ""))

    def create(self, body: bytes) -> bool:
        from botocore.exceptions import ClientError  # lazy: botocore, for S3 only
        try:
            self.client.put_object(Bucket=self.bucket, Key=self.key, Body=body, IfNoneMatch="*")
        except ClientError as err:
            if self._code(err) in self.CONFLICT:
                return False
            raise ConfigError(f"{self.where}: the lease cannot be written ({self._code(err) or err})") from None
        return True

    def read(self) -> tuple[dict | None, str] | None:
        from botocore.exceptions import ClientError  # lazy: botocore, for S3 only
        try:
            got = self.client.get_object(Bucket=self.bucket, Key=self.key)
        except ClientError as err:
            if self._code(err) in self.MISSING:
                return None
            raise ConfigError(f"{self.where}: the lease cannot be read ({self._code(err) or err})") from None
        return _parsed(got["Body"].read()), got["ETag"]

    def remove(self, version: str) -> bool:
        from botocore.exceptions import ClientError  # lazy: botocore, for S3 only
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=version)
        except ClientError as err:
            if self._code(err) in self.CONFLICT | self.MISSING:
                return False
            raise ConfigError(f"{self.where}: the lease cannot be removed ({self._code(err) or err})") from None
        return True


def backend(spec: dict, name: str):
    """The object `name` of a storage spec (storage/spec.py)."""
    if spec["kind"] == "dir":
        return DirObject(spec["path"], name)
    assert spec["kind"] == "s3", spec
    return S3Object(spec, name)
