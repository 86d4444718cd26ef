"""Errors of the checkpoint layer. Each names the chunk and the step it concerns."""
from __future__ import annotations


class CheckpointError(Exception):
    """Base class of checkpoint failures (an Exception, unlike DCP's CheckpointException)."""


class CorruptChunkError(CheckpointError):
    """A chunk's bytes do not match the hash its manifest records (flipped bit, truncation, wrong header)."""

    def __init__(self, key: str, step: int, tier: str, reason: str):
        self.key, self.step, self.tier, self.reason = key, step, tier, reason
        super().__init__(f"chunk {key!r} of step {step} from tier {tier!r} is corrupt: {reason}")


class ChunkMissingError(CheckpointError, KeyError):
    """A tier does not hold the requested chunk (or manifest)."""

    def __init__(self, key: str, tier: str):
        self.key, self.tier = key, tier
        super().__init__(f"tier {tier!r} holds no object {key!r}")

    def __str__(self) -> str:                     # KeyError would quote the whole message
        return self.args[0]


class TierUnavailableError(CheckpointError):
    """The tier itself cannot answer (its node died, its endpoint is down after retries)."""

    def __init__(self, tier: str, reason: str):
        self.tier, self.reason = tier, reason
        super().__init__(f"tier {tier!r} is unavailable: {reason}")


class ChunkUnavailableError(CheckpointError):
    """No tier holds a valid copy of a chunk the restore needs."""

    def __init__(self, key: str, step: int, attempts: list[str]):
        self.key, self.step, self.attempts = key, step, list(attempts)
        tried = "; ".join(attempts) or "no tier configured"
        super().__init__(f"no valid copy of chunk {key!r} of step {step} in any tier ({tried})")


class ManifestExistsError(CheckpointError):
    """A different manifest for this step is already committed (conditional create lost)."""

    def __init__(self, step: int, tier: str):
        self.step, self.tier = step, tier
        super().__init__(f"tier {tier!r} already holds a different committed manifest for step {step}")


class IncompleteStepError(CheckpointError):
    """A step's records do not cover every tensor exactly, mix steps, or disagree about a chunk's bytes."""

    def __init__(self, step: int, problems: list[str]):
        self.step, self.problems = step, list(problems)
        super().__init__(f"step {step} is not usable: " + "; ".join(problems[:8])
                         + (f" (+{len(problems) - 8} more)" if len(problems) > 8 else ""))


class InjectedFault(CheckpointError):
    """Raised by a Faults hook at a named point (tests only)."""

    def __init__(self, point: str, hit: int):
        self.point, self.hit = point, hit
        super().__init__(f"injected fault at {point!r} (hit {hit})")
