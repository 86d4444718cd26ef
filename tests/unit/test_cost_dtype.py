"""The training dtype in the analytic profile and the cost model: bytes per parameter, activation bytes, and the
catalog's peak for the dtype (bf16 tensor cores vs non-tensor FP32)."""
import pytest

from autohet_ray import ConfigError
from autohet_ray.cluster import cluster_from_dict
from autohet_ray.cost import evaluate_plan
from autohet_ray.cost.terms import MEMORY_RESERVE_BYTES
from autohet_ray.model import PRESETS, layer_params
from autohet_ray.model.costs import activation_bytes_per_token
from autohet_ray.plan import Pipeline, Plan, Stage
from autohet_ray.profile.analytic import KERNELS_PER_LAYER, LAUNCH_S, analytic_profile
from autohet_ray.profile.db import profile_from_dict
from autohet_ray.profile.precision import PRECISIONS, normalize_dtype, profile_dtype

MODEL = PRESETS["gpt3-1.3b"]
SEQ = 2048
CLUSTER = cluster_from_dict({"name": "a100", "nodes": [{"name": "n0", "device": "A100-80GB", "count": 2}]})


def _plan() -> Plan:
    half = MODEL.num_layers // 2
    stages = tuple(Stage(layers=(a, b), tp=1, device_type="A100-80GB", node="n0", devices=(d,))
                   for d, (a, b) in enumerate(((0, half), (half, MODEL.num_layers))))
    return Plan(model=MODEL.name, global_batch=4, micro_batch=1, seq_len=SEQ,
                pipelines=(Pipeline(num_microbatches=4, stages=stages),))


def test_layer_time_scales_with_the_catalog_peak_of_the_dtype():
    bf16, fp32 = (analytic_profile(MODEL, CLUSTER, SEQ, (1,), dtype=d) for d in ("bfloat16", "float32"))
    device = CLUSTER.device("A100-80GB")
    launch = KERNELS_PER_LAYER * LAUNCH_S
    slow, fast = fp32.layer("A100-80GB", 1, 1, "layer"), bf16.layer("A100-80GB", 1, 1, "layer")
    # both compute bound at this size: the compute part scales as the peaks, 312 / 19.5 = 16x on an A100
    assert (slow.fwd_s - launch) / (fast.fwd_s - launch) == pytest.approx(device.bf16_tflops / device.fp32_tflops)
    assert slow.activation_bytes == int(activation_bytes_per_token(MODEL, "layer", 1, 4) * SEQ)
    assert fast.activation_bytes == int(activation_bytes_per_token(MODEL, "layer", 1, 2) * SEQ)
    log_sum_exp = 4 * MODEL.num_heads * SEQ         # flash attention's fp32 row statistics, in either dtype
    assert slow.activation_bytes - log_sum_exp == 2 * (fast.activation_bytes - log_sum_exp)
    assert slow.param_bytes == 2 * fast.param_bytes


def test_plan_memory_and_time_follow_the_dtype():
    evals = {d: evaluate_plan(_plan(), CLUSTER, MODEL, analytic_profile(MODEL, CLUSTER, SEQ, (1,), dtype=d))
             for d in ("bfloat16", "float32")}
    ratio = evals["float32"].iteration_time_s / evals["bfloat16"].iteration_time_s
    assert 10 < ratio < 16          # the layers' 16x, diluted by the memory-bound embedding and optimizer
    params = MODEL.num_layers // 2 * layer_params(MODEL, "layer") + layer_params(MODEL, "embedding")
    for dtype, ev in evals.items():
        prec = PRECISIONS[dtype]
        act = (MODEL.num_layers // 2 * activation_bytes_per_token(MODEL, "layer", 1, prec.activation_bytes)
               + activation_bytes_per_token(MODEL, "embedding", 1, prec.activation_bytes)) * SEQ
        # stage 0 of 2 holds two micro-batches under 1F1B
        want = params * prec.state_bytes_per_param + 2 * act
        assert ev.memory_bytes["n0:0"] == pytest.approx(want, rel=1e-6)
        assert ev.dtype == dtype and ev.predicted().dtype == dtype
        assert ev.capacity_bytes["n0:0"] == 80 * 10**9 - MEMORY_RESERVE_BYTES
    assert evals["float32"].memory_bytes["n0:0"] > evals["bfloat16"].memory_bytes["n0:0"]
    assert evals["float32"].optimizer_time_s == pytest.approx(evals["bfloat16"].optimizer_time_s * 28 / 30)


def test_profile_records_its_dtype_and_old_profiles_price_bf16():
    db = analytic_profile(MODEL, CLUSTER, SEQ, (1,), dtype="fp32")
    raw = db.to_dict()
    assert raw["meta"]["dtype"] == "float32" and profile_dtype(profile_from_dict(raw)) == "float32"
    del raw["meta"]["dtype"]
    assert profile_dtype(profile_from_dict(raw)) == "bfloat16"
    assert profile_dtype(analytic_profile(MODEL, CLUSTER, SEQ, (1,))) == "bfloat16"
    assert normalize_dtype("torch.float32") == "float32" and normalize_dtype("bf16") == "bfloat16"
    with pytest.raises(ConfigError, match="float16.*valid: bfloat16, float32"):
        analytic_profile(MODEL, CLUSTER, SEQ, (1,), dtype="float16")
