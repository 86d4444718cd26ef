"""The `autohet` command as users of other trainers expect it: every option says what it does, its default and its
choices; one flag name per field across commands (old names still read, with a one-line note); no abbreviations;
`--version`; the job file's JSON Schema published in docs/ and checked; TrainJob checks its types from Python."""
from __future__ import annotations

import argparse
import glob
import json
import os

import pytest
import yaml

from autohet_ray import ConfigError, __version__
from autohet_ray import cli
from autohet_ray.cli.main import _parser
from autohet_ray.job.config import TrainJob
from autohet_ray.job.file import REFERENCES, Launch, job_keys, read_job_file
from autohet_ray.job.schema import job_file_schema
from autohet_ray.model.spec import load_model

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPRECATED = {"--time-limit": "--plan-time-limit-s", "--cloud-every": "--checkpoint-every",
              "--recovery-window": "--recovery-window-steps", "--cache": "--profile-cache"}


def _commands(parser, prefix=""):
    """(command name, its parser) for every command and sub-command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prefix}{name}", sub
                yield from _commands(sub, f"{prefix}{name} ")


def _options(parser):
    return [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS
            and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))]


COMMANDS = dict(_commands(_parser()))


def test_the_sweep_reaches_every_command():
    assert {"plan", "evaluate", "show", "profile", "train", "resume", "export", "data", "data prepare",
            "data check"} <= set(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_has_help_a_default_and_its_choices(name):
    parser = COMMANDS[name]
    text = " ".join(parser.format_help().split())
    for action in _options(parser) + [a for a in parser._actions if not a.option_strings
                                           and not isinstance(a, argparse._SubParsersAction)]:
        flag = action.option_strings[0] if action.option_strings else action.dest
        assert action.help, f"autohet {name} {flag}: no help"
        assert "default" in action.help, f"autohet {name} {flag}: its help names no default: {action.help!r}"
        for choice in action.choices or ():
            assert str(choice) in text, f"autohet {name} {flag}: choice {choice!r} missing from --help"


def test_one_flag_name_per_field_across_commands():
    flags_of: dict[str, set] = {}
    for name, parser in COMMANDS.items():
        for action in _options(parser):
            flags_of.setdefault(action.dest, set()).update(action.option_strings)
    twice = {dest: flags for dest, flags in flags_of.items()
             if len({f for f in flags if not f.startswith("--no-")}) > 1}
    assert not twice, twice
    visible = set().union(*flags_of.values())
    assert not visible & set(DEPRECATED), visible & set(DEPRECATED)


def test_choices_come_from_the_literal_types():
    plan = COMMANDS["plan"]
    choices = {a.dest: a.choices for a in plan._actions if a.choices}
    assert choices["schedule"] == ("auto", "1f1b", "zb-h1")
    assert choices["objective"] == ("throughput", "cost")
    assert choices["dtype"] == COMMANDS["train"]._option_string_actions["--dtype"].choices
    assert COMMANDS["train"]._option_string_actions["--decay"].choices == ("cosine", "linear", "constant")


@pytest.mark.parametrize("old,new", sorted(DEPRECATED.items()))
def test_an_old_name_is_read_with_a_one_line_note(old, new, capsys):
    command = {"--time-limit": "plan", "--cache": "profile"}.get(old, "train")
    args = _parser().parse_args([command, old, "3", *(["--model", "m", "--out", "o"] if command == "profile"
                                                     else [])])
    dest = COMMANDS[command]._option_string_actions[new].dest
    assert str(getattr(args, dest)) in ("3", "3.0")
    err = capsys.readouterr().err
    assert err == f"autohet: {old} is deprecated; use {new}\n"


def test_abbreviations_are_off(capsys):
    with pytest.raises(SystemExit) as exit_:
        _parser().parse_args(["train", "--config", "x.yaml", "--check", "5"])
    assert exit_.value.code == 2 and "--check" in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"autohet {__version__}\n"


def test_the_published_schema_is_the_generated_one():
    with open(os.path.join(REPO, "docs", "job-schema.json")) as f:
        published = json.load(f)
    assert published == job_file_schema(Launch, REFERENCES), \
        "regenerate: python -m autohet_ray.job.file > docs/job-schema.json"
    assert set(published["properties"]) == set(job_keys())
    assert published["properties"]["schedule"]["enum"] == ["auto", "1f1b", "zb-h1"]


def test_every_job_file_in_jobs_conforms():
    files = [p for p in glob.glob(os.path.join(REPO, "jobs", "*.yaml")) if "global_batch" in open(p).read()]
    assert len(files) >= 3, files
    for path in files:
        assert read_job_file(path)


@pytest.mark.parametrize("text,message", [
    ("global_batch: '48'", "global_batch='48' must be an integer"),
    ("schedule: fast", "schedule='fast'; valid: auto, 1f1b, zb-h1"),
    ("optimizer: {lr: x}", "optimizer.lr='x' must be a number"),
    ("optimizer: {lrate: 1}", "optimizer: Additional properties are not allowed ('lrate' was unexpected)"),
    ("emulate: 2", "emulate=2 must be true or false"),
    ("model: 5", "model=5 must be text or a mapping"),
])
def test_a_job_file_breaking_the_schema_is_one_line(tmp_path, text, message):
    path = tmp_path / "job.yaml"
    path.write_text(f"model: tiny-gpt\ncluster: c.yaml\nsteps: 1\n{text}\n")
    with pytest.raises(ConfigError) as err:
        read_job_file(str(path))
    assert str(err.value) == f"job file {str(path)!r}: {message} (the job file schema: docs/job-schema.json)"


@pytest.mark.parametrize("field,value,message", [
    ("global_batch", "8", "TrainJob: global_batch='8' must be an integer"),
    ("global_batch", 8.0, "TrainJob: global_batch=8.0 must be an integer"),
    ("plan_time_limit_s", "10", "TrainJob: plan_time_limit_s='10' must be a number"),
    ("elastic", 1, "TrainJob: elastic=1 must be true or false"),
    ("schedule", "fast", "TrainJob: schedule='fast'; valid: auto, 1f1b, zb-h1"),
    ("model", "tiny-gpt", "TrainJob: model='tiny-gpt' must be a mapping"),
])
def test_trainjob_checks_its_types_at_construction(field, value, message):
    fields = {"model": load_model("tiny-gpt").to_dict(), "cluster": {"nodes": []}, "global_batch": 8}
    with pytest.raises(ConfigError) as err:
        TrainJob(**(fields | {field: value}))
    assert str(err.value) == message


def test_plan_and_train_share_the_time_limit_default():
    assert yaml.safe_load("x: 1")          # (yaml imported for the job files above)
    plan = COMMANDS["plan"]._option_string_actions["--plan-time-limit-s"]
    train = COMMANDS["train"]._option_string_actions["--plan-time-limit-s"]
    assert plan.help == train.help and f"(default: {TrainJob.plan_time_limit_s})" in plan.help


def test_log_level_and_log_file(tmp_path, capsys):
    import logging

    from autohet_ray.cli.main import _logging
    path = tmp_path / "run.log"
    records = logging.getLogger("autohet_ray.storage.job_files")
    try:
        _logging("WARNING", str(path))
        records.info("autohet: an info line")
        records.warning("autohet: a warning line")
        assert capsys.readouterr().err == "autohet: a warning line\n"     # the line as it always was
        text = path.read_text()
        assert "INFO autohet_ray.storage.job_files: autohet: an info line" in text
        assert "WARNING autohet_ray.storage.job_files: autohet: a warning line" in text
    finally:
        _logging("INFO", None)
    records.info("autohet: shown again")
    assert capsys.readouterr().err == "autohet: shown again\n" and "shown again" not in path.read_text()


def test_a_workers_records_name_its_rank_stage_and_device(capsys):
    import logging

    import autohet_ray
    records = logging.getLogger("autohet_ray.checkpoint.copy_check")
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append((record.rank, record.pipeline, record.stage, record.device))

    keep = Keep()
    try:
        autohet_ray.label_records(rank=3, pipeline=1, stage=0, device="H800 b:0")
        records.addHandler(keep)
        records.warning("autohet: copy refused")
        assert capsys.readouterr().err == "[rank 3 pipeline 1 stage 0 H800 b:0] autohet: copy refused\n"
        assert seen == [(3, 1, 0, "H800 b:0")]
    finally:
        records.removeHandler(keep)
        logging.setLogRecordFactory(logging.LogRecord)
        autohet_ray.CONSOLE.setFormatter(None)
