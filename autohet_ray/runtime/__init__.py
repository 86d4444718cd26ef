"""Torch runtime: TP layers, stage modules, inter-stage bridge, pipeline schedules, layer-wise grad sync."""
from autohet_ray.runtime.engine import Engine
from autohet_ray.runtime.launch import run_world
from autohet_ray.runtime.reference import Reference

__all__ = ["Engine", "Reference", "run_world"]
