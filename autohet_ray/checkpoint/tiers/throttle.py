"""A token-bucket bandwidth cap around any tier, to emulate a realistic link to S3 in benchmarks.

    storage = ThrottledTier(S3Tier(cfg), rate_bytes_per_s=20 * MiB)

Uploads wait for tokens before sending, downloads after receiving (their size is known only then); both
directions share one bucket, like one NIC. Big transfers take tokens in slices so concurrent transfers
share the rate fairly.
"""
from __future__ import annotations

import threading
import time

from autohet_ray import ConfigError


class TokenBucket:
    def __init__(self, rate_bytes_per_s: float, burst_bytes: int | None = None, *, clock=time.monotonic,
                 sleep=time.sleep):
        if rate_bytes_per_s <= 0:
            raise ConfigError(f"TokenBucket rate must be > 0 bytes/s, got {rate_bytes_per_s!r}")
        burst = int(burst_bytes if burst_bytes is not None else max(1, rate_bytes_per_s // 10))
        if burst < 1:
            raise ConfigError(f"TokenBucket burst must be >= 1 byte, got {burst_bytes!r}")
        self.rate, self.burst = float(rate_bytes_per_s), burst
        self._clock, self._sleep = clock, sleep
        self._tokens, self._stamp = float(burst), clock()
        self._lock = threading.Lock()
        self.total_bytes = 0
        self.waited_s = 0.0

    def _take(self, amount: int) -> float:
        """Take `amount` (<= burst) tokens, going into debt; return how long the caller must wait."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            self._tokens -= amount
            self.total_bytes += amount
            return max(0.0, -self._tokens / self.rate)

    def consume(self, nbytes: int) -> None:
        """Block until `nbytes` may pass."""
        remaining = int(nbytes)
        while remaining > 0:
            piece = min(remaining, self.burst)
            wait = self._take(piece)
            if wait > 0:
                self._sleep(wait)
                with self._lock:
                    self.waited_s += wait
            remaining -= piece


class ThrottledTier:
    """Delegates to `inner`, charging every chunk and manifest byte against a shared TokenBucket."""

    def __init__(self, inner, rate_bytes_per_s: float | None = None, *, bucket: TokenBucket | None = None,
                 burst_bytes: int | None = None):
        if (rate_bytes_per_s is None) == (bucket is None):
            raise ConfigError("ThrottledTier needs exactly one of rate_bytes_per_s or bucket")
        self.inner = inner
        self.name = inner.name
        self.bucket = bucket or TokenBucket(rate_bytes_per_s, burst_bytes)

    def put_chunk(self, key: str, blob: bytes) -> None:
        self.bucket.consume(len(blob))
        self.inner.put_chunk(key, blob)

    def put_chunks(self, items: list[tuple[str, bytes]]) -> None:
        """Defined so that a batching inner tier's put_chunks never bypasses the bucket."""
        for key, blob in items:
            self.put_chunk(key, blob)

    def get_chunk(self, key: str) -> bytes:
        blob = self.inner.get_chunk(key)
        self.bucket.consume(len(blob))
        return blob

    def put_manifest(self, step: int, body: bytes) -> None:
        self.bucket.consume(len(body))
        self.inner.put_manifest(step, body)

    def get_manifest(self, step: int) -> bytes:
        body = self.inner.get_manifest(step)
        self.bucket.consume(len(body))
        return body

    def has(self, key: str) -> bool:
        return self.inner.has(key)

    def list(self, prefix: str = "") -> list[str]:
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def delete_many(self, keys: list[str]) -> None:
        self.inner.delete_many(keys)

    def list_manifests(self) -> list[int]:
        return self.inner.list_manifests()

    def delete_manifest(self, step: int) -> None:
        self.inner.delete_manifest(step)

    def __getattr__(self, attr):          # tier-specific maintenance (sweep_multipart, ...) passes through
        return getattr(self.inner, attr)
