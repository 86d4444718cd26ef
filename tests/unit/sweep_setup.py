"""The valid inputs each bad-input case spoils one part of, and the case list (bad_inputs.py makes the bad
documents)."""
from __future__ import annotations

import json
import os

import numpy as np
import yaml

from bad_inputs import CLUSTER, DIRECTORY, JUNK, MODEL, PLAN, document_cases

PLAN_ARGS = ["--global-batch", "4", "--plan-time-limit-s", "5"]
TRAIN_ARGS = ["--global-batch", "4", "--steps", "1", "--emulate"]


def job_record(storage_path: str) -> dict:
    from autohet_ray.job.config import TrainJob
    from autohet_ray.storage.spec import storage_spec
    job = TrainJob(model=MODEL, cluster=CLUSTER, global_batch=4, storage=storage_spec(storage_path))
    return {"job_id": "0123456789ab", "job": job.to_dict()}


def profile_doc() -> dict:
    from autohet_ray.cluster.spec import cluster_from_dict
    from autohet_ray.model.spec import model_from_dict
    from autohet_ray.profile.analytic import analytic_profile
    return analytic_profile(model_from_dict(MODEL), cluster_from_dict(CLUSTER), 16, (1,)).to_dict()


def make_valid_inputs(ok: str) -> str:
    """Write the valid files every case starts from into `ok`; returns `ok`."""
    from autohet_ray.data.writer import DatasetWriter, directory_put
    _dump(os.path.join(ok, "cluster.yaml"), yaml.safe_dump(CLUSTER))
    _dump(os.path.join(ok, "plan.json"), json.dumps(PLAN))
    _dump(os.path.join(ok, "model.yaml"), yaml.safe_dump(MODEL))
    storage = os.path.join(ok, "storage")
    _dump(os.path.join(storage, "job.json"), json.dumps(job_record(storage)))
    os.makedirs(os.path.join(ok, "data"))
    writer = DatasetWriter(directory_put(os.path.join(ok, "data")), tokenizer_json="{}", vocab_size=100, eos_id=0,
                           mask_id=None)
    writer.add_shard(np.arange(200, dtype="<u2") % 100, 3)
    writer.finish(val_fraction=0.1)
    return ok


def _dump(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def _index_doc() -> dict:
    import tempfile
    from autohet_ray.data.writer import DatasetWriter, directory_put
    with tempfile.TemporaryDirectory() as folder:
        writer = DatasetWriter(directory_put(folder), tokenizer_json="{}", vocab_size=100, eos_id=0, mask_id=None)
        writer.add_shard(np.arange(200, dtype="<u2") % 100, 3)
        writer.finish(val_fraction=0.1)
        with open(os.path.join(folder, "index.json")) as f:
            return json.load(f)


def _slot(cases, argv, rel, extra=None) -> list:
    """One case per (name, content): `argv` with the file `{d}/rel` holding that content."""
    return [(f"{' '.join(argv[:1])} {name}", argv, {**(extra or {}), f"{{d}}/{rel}": content})
            for name, content in cases]


def _junk(name: str) -> list:
    return [(f"{name}:{k}", v) for k, v in JUNK.items()] + [(f"{name}:directory", DIRECTORY)]


def _missing(argv, name) -> list:
    return [(f"{argv[0]} {name}:missing", argv, {})]


def file_cases() -> list:
    job_doc = job_record("{d}/storage")
    plan_argv = ["plan", "--cluster", "{ok}/cluster.yaml", "--model", "tiny-gpt", *PLAN_ARGS]
    cases = []
    cases += _slot(document_cases("cluster", CLUSTER, "yaml") + _junk("cluster"),
                   ["plan", "--cluster", "{d}/c.yaml", "--model", "tiny-gpt", *PLAN_ARGS], "c.yaml")
    cases += _slot(document_cases("model", MODEL, "yaml") + _junk("model"),
                   ["plan", "--cluster", "{ok}/cluster.yaml", "--model", "{d}/m.yaml", *PLAN_ARGS], "m.yaml")
    profile_exempt = [("entries", i) for i in range(1, 99)] + [("meta", "source")]   # one entry; free text
    cases += _slot(document_cases("profile", profile_doc(), "json", exempt=profile_exempt)[::2]
                   + _junk("profile"), plan_argv + ["--profile", "{d}/p.json"], "p.json")
    cases += _slot(document_cases("plan", PLAN, "json") + _junk("plan"),
                   ["evaluate", "--plan", "{d}/plan.json", "--cluster", "{ok}/cluster.yaml"], "plan.json")
    cases += _slot(_junk("cluster"), ["evaluate", "--plan", "{ok}/plan.json", "--cluster", "{d}/c.yaml"], "c.yaml")
    cases += _slot(_junk("plan"), ["show", "{d}/plan.json"], "plan.json")
    cases += _train_cases()
    cases += _slot(document_cases("job.json", job_doc, "json", exempt=[("job", "storage"), ("job", "plan")])[::2]
                   + _junk("job.json"), ["resume", "--storage", "{d}/storage"], "storage/job.json")
    export_doc = {"job_id": "0123456789ab", "job": {"model": MODEL, "data": "{d}/data"}}  # what export reads
    cases += _slot(document_cases("job.json", export_doc, "json")
                   + _junk("job.json"), ["export", "--storage", "{d}/storage", "--out", "{d}/out"],
                   "storage/job.json")
    cases += _slot(document_cases("index.json", _index_doc(), "json") + _junk("index.json"),
                   ["data", "check", "{d}/data"], "data/index.json")
    cases += _slot(_junk("config.json"), ["plan", "--cluster", "{ok}/cluster.yaml", "--model", "hf:{d}/hf",
                                          *PLAN_ARGS], "hf/config.json")
    cases += _slot(_junk("model"), ["profile", "--local", "--model", "{d}/m.yaml", "--out", "{d}/p.json"], "m.yaml")
    cases += _slot(_junk("cluster"), ["profile", "--cluster", "{d}/c.yaml", "--model", "tiny-gpt",
                                      "--out", "{d}/p.json"], "c.yaml")
    for argv in (["plan", "--cluster", "{d}/none.yaml", "--model", "tiny-gpt", *PLAN_ARGS],
                 ["evaluate", "--plan", "{d}/none.json", "--cluster", "{ok}/cluster.yaml"],
                 ["export", "--storage", "{d}/none", "--out", "{d}/out"],
                 ["resume", "--storage", "{d}/none"], ["data", "check", "{d}/none"]):
        cases += _missing(argv, "file")
    return cases


def _train_cases() -> list:
    base = ["train", "--cluster", "{ok}/cluster.yaml", "--model", "tiny-gpt", *TRAIN_ARGS, "--storage", "{d}/s"]
    cases = _slot(_junk("cluster") + document_cases("cluster", CLUSTER, "yaml")[::7],
                  ["train", "--cluster", "{d}/c.yaml", "--model", "tiny-gpt", *TRAIN_ARGS, "--storage", "{d}/s"],
                  "c.yaml")
    cases += _slot(_junk("model"), ["train", "--cluster", "{ok}/cluster.yaml", "--model", "{d}/m.yaml",
                                    *TRAIN_ARGS, "--storage", "{d}/s"], "m.yaml")
    cases += _slot(_junk("plan") + document_cases("plan", PLAN, "json")[::5], base + ["--plan", "{d}/plan.json"],
                   "plan.json")
    cases += _slot(_junk("profile"), base + ["--profile", "{d}/p.json"], "p.json")
    cases += _slot(_junk("index.json"), base + ["--data", "{d}/data"], "data/index.json")
    cases += _slot(_junk("config.json"), base + ["--init-from", "{d}/hf"], "hf/config.json")
    return cases


BAD_NUMBERS = ("-1", "nan", "inf", "-inf", "x")
NUMERIC_FLAGS = {
    "plan": (["plan", "--cluster", "{ok}/cluster.yaml", "--model", "tiny-gpt", *PLAN_ARGS],
             ["--plan-time-limit-s", "--global-batch", "--seq-len", "--micro-batch"]),
    "evaluate": (None, []),
    "train": (["train", "--cluster", "{ok}/cluster.yaml", "--model", "tiny-gpt", *TRAIN_ARGS, "--storage",
               "{d}/s"],
              ["--global-batch", "--steps", "--iteration-wall-s", "--time-scale", "--eval-every", "--eval-batches",
               "--seq-len", "--micro-batch", "--lr", "--min-lr", "--warmup-steps", "--decay-steps",
               "--weight-decay", "--clip-grad", "--plan-time-limit-s", "--setup-timeout-s",
               "--collective-timeout-s", "--detect-timeout-s", "--control-timeout-s", "--checkpoint-every",
               "--loss-grace-s", "--seed", "--num-peers", "--gc-every", "--priced-seq-len", "--max-recoveries",
               "--recovery-window-steps", "--dataset-cache-gb"]),
    "resume": (["resume", "--storage", "{ok}/storage"], ["--steps", "--loss-grace-s", "--max-recoveries"]),
    "export": (["export", "--storage", "{ok}/storage", "--out", "{d}/out"], ["--step", "--max-shard-size"]),
    "data": (["data", "prepare", "--input", "{ok}/cluster.yaml", "--out", "{d}/ds"],
             ["--val-fraction", "--workers", "--shard-mb", "--train-tokenizer"]),
    "profile": (["profile", "--local", "--model", "tiny-gpt", "--out", "{d}/p.json"],
                ["--seq-len", "--ranks", "--tp", "--micro-batch"]),
}


def flag_cases() -> list:
    cases = []
    for command, (argv, flags) in NUMERIC_FLAGS.items():
        for flag in flags:
            for value in BAD_NUMBERS:
                cases.append((f"{command} {flag} {value}", _with_flag(argv, flag, value), {}))
    return cases


def _with_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """`argv` with `flag` set to `value` (replacing it where argv sets it)."""
    out = list(argv)
    if flag in out:
        out[out.index(flag) + 1] = value
        return out
    return out + [flag, value]
