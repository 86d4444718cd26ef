"""Storage tiers behind one interface (`Tier`): memory (node keeper payload), local directory, S3, and a
bandwidth-capped wrapper for any of them."""
from autohet_ray.checkpoint.tiers.base import Tier
from autohet_ray.checkpoint.tiers.localdir import LocalDirTier
from autohet_ray.checkpoint.tiers.memory import MemoryTier
from autohet_ray.checkpoint.tiers.throttle import ThrottledTier, TokenBucket

__all__ = ["LocalDirTier", "MemoryTier", "ThrottledTier", "Tier", "TokenBucket"]
