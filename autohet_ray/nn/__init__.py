"""Plain torch transformer modules (gpt, llama, bert) built from a ModelSpec, with deterministic init."""
from autohet_ray.nn.init import init_chunk, init_rule, materialize
from autohet_ray.nn.model import Embedding, Head, StageModel, build_model, param_shapes

__all__ = ["Embedding", "Head", "StageModel", "build_model", "init_chunk", "init_rule", "materialize", "param_shapes"]
