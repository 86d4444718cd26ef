"""The step metrics as TensorBoard scalars (`autohet train --tensorboard DIR`), through
torch.utils.tensorboard.SummaryWriter, which needs the optional `tensorboard` package."""
from __future__ import annotations

import importlib

from autohet_ray import ConfigError

INSTALL_HINT = "pip install 'autohet_ray[tensorboard]'"
SCALARS = ("loss", "val_loss", "lr", "grad_norm", "tokens_per_s", "samples_per_s", "iteration_s", "mfu")
PER_KEY = {"mfu_by_device_type": "mfu", "model_tflops_per_gpu_by_device_type": "model_tflops_per_gpu",
           "peak_memory_bytes_per_device": "peak_memory_bytes"}


def check_available(logdir: str) -> None:
    """ConfigError (naming the install command) when TensorBoard events cannot be written."""
    try:
        importlib.import_module("tensorboard")
    except ImportError:
        raise ConfigError(f"tensorboard={logdir!r} needs the tensorboard package: {INSTALL_HINT}") from None


def scalars_of(metrics: dict) -> dict[str, float]:
    """Tag -> value of one step's metrics ("mfu/H100", "peak_memory_bytes/node0:1", ...); None values
    (e.g. CPU peak memory, which is not measured) are left out."""
    out = {k: float(metrics[k]) for k in SCALARS if metrics.get(k) is not None}
    for key, prefix in PER_KEY.items():
        for name, value in (metrics.get(key) or {}).items():
            if value is not None:
                out[f"{prefix}/{name}"] = float(value)
    return out


class TensorBoardLog:
    """One SummaryWriter over `logdir`; `append(metrics)` writes a step's scalars at its step number."""

    def __init__(self, logdir: str):
        check_available(logdir)
        from torch.utils.tensorboard import SummaryWriter  # lazy: torch and the optional tensorboard package
        self.writer = SummaryWriter(log_dir=logdir)

    def append(self, metrics: dict) -> None:
        for tag, value in scalars_of(metrics).items():
            self.writer.add_scalar(tag, value, global_step=metrics["step"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
