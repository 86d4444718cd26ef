"""What autograd keeps for backward: the bytes of the distinct storages saved while a module runs (checked
against model/costs.activation_bytes_per_token by tests/unit/test_activation_memory.py and
benchmarks/sharding_activation_check.py)."""
from __future__ import annotations

import torch


def saved_bytes(fn, x: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd saves while running fn(x), not counting x's own (a view saved
    twice, or a tensor and its view, count once)."""
    seen = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn(x)
    seen.pop(x.untyped_storage().data_ptr(), None)
    return sum(seen.values())
