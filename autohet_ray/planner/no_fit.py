"""The message of a request nothing fits (split out of search.py, which is at its size limit)."""
from __future__ import annotations

from autohet_ray.cluster.spec import Cluster
from autohet_ray.model.costs import layer_params
from autohet_ray.model.spec import ModelSpec
from autohet_ray.profile.db import ProfileDB
from autohet_ray.profile.precision import profile_precision


def no_fit_message(cluster: Cluster, model: ModelSpec, profile: ProfileDB, seq_len: int) -> str:
    need = sum(layer_params(model, k) * (model.num_layers if k == "layer" else 1)
               for k in ("embedding", "layer", "head")) * profile_precision(profile).state_bytes_per_param
    have = sum(cluster.device(n.device).memory_bytes * n.count for n in cluster.nodes)
    return (f"{model.name} fits nowhere on cluster {cluster.name!r}: its weights, gradients and optimizer state "
            f"alone need {need / 1e9:.1f} GB; the cluster's {cluster.num_gpus} GPUs hold {have / 1e9:.1f} GB "
            f"(missing {max(0.0, need - have) / 1e9:.1f} GB before activations), or no pipeline of at most "
            f"{model.num_layers} stages holds it at seq_len={seq_len}")
