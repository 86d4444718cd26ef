"""Engine API: clear ConfigErrors for bad input."""
import pytest
import torch

from _harness import FAMILY_SPECS, make_batch, make_plan, pipeline
from autohet_ray import ConfigError
from autohet_ray.runtime import Engine, run_world

SPEC = FAMILY_SPECS["gpt"]


def _errors(rank: int, world_size: int) -> list[str]:
    """Each bad input in turn; returns the messages (every rank hits the same ones, so nobody hangs)."""
    messages = []
    good = make_plan(SPEC, pipeline(2, (0, 2, 1), (2, 4, 1)))
    too_big = make_plan(SPEC, pipeline(2, (0, 2, 2), (2, 4, 1)))
    attempts = [
        lambda: Engine(plan=too_big, model_spec=SPEC, rank=rank),
        lambda: Engine(plan=good, model_spec=SPEC, rank=rank, dtype=torch.float16),
        lambda: Engine(plan=good, model_spec=SPEC, rank=rank, schedule="zigzag"),
    ]
    for attempt in attempts:
        try:
            attempt()
            messages.append("no error")
        except ConfigError as exc:
            messages.append(str(exc))
    engine = Engine(plan=good, model_spec=SPEC, rank=rank)
    batch = make_batch(SPEC, good, 0)
    for bad in ({"input_ids": batch["input_ids"][:2], "labels": batch["labels"][:2]},
                {"input_ids": batch["input_ids"][:, :4], "labels": batch["labels"][:, :4]},
                {"input_ids": batch["input_ids"]}):
        try:
            engine.train_step(bad)
            messages.append("no error")
        except ConfigError as exc:
            messages.append(str(exc))
    kinds = lambda e: "".join(sorted({a.kind for a in e.actions}))  # noqa: E731
    zb = good.with_schedule("zb-h1")            # the plan's schedule unless the caller names one
    messages.append(f"{kinds(Engine(plan=zb, model_spec=SPEC, rank=rank))} "
                    f"{kinds(Engine(plan=zb, model_spec=SPEC, rank=rank, schedule='1f1b'))} {kinds(engine)}")
    messages.append(f"ok {engine.train_step(batch)['loss']:.6f}")     # still usable after rejected batches
    return messages


def test_engine_rejects_bad_input():
    per_rank = run_world(_errors, 2)
    assert per_rank[0][:-1] == per_rank[1][:-1] and per_rank[0][-1] == per_rank[1][-1]
    world, dtype, schedule, rows, cols, missing, kinds, ok = per_rank[0]
    assert "plan uses 3 devices but the process group has 2" in world
    assert "float16" in dtype and "zigzag" in schedule
    assert "shape (2, 8)" in rows and "(4, 8)" in rows
    assert "shape (4, 4)" in cols
    assert "'labels'" in missing
    assert kinds == "BFW BF BF"
    assert ok.startswith("ok ")


def test_engine_needs_an_initialized_process_group():
    with pytest.raises(ConfigError, match="init_process_group"):
        Engine(plan=make_plan(SPEC, pipeline(2, (0, 4, 1))), model_spec=SPEC, rank=0)



def _aborted(rank: int, world_size: int) -> list[str]:
    """Rank 0 (stage 0) is told to abort while rank 1 (stage 1) would wait for its activations forever."""
    import threading
    import time
    from autohet_ray.runtime.executor import StepAborted
    plan = make_plan(SPEC, pipeline(4, (0, 2, 1), (2, 4, 1)))
    engine = Engine(plan=plan, model_spec=SPEC, rank=rank)
    batch = make_batch(SPEC, plan, 0)
    if rank == 1:
        return ["stage 1 skipped the step"]
    sent = []

    def send_activation(out):             # no peer needed; another thread aborts during the second send
        sent.append(out)
        if len(sent) == 2:
            aborter = threading.Thread(target=engine.abort)
            aborter.start()
            aborter.join()
    engine.executor.bridge.send_activation = send_activation
    start = time.perf_counter()
    try:
        engine.train_step(batch)
        return [f"no error after {len(sent)} sends"]
    except StepAborted as exc:
        return [f"aborted after {len(sent)} sends, {time.perf_counter() - start:.2f} s: {exc}"]


def test_abort_stops_a_running_step_at_the_next_action():
    message = run_world(_aborted, 2)[0][0]
    assert message.startswith("aborted after 2 sends") and "before" in message, message
