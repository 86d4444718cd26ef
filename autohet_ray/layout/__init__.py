"""Layout algebra shared by the runtime's cross-TP gradient sync and checkpoint resharding.

A tensor's layout is its global shape plus the rectangular chunk each holder keeps. A chunk is given by
per-dimension offsets and sizes in global coordinates. Pure Python: no torch, no numpy.
"""
from autohet_ray.layout.chunks import (Chunk, covers_exactly, even_split, overlap, shard_chunk, split_sizes,
                                       to_local)

__all__ = ["Chunk", "covers_exactly", "even_split", "overlap", "shard_chunk", "split_sizes", "to_local"]
