"""Per-step metrics: tokens/s and MFU per GPU type against hand-computed figures, peak memory as the workers
measured it (never invented on CPU), and the TensorBoard scalars read back with tensorboard's own reader."""
from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from autohet_ray import ConfigError
from autohet_ray.cluster.catalog import lookup
from autohet_ray.model.spec import ModelSpec
from autohet_ray.metrics.step import peak_memory, step_metrics, throughput
from autohet_ray.plan.schema import Pipeline, Plan, Stage

# llama, h=8, 2 heads of 4 (1 KV head: kv_hidden 4), f=16, V=32, 4 layers; seq 10
SPEC = ModelSpec(name="t", family="llama", num_layers=4, hidden=8, num_heads=2, num_kv_heads=1, ffn_hidden=16,
                 vocab_size=32, max_seq_len=10)
SEQ = 10
# layer params 2*8*8 + 2*8*4 + 3*8*16 + 2*8 = 592; forward FLOPs/token 2*592 + 4*10*8 = 1504; head 2*8*32 = 512
# x3 (fwd+bwd) x10 tokens per sample:
H100_FLOPS = 4 * 3 * 10 * (3 * 1504)                                      # p0 stage 0: layers [0,3), 4 samples
A100_FLOPS = 4 * 3 * 10 * (1504 + 512) + 2 * 3 * 10 * (4 * 1504 + 512)    # p0 stage 1 (tp2) + p1's whole model
STEP_S = 0.5


def plan() -> Plan:
    p0 = Pipeline(num_microbatches=2, stages=(
        Stage(layers=(0, 3), tp=1, device_type="H100", node="a", devices=(0,)),
        Stage(layers=(3, 4), tp=2, device_type="A100-80GB", node="b", devices=(0, 1))))
    p1 = Pipeline(num_microbatches=1, stages=(
        Stage(layers=(0, 4), tp=1, device_type="A100-80GB", node="c", devices=(0,)),))
    return Plan(model="t", global_batch=6, micro_batch=2, seq_len=SEQ, pipelines=(p0, p1))


def test_tokens_and_mfu_per_gpu_type_match_hand_computation():
    m = throughput(plan(), SPEC, SEQ, global_batch=6, step_s=STEP_S, dtype="bfloat16", device=lookup)
    assert m["tokens_per_s"] == pytest.approx(6 * 10 / 0.5)
    assert H100_FLOPS == 541_440 and A100_FLOPS == 633_600
    tflops = m["model_tflops_per_gpu_by_device_type"]
    assert tflops["H100"] == pytest.approx(H100_FLOPS / 1 / STEP_S / 1e12)
    assert tflops["A100-80GB"] == pytest.approx(A100_FLOPS / 3 / STEP_S / 1e12)       # 3 A100s in the plan
    assert m["mfu_by_device_type"]["H100"] == pytest.approx(H100_FLOPS / STEP_S / 1e12 / 989)
    assert m["mfu_by_device_type"]["A100-80GB"] == pytest.approx(A100_FLOPS / 3 / STEP_S / 1e12 / 312)
    assert m["mfu"] == pytest.approx((H100_FLOPS + A100_FLOPS) / STEP_S / 1e12 / (989 + 3 * 312))
    assert m["mfu_peak_dtype"] == "bfloat16"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fp32_and_fp64_runs_are_measured_against_the_fp32_peak(dtype):
    m = throughput(plan(), SPEC, SEQ, global_batch=6, step_s=STEP_S, dtype=dtype, device=lookup)
    assert m["mfu_by_device_type"]["H100"] == pytest.approx(H100_FLOPS / STEP_S / 1e12 / 67)
    assert m["mfu_by_device_type"]["A100-80GB"] == pytest.approx(A100_FLOPS / 3 / STEP_S / 1e12 / 19.5)
    assert m["mfu_peak_dtype"] == "float32"


def out(rank: int, device: str, peak, step_s: float = 0.1) -> dict:
    return {"loss": 2.5, "lr": 1e-3, "grad_norm": 0.7, "rank": rank,
            "timings": {"step": step_s, "forward": 0.05, "flush": 0.02 * rank},
            "device": device, "dtype": "float32", "peak_memory_bytes": peak,
            "emulation": {"overruns": {"forward": 1}, "overrun_s": 0.01,
                          "phases": {"compute_end_s": 0.06, "sync_s": 0.03 + rank, "optimizer_s": 0.01}}}


def test_emulated_step_counts_tokens_and_mfu_on_the_emulated_clock():
    job = SimpleNamespace(paced=True, global_batch=6, dtype="float32")
    evaluation = SimpleNamespace(iteration_time_s=0.4, samples_per_s=15.0)
    outs = [out(0, "a:0", None), out(1, "b:0", None, step_s=0.2)]
    m = step_metrics(outs, 1.0, step=3, job=job, evaluation=evaluation, profile_kind="analytic", time_scale=2.0,
                     data_wait_s=0.0, plan=plan(), spec=SPEC, seq_len=SEQ, device=lookup)
    # the rank whose step lasted longest, its pacer phases and flush wait on the emulated clock
    assert m["critical_rank"] == {"rank": 1, "step_s": pytest.approx(0.1), "flush_s": pytest.approx(0.01),
                                  "compute_end_s": pytest.approx(0.03), "sync_s": pytest.approx(0.515),
                                  "optimizer_s": pytest.approx(0.005)}
    assert m["clock"] == "emulated" and m["iteration_s"] == pytest.approx(0.5)      # 1 wall s at 2 wall s/s
    assert m["tokens_per_s"] == pytest.approx(120.0)
    assert m["mfu_by_device_type"]["H100"] == pytest.approx(H100_FLOPS / 0.5 / 1e12 / 67)
    assert (m["loss"], m["lr"], m["grad_norm"]) == (2.5, 1e-3, 0.7)
    assert m["peak_memory_bytes_per_device"] == {"a:0": None, "b:0": None}          # CPU: not measured
    assert m["peak_memory_source"].startswith("none")


def test_cuda_peak_memory_is_reported_per_device():
    m = peak_memory([out(0, "a:0", 1000), out(1, "a:1", 2000)])
    assert m["peak_memory_bytes_per_device"] == {"a:0": 1000, "a:1": 2000}
    assert "max_memory_allocated" in m["peak_memory_source"]


def test_tensorboard_events_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from autohet_ray.metrics.tensorboard import TensorBoardLog
    log = TensorBoardLog(str(tmp_path))
    base = {"loss": 3.0, "lr": 1e-3, "tokens_per_s": 100.0, "mfu": 0.25, "mfu_by_device_type": {"H100": 0.3},
            "peak_memory_bytes_per_device": {"a:0": None, "a:1": 4096}}
    for step in (1, 2):
        log.append({**base, "step": step, "loss": 3.0 / step})
    log.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"loss", "lr", "tokens_per_s", "mfu", "mfu/H100", "peak_memory_bytes/a:1"} <= tags
    assert "peak_memory_bytes/a:0" not in tags                     # None is left out, not written as a number
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 3.0), (2, 1.5)]


def test_tensorboard_without_the_package_is_a_clear_error(monkeypatch):
    from autohet_ray.metrics.tensorboard import check_available
    monkeypatch.setitem(sys.modules, "tensorboard", None)          # import tensorboard -> ImportError
    with pytest.raises(ConfigError, match=r"pip install 'autohet_ray\[tensorboard\]'"):
        check_available("runs/x")
