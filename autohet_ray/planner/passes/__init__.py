"""The passes that improve plans the search found, in the order of planner/search.py's PASSES: stage order
(polish.py), local moves in the full cost model (refine.py), per-pipeline micro-batch sizes (rebalance.py); and the
choices run around a whole search: activation recomputation (recompute.py) and sharded optimizer state
(sharding.py, with its uneven slices in slice_sizes.py)."""
