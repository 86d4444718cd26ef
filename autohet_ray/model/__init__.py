from autohet_ray.model.costs import (LAYER_KINDS, activation_bytes_per_token, layer_flops_per_token,
                                     layer_params)
from autohet_ray.model.spec import PRESETS, ModelSpec, load_model, model_from_dict

__all__ = ["LAYER_KINDS", "activation_bytes_per_token", "layer_flops_per_token", "layer_params",
           "PRESETS", "ModelSpec", "load_model", "model_from_dict"]
