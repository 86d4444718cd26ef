"""What the replay prices as each GPU's snapshot (benchmarks/spot_replay_snapshot.py): one writer per unique
chunk and node-store copy, so a data-parallel copy adds nothing to the bytes written, while the replay's
earlier model counted every holder's copy."""
from __future__ import annotations

import torch

from autohet_ray.model.costs import layer_params
from autohet_ray.model.spec import load_model
from autohet_ray.plan.schema import plan_from_dict

from benchmarks.spot_replay_snapshot import snapshot_bytes  # noqa: E402


def stage(layers, tp, device, node, devices):
    return {"layers": list(layers), "tp": tp, "device_type": device, "node": node, "devices": list(devices)}


def plan(pipelines: list[list[dict]]) -> dict:
    return {"schema_version": 1, "model": "tiny-gpt", "global_batch": 4 * len(pipelines), "micro_batch": 1,
            "seq_len": 16, "pipelines": [{"num_microbatches": 4, "stages": s} for s in pipelines]}


SPEC = load_model("tiny-gpt")
NODE_GPU = {"a": "H800", "b": "H800", "c": "H20", "d": "H20"}
ONE = [stage((0, 2), 2, "H20", "c", (0, 1)), stage((2, 4), 1, "H800", "a", (0,))]
TWO = [stage((0, 2), 2, "H20", "d", (0, 1)), stage((2, 4), 1, "H800", "b", (0,))]


def test_unique_state_is_the_model_once_and_a_data_parallel_copy_adds_no_writes():
    params = SPEC.num_layers * layer_params(SPEC, "layer") + layer_params(SPEC, "embedding") + \
        layer_params(SPEC, "head")
    single = snapshot_bytes(plan_from_dict(plan([ONE])), SPEC, NODE_GPU)
    double = snapshot_bytes(plan_from_dict(plan([ONE, TWO])), SPEC, NODE_GPU)
    assert single.unique == double.unique == params * 12 + 8       # fp32 master + 2 moments, the step counter
    assert double.held == 2 * single.held
    # each chunk is copied off a GPU once, or twice where its second node-store copy lands on another holder's
    # node (here only the step counter, which every rank holds): the data-parallel copy adds nothing
    assert sum(double.copied.values()) == sum(single.copied.values()) == double.unique + 8
    assert double.copied_max < single.copied_max                    # the same writes over twice the ranks
    assert double.busiest <= single.busiest


def test_fp64_masters_double_the_bytes():
    fp32 = snapshot_bytes(plan_from_dict(plan([ONE])), SPEC, NODE_GPU)
    fp64 = snapshot_bytes(plan_from_dict(plan([ONE])), SPEC, NODE_GPU, master_dtype=torch.float64)
    assert fp64.unique - 8 == 2 * (fp32.unique - 8)                 # the step counter stays 8 bytes
