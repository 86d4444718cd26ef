"""Asymmetric plans on gloo/CPU against one process running the whole model on the whole batch.

Per family (gpt, llama, bert) and plan shape: first-step gradients within 1e-5 and three AdamW steps (losses,
parameters and optimizer state) within 1e-4, relative norm per tensor; every gradient bucket is posted while
the backward runs (overlap). The same for the zb-h1 schedule (weight gradients deferred to W actions) on a few
shapes. One spawned world per world size runs all its cases.
"""
from __future__ import annotations

import pytest

from _harness import FAMILY_SPECS, TP4_SPECS, Case, compare, pipeline, reference_run, run_cases
from autohet_ray.runtime import run_world

# name -> (world size, specs, pipelines)
SHAPES = {
    # two pipelines, same TP, different stage boundaries: layer-wise buckets; uneven micro-batches
    "layerwise_2x2": (4, FAMILY_SPECS, (pipeline(2, (0, 1, 1), (1, 4, 1)), pipeline(3, (0, 3, 1), (3, 4, 1)))),
    # per-pipeline micro-batch sizes: 2 x 2 samples next to 3 x 1 (and 1 x 3 next to 2 x 2 with TP2)
    "mb_sizes": (4, FAMILY_SPECS, (pipeline(2, (0, 1, 1), (1, 4, 1)),
                                   pipeline(3, (0, 3, 1), (3, 4, 1), micro_batch=1))),
    "mb_sizes_tp2": (4, FAMILY_SPECS, (pipeline(1, (0, 4, 2), micro_batch=3), pipeline(2, (0, 2, 1), (2, 4, 1)))),
    # one pipeline, TP2 -> TP2 (rank-to-rank bridge)
    "tp2_tp2": (4, FAMILY_SPECS, (pipeline(3, (0, 2, 2), (2, 4, 2)),)),
    # pipelines with 2 and 3 stages, uneven layer splits and micro-batch counts
    "stages_2_vs_3": (5, FAMILY_SPECS, (pipeline(3, (0, 1, 1), (1, 4, 1)),
                                        pipeline(2, (0, 2, 1), (2, 3, 1), (3, 4, 1)))),
    # TP2 -> TP1 -> TP2 inside one pipeline (leader send/recv + broadcast)
    "tp_2_1_2": (5, FAMILY_SPECS, (pipeline(4, (0, 1, 2), (1, 3, 1), (3, 4, 2)),)),
    # a 3-stage TP2/TP1/TP2 pipeline next to a single-stage TP1 one: layers, embedding and head held at
    # different TP degrees (sync by shard overlap)
    "mixed_3stage_vs_1stage": (6, FAMILY_SPECS, (pipeline(3, (0, 2, 2), (2, 3, 1), (3, 4, 2)),
                                                 pipeline(1, (0, 4, 1)))),
    # TP4 -> TP1 next to a single-stage TP1 pipeline: 4-way against whole-tensor overlap
    "tp4_tp1_vs_tp1": (6, TP4_SPECS, (pipeline(2, (0, 3, 4), (3, 4, 1)), pipeline(3, (0, 4, 1)))),
    # TP4 against TP2 for every layer
    "tp4_vs_tp2": (6, TP4_SPECS, (pipeline(3, (0, 4, 4)), pipeline(2, (0, 4, 2)))),
}

# zb-h1 only: a 3-stage TP1/TP2/TP1 pipeline with more micro-batches than stages (W actions between
# forwards) next to a 2-stage one with other boundaries (deferred weights finish cross-pipeline buckets)
ZB_SHAPES = {
    "zb_3stage_tp2_vs_2stage": (6, FAMILY_SPECS, (pipeline(5, (0, 1, 1), (1, 3, 2), (3, 4, 1)),
                                                  pipeline(2, (0, 3, 1), (3, 4, 1)))),
}

CASES = [Case(name=f"{shape}-{family}", spec=specs[family], pipelines=pipes)
         for shape, (_, specs, pipes) in SHAPES.items() for family in ("gpt", "llama", "bert")]
CASES += [Case(name=f"{shape}-{family}-zb", spec=specs[family], pipelines=pipes, steps=2, schedule="zb-h1")
          for shape, (_, specs, pipes) in ZB_SHAPES.items() for family in ("gpt", "llama", "bert")]
CASES += [
    Case(name="layerwise_2x2-gpt-gpipe", spec=FAMILY_SPECS["gpt"], pipelines=SHAPES["layerwise_2x2"][2],
         schedule="gpipe"),
    Case(name="tp2_tp2-llama-resume", spec=FAMILY_SPECS["llama"], pipelines=SHAPES["tp2_tp2"][2], resume_after=1),
    Case(name="tp_2_1_2-gpt-pacer", spec=FAMILY_SPECS["gpt"], pipelines=SHAPES["tp_2_1_2"][2], steps=2,
         record_pacer=True),
    Case(name="tp_2_1_2-llama-zb-pacer", spec=FAMILY_SPECS["llama"], pipelines=SHAPES["tp_2_1_2"][2], steps=2,
         schedule="zb-h1", record_pacer=True),
    Case(name="mixed_3stage_vs_1stage-bert-zb", spec=FAMILY_SPECS["bert"],
         pipelines=SHAPES["mixed_3stage_vs_1stage"][2], steps=2, schedule="zb-h1"),
    Case(name="mixed_3stage_vs_1stage-gpt-resume", spec=FAMILY_SPECS["gpt"],
         pipelines=SHAPES["mixed_3stage_vs_1stage"][2], resume_after=2),
    # one all-reduce per unit (the smallest buckets): posted one by one during the last backward
    Case(name="stages_2_vs_3-llama-unit-buckets", spec=FAMILY_SPECS["llama"], pipelines=SHAPES["stages_2_vs_3"][2],
         steps=2, sync_bucket_elements=1),
    Case(name="zb_3stage_tp2_vs_2stage-gpt-zb-unit-buckets", spec=FAMILY_SPECS["gpt"],
         pipelines=ZB_SHAPES["zb_3stage_tp2_vs_2stage"][2], steps=2, schedule="zb-h1", sync_bucket_elements=1),
]
WORLD = {c.name: (SHAPES | ZB_SHAPES)[c.name.split("-")[0]][0] for c in CASES}


@pytest.fixture(scope="module")
def worlds():
    """Results per world size: {world size: per-rank {case name: result}}, each world spawned once."""
    cache: dict[int, list[dict]] = {}

    def get(size: int) -> list[dict]:
        if size not in cache:
            cache[size] = run_world(run_cases, size, [c for c in CASES if WORLD[c.name] == size])
        return cache[size]
    return get


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_single_process(case, worlds):
    per_rank = [r[case.name] for r in worlds(WORLD[case.name])]
    report = compare(case, per_rank, reference_run(case))
    assert not report.problems, "\n".join(report.problems[:20])
    assert report.worst_grad <= 1e-5 and report.worst_param <= 1e-4


@pytest.mark.parametrize("case", [c for c in CASES if c.record_pacer], ids=lambda c: c.name)
def test_pacer_sees_every_operation(case, worlds):
    per_rank = [r[case.name]["pace"] for r in worlds(WORLD[case.name])]
    m, steps, stages = case.plan.pipelines[0].num_microbatches, case.steps, case.plan.pipelines[0].stages
    ops = {"forward", "backward", "send_activation", "recv_activation", "send_grad", "recv_grad", "grad_sync",
           "optimizer"} | ({"wgrad"} if case.schedule == "zb-h1" else set())
    assert {op for calls in per_rank for op, _ in calls} == ops
    rank = 0
    for j, stage in enumerate(stages):
        for _ in range(stage.tp):
            count = lambda op: sum(1 for o, _ in per_rank[rank] if o == op)  # noqa: E731
            assert count("forward") == count("backward") == m * steps
            assert count("wgrad") == (m * steps if "wgrad" in ops else 0)
            assert count("optimizer") == count("grad_sync") == steps
            assert count("recv_activation") == (0 if j == 0 else m * steps)
            assert count("send_grad") == (0 if j == 0 else m * steps)
            assert count("send_activation") == (0 if j == len(stages) - 1 else m * steps)
            for op in ops - {"grad_sync", "optimizer"}:
                if count(op):
                    assert sorted({i["microbatch"] for o, i in per_rank[rank] if o == op}) == list(range(m))
            assert all(i["num_bytes"] > 0 for o, i in per_rank[rank] if o.startswith(("send", "recv")))
            rank += 1
