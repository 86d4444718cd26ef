"""The exactly-once and loss check of a run's step records (e.g. an emulated spot replay's) against an
uninterrupted single-process run on the same sample order."""
from __future__ import annotations

from autohet_ray.data import Dataset
from autohet_ray.replay.emulated import step_record


def reference_check(history: list[dict], *, data_dir: str, model, global_batch: int, seq_len: int, seed: int,
                    optimizer, rel: float = 1e-5) -> dict:
    """The final record against a single-process run of the same steps on the same sample order (float64):
    every step present once, its sample ids equal (exactly once), its loss within `rel`."""
    import torch  # lazy: torch

    from autohet_ray.runtime.reference import Reference  # lazy: torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)             # a tiny model: more threads only contend for the shared cores
    try:
        record = step_record(history)
        steps = max(record)
        data = Dataset.open(data_dir)
        ref = Reference(model_spec=model, seed=seed, optimizer=optimizer, dtype=torch.float64)
        ids_equal, worst, ref_losses = True, 0.0, []
        for i in range(steps):
            expected_ids = sorted(int(x) for x in data.sample_ids(i, global_batch, seq_len, seed))
            got = record.get(i + 1)
            ids_equal &= got is not None and got.get("sample_ids") == expected_ids
            loss = ref.train_step(data.global_batch(i, global_batch, seq_len, seed))["loss"]
            ref_losses.append(loss)
            if got is not None:
                worst = max(worst, abs(got["loss"] - loss) / abs(loss))
    finally:
        torch.set_num_threads(threads)
    all_ids = [i for s in sorted(record) for i in record[s].get("sample_ids", [])]
    return {"steps": steps, "steps_present": sorted(record) == list(range(1, steps + 1)),
            "sample_ids_equal": bool(ids_equal), "samples_once": len(all_ids) == len(set(all_ids)),
            "max_rel_loss_diff": worst, "losses_equal": worst <= rel, "rel_tolerance": rel,
            "final_loss": record[steps]["loss"], "reference_final_loss": ref_losses[-1],
            "steps_trained_again": len(history) - len(record)}
