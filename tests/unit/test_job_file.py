"""One source for every setting: `autohet train`/`resume` options generated from TrainJob's fields, a job file
(--config) with the flags over it, --print-config, and the job record read as a job file."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os

import pytest
import yaml

from autohet_ray import ConfigError
from autohet_ray.cli.main import _parser, main
from autohet_ray.cli.options import add_options, overrides
from autohet_ray.cli.train import train_job
from autohet_ray.job.config import TrainJob
from autohet_ray.runtime.lr_schedule import OptimizerConfig

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER = os.path.join(REPO, "jobs", "local-3.yaml")
STRUCTURAL = {"optimizer"}           # a nested config: each of its fields is a flag of its own


def _subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


@pytest.mark.parametrize("command", ["train", "resume"])
def test_help_shows_a_default_for_every_option(command):
    options = [a for a in _subparser(command)._actions
               if a.option_strings and a.dest != "help" and a.help != argparse.SUPPRESS]    # not the old spellings
    assert len(options) > 20
    missing = [a.option_strings[0] for a in options if "(default: " not in (a.help or "")]
    assert not missing, f"options without a default in --help: {missing}"
    text = _subparser(command).format_help()
    assert "--loss-grace-s" in text and f"(default: {TrainJob.loss_grace_s})" in text


def test_every_field_but_the_structural_ones_is_a_flag():
    dests = set(_subparser("train").get_default("job_dests"))
    wanted = {f.name for f in dataclasses.fields(TrainJob)} - STRUCTURAL
    wanted |= {f"optimizer.{f.name}" for f in dataclasses.fields(OptimizerConfig)}
    assert wanted <= dests, f"fields without a flag: {sorted(wanted - dests)}"
    for name in ("num_peers", "gc_every", "priced_as", "priced_seq_len", "baselines", "collective_timeout_s",
                 "detect_timeout_s", "spot_watch", "spot_provider"):
        assert name in dests


def test_an_old_spelling_is_still_read_but_not_shown():
    """--cloud-every, the storage cadence's old name, sets checkpoint_every and stays out of --help."""
    parser = _subparser("train")
    dests = parser.get_default("job_dests")
    assert overrides(parser.parse_args(["--cloud-every", "3"]), dests) == {"checkpoint_every": 3}
    assert overrides(parser.parse_args(["--checkpoint-every", "4"]), dests) == {"checkpoint_every": 4}
    assert "--cloud-every" not in parser.format_help() and "--checkpoint-every" in parser.format_help()


def test_a_new_field_is_a_flag_with_no_second_edit():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class PricedJob(TrainJob):
        price_per_gpu_hour: float = 2.5
        """What one GPU hour costs."""
        prices: dict | None = None
        """Price per hour of each GPU type."""

    parser = argparse.ArgumentParser()
    dests = add_options(parser, PricedJob, skip={"model", "cluster", "storage", "plan", "priced_as"})
    assert "(default: 2.5)" in parser.format_help() and "What one GPU hour costs." in parser.format_help()
    assert overrides(parser.parse_args(["--price-per-gpu-hour", "1.25"]), dests) == {"price_per_gpu_hour": 1.25}
    assert overrides(parser.parse_args([]), dests) == {}             # a flag not given overrides nothing
    assert overrides(parser.parse_args(["--prices", "{H800: 2.0, H20: 0.9}"]), dests) == \
        {"prices": {"H800": 2.0, "H20": 0.9}}                          # a mapping field: inline YAML


def _job_file(tmp_path, text: str) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return str(path)


BASE = f"cluster: {CLUSTER}\nmodel: tiny-gpt\nglobal_batch: 4\nsteps: 2\n"


def test_flags_override_single_fields_of_the_job_file(tmp_path):
    config = _job_file(tmp_path, BASE + "schedule: 1f1b\nseed: 7\noptimizer: {lr: 0.01, warmup_steps: 3}\n"
                                        "spot_watch: true\nelastic: true\nstorage: " + str(tmp_path / "s") + "\n")
    job, launch = train_job(_parser().parse_args(["train", "--config", config, "--schedule", "zb-h1", "--lr",
                                                  "0.02", "--steps", "5", "--print-config"]))
    assert job.schedule == "zb-h1" and job.seed == 7 and launch.steps == 5
    assert job.optimizer.lr == 0.02 and job.optimizer.warmup_steps == 3      # one field of the nested config
    assert job.spot_watch and job.spot_provider == "aws" and job.elastic
    assert job.model["name"] == "tiny-gpt" and {n["name"] for n in job.cluster["nodes"]} == {"a", "b", "c"}


def _non_default_job(tmp_path) -> TrainJob:
    """A job whose every field (but the model and cluster) differs from its default."""
    from autohet_ray.cluster.spec import load_cluster
    from autohet_ray.model.spec import load_model
    from autohet_ray.storage.spec import storage_spec
    data = str(tmp_path / "data")
    values = dict(model=load_model("tiny-gpt").to_dict(), priced_as=load_model("small-gpt").to_dict(),
                  cluster=load_cluster(CLUSTER).to_dict(), global_batch=8, data=data, eval_every=5, eval_batches=2,
                  storage=storage_spec(str(tmp_path / "s")), elastic=True, checkpoint_every=3, num_peers=2,
                  gc_every=6, seq_len=16, priced_seq_len=32, micro_batch=2, schedule="1f1b", recompute="full",
                  optimizer_sharding="dp", profile="measured", profile_cache=str(tmp_path / "pc"), time_scale=2.0,
                  iteration_wall_s=3.0, dtype="float64", seed=3, init_from=str(tmp_path / "hf"),
                  optimizer=OptimizerConfig(lr=0.01, min_lr=0.001, warmup_steps=2, decay="linear", decay_steps=9,
                                            weight_decay=0.1, clip_grad=0.5, betas=(0.8, 0.9)),
                  baselines=False, plan_time_limit_s=4.0, setup_timeout_s=5.0, collective_timeout_s=6.0,
                  detect_timeout_s=7.0, control_timeout_s=8.0, dataset_cache_gb=9.0, loss_grace_s=1.5,
                  spot_watch=True, spot_provider="gcp", max_recoveries=2, recovery_window_steps=4)
    defaults = {f.name: getattr(TrainJob, f.name, None) for f in dataclasses.fields(TrainJob)}
    same = [k for k, v in values.items() if v == defaults[k] or (k == "optimizer" and v == OptimizerConfig())]
    assert not same, f"not a changed value: {same}"
    return TrainJob(**values)


def test_every_field_is_reachable_from_the_job_file(tmp_path):
    job = _non_default_job(tmp_path)
    document = {"steps": 4, **job.to_dict()}
    assert set(document) == {"steps"} | {f.name for f in dataclasses.fields(TrainJob)}
    config = _job_file(tmp_path, yaml.safe_dump(json.loads(json.dumps(document))))
    read, launch = train_job(_parser().parse_args(["train", "--config", config, "--print-config"]))
    assert read == job and launch.steps == 4


def test_print_config_writes_a_job_file_that_reads_back_the_same(tmp_path, capsys):
    config = _job_file(tmp_path, BASE + "spot_watch: true\nelastic: true\nstorage: s3://bucket/run\n")
    assert main(["train", "--config", config, "--recompute", "auto", "--print-config"]) == 0
    printed = capsys.readouterr().out
    resolved = yaml.safe_load(printed)
    assert resolved["recompute"] == "auto" and resolved["storage"]["bucket"] == "bucket"
    assert resolved["model"]["num_layers"] > 0 and resolved["optimizer"]["lr"] == OptimizerConfig.lr
    again = _job_file(tmp_path, printed)
    assert main(["train", "--config", again, "--print-config"]) == 0
    assert capsys.readouterr().out == printed


def test_a_job_record_is_a_job_file(tmp_path):
    job, _ = train_job(_parser().parse_args(["train", "--config", _job_file(tmp_path, BASE), "--spot-watch",
                                             "--print-config"]))
    record = tmp_path / "job.json"
    record.write_text(json.dumps({"job_id": "abc123", "job": job.to_dict()}))
    again, _ = train_job(_parser().parse_args(["train", "--config", str(record), "--steps", "1", "--print-config"]))
    assert again == job


@pytest.mark.parametrize("text, named", [
    ("schedul: auto\n", "unknown field 'schedul'; valid: model, cluster, global_batch"),
    ("recompute: most\n", "recompute='most'; valid: none, full, auto"),
    ("dtype: fp16\n", "dtype='fp16'; valid: float32"),
    ("spot_watch: true\nspot_provider: ibm\n", "spot_provider='ibm'; valid: aws, gcp, azure, auto"),
    ("eval_batches: many\n", "eval_batches='many' must be an integer"),
    ("optimizer: {decay: step}\n", "decay='step'; valid: cosine, linear, constant"),
])
def test_a_bad_field_is_one_line_naming_it_and_the_file(tmp_path, capsys, text, named):
    config = _job_file(tmp_path, BASE + f"storage: {tmp_path / 's'}\n" + text)
    assert main(["train", "--config", config]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"job file {config!r}" in err[0] and named in err[0], err


def test_a_bad_flag_over_a_job_file_does_not_blame_the_file(tmp_path, capsys):
    config = _job_file(tmp_path, BASE + f"storage: {tmp_path / 's'}\n")
    with pytest.raises(SystemExit) as exit_:        # a choice argparse refuses, before the job is read
        main(["train", "--config", config, "--schedule", "2f2b"])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and config not in err
    assert err.startswith("autohet train: error: argument --schedule: invalid choice: '2f2b' (choose from")


def test_a_job_needs_its_required_fields_from_somewhere(tmp_path, capsys):
    assert main(["train", "--config", _job_file(tmp_path, "model: tiny-gpt\nsteps: 1\n"), "--print-config"]) == 2
    assert "cluster" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="steps"):
        train_job(_parser().parse_args(["train", "--config", _job_file(tmp_path, BASE.replace("steps: 2\n", "")),
                                        "--print-config"]))


def test_resume_keeps_spot_watching_and_takes_the_flags_it_may_change(tmp_path):
    from autohet_ray.cli.resume import resume_job
    from autohet_ray.cli.options import overrides as flags_given
    job, _ = train_job(_parser().parse_args(["train", "--config", _job_file(tmp_path, BASE), "--elastic",
                                             "--spot-watch", "--spot-provider", "gcp", "--storage",
                                             str(tmp_path / "s"), "--print-config"]))
    os.makedirs(tmp_path / "s")
    (tmp_path / "s" / "job.json").write_text(json.dumps({"job_id": "abc123", "job": job.to_dict()}))
    resumed, job_id, _, newest = resume_job(str(tmp_path / "s"))
    assert job_id == "abc123" and newest is None
    assert resumed.spot_watch and resumed.spot_provider == "gcp" and resumed == job
    args = _parser().parse_args(["resume", "--storage", str(tmp_path / "s"), "--no-spot-watch",
                                 "--max-recoveries", "9"])
    changed, *_ = resume_job(str(tmp_path / "s"), changes=flags_given(args, args.job_dests))
    assert not changed.spot_watch and changed.max_recoveries == 9 and changed.model == job.model
    with pytest.raises(SystemExit):           # what the job trains is kept: no flag for it
        _parser().parse_args(["resume", "--storage", str(tmp_path / "s"), "--seed", "3"])
