"""Torch runtime: TP layers, stage modules, inter-stage bridge, pipeline schedules, layer-wise grad sync.

The names below load on first use, so pure submodules (lr_schedule) import without torch."""
__all__ = ["Engine", "Reference", "run_world"]


def __getattr__(name: str):
    if name == "Engine":
        from autohet_ray.runtime.engine import Engine  # lazy: torch; pure submodules import without it
        return Engine
    if name == "Reference":
        from autohet_ray.runtime.reference import Reference  # lazy: torch; pure submodules import without it
        return Reference
    if name == "run_world":
        from autohet_ray.runtime.launch import run_world  # lazy: torch; pure submodules import without it
        return run_world
    raise AttributeError(f"module 'autohet_ray.runtime' has no attribute {name!r}")
