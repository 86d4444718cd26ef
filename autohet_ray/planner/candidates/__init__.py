"""What the planner's search pass builds, one micro-batch size at a time (per_size.py): the search space (space.py,
templates.py), device groupings by SCIP (grouping.py; every one on small clusters: enumerate_groupings.py; money:
money.py), the exact layer split (split.py) and micro-batch allocation (batch.py), placement on nodes (assign.py),
what the search keeps (best.py) and a cheap floor under a plan's time (floor.py)."""
