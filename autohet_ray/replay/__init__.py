"""Spot replay, simulated: availability traces, the best plan per availability state (the real planner, timed),
and goodput accounting for ours, checkpoint-restart and no re-planning on one clock. Pure: cost model and
planner only, no Ray (the emulated replay reuses the traces, timeline and accounting)."""
