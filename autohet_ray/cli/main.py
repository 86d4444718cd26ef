"""The `autohet` command. Bad input gets one line naming the value and what is valid, exit code 2."""
from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

from autohet_ray import CONSOLE, ConfigError, __version__
from autohet_ray.cli.checks import check_numeric_flags
from autohet_ray.cli.common import TRAIN_ALIASES, TRAIN_NOTES, run_options
from autohet_ray.cli.data import add_data_parser, cmd_data
from autohet_ray.cli.export import add_export_parser, cmd_export
from autohet_ray.cli.options import add_deprecated, add_options
from autohet_ray.cli.plan import cmd_evaluate, cmd_plan, cmd_show
from autohet_ray.cli.resume import add_resume_parser, cmd_resume
from autohet_ray.cli.testbed import add_testbed_parser, cmd_testbed
from autohet_ray.cli.train import cmd_profile_local, cmd_profile_ray, cmd_train
from autohet_ray.config_io import check_writable
from autohet_ray.job.config import DTYPES, TrainJob
from autohet_ray.job.file import REFERENCES, Launch


class _OneLineParser(argparse.ArgumentParser):
    """A bad flag is one line on stderr and exit code 2 (argparse would print the usage first: see --help).
    No abbreviations: `--check 5` is an unknown flag, not a silent --checkpoint-every."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


JSON_HELP = "end with one JSON line instead of the tables (default: off)"


def _parser() -> argparse.ArgumentParser:
    ap = _OneLineParser(prog="autohet", description="Asymmetric 3D-parallel training on mixed GPUs")
    ap.add_argument("--version", action="version", version=f"autohet {__version__}",
                    help="print the version and exit")
    ap.add_argument("--log-level", default="INFO", choices=LOG_LEVELS,
                    help="the least severe log records shown on stderr (default: INFO)")
    ap.add_argument("--log-file", metavar="FILE", help="also write every log record (DEBUG and up, with time, "
                    "level and module) to this file (default: none)")
    sub = ap.add_subparsers(dest="command", required=True)
    _plan_parser(sub)
    e = sub.add_parser("evaluate", help="price a hand-written plan, or say why it is infeasible")
    e.add_argument("--plan", metavar="FILE", required=True, help="the plan JSON (default: none, required)")
    e.add_argument("--cluster", metavar="FILE", required=True, help="the cluster file (default: none, required)")
    e.add_argument("--profile", metavar="FILE", help="profile DB JSON (default: analytic, from the device catalog)")
    e.add_argument("--dtype", choices=DTYPES,
                   help="dtype the analytic profile prices (default: the dtype the plan records, else bf16)")
    e.add_argument("--json", action="store_true", help=JSON_HELP)
    s = sub.add_parser("show", help="draw a plan: pipeline timeline and memory per device")
    s.add_argument("plan", help="the plan JSON, or the output of autohet plan --json (default: none, required)")
    s.add_argument("--png", metavar="FILE", help="also draw the timeline into this PNG (default: none)")
    pr = sub.add_parser("profile", help="profile the real torch layers: on this device (--local), or once per GPU "
                                        "type of a Ray cluster (--cluster)")
    pr.add_argument("--local", action="store_true", help="profile this machine's device, without Ray (default: off)")
    pr.add_argument("--cluster", metavar="FILE", help="cluster file; profile each of its GPU types on the Ray "
                                                       "cluster (default: none)")
    pr.add_argument("--emulate", action=argparse.BooleanOptionalAction, default=False,
                    help="start an emulated Ray cluster from --cluster (default: off)")
    pr.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS or a running local cluster)")
    pr.add_argument("--profile-cache", metavar="DIR", help="directory caching per-GPU-type profiles (default: none)")
    add_deprecated(pr, "--cache", "--profile-cache", dest="profile_cache")
    pr.add_argument("--model", required=True, help="preset name, model YAML, or hf:DIR (default: none, required)")
    pr.add_argument("--device-type", default="CPU", help="name to file the local device under (default: CPU)")
    pr.add_argument("--tp", default="1", help="comma-separated TP degrees to emulate on one device (default: 1)")
    pr.add_argument("--micro-batch", default="1", help="comma-separated micro-batch sizes (default: 1)")
    pr.add_argument("--seq-len", type=int, help="tokens per sample (default: the model's max_seq_len)")
    pr.add_argument("--ranks", type=int, help="--local: devices computing at once during the in-situ timing, as "
                                              "a step runs them (one process each: a GPU, or a CPU core with "
                                              "one thread) (default: each entry's TP degree)")
    pr.add_argument("--out", metavar="FILE", required=True,
                    help="the profile DB JSON to write (default: none, required)")
    _train_parser(sub)
    add_resume_parser(sub)
    add_data_parser(sub)
    add_export_parser(sub)
    add_testbed_parser(sub)
    return ap


# what planning reads of a job: `autohet plan` takes these flags, and these fields of a --config job file
PLAN_FIELDS = ("model", "cluster", "global_batch", "priced_as", "seq_len", "priced_seq_len", "micro_batch",
               "schedule", "recompute", "optimizer_sharding", "objective", "prices", "max_cost_per_hour",
               "min_samples_per_s", "profile", "dtype", "baselines", "plan_time_limit_s")
PLAN_ALIASES = {"plan_time_limit_s": ["--time-limit"]}


def _plan_parser(sub) -> None:
    p = sub.add_parser("plan", help="plan a job and compare with Megatron-LM and Whale",
                       description="Preview the plan a job would train: the same fields, flags and defaults as "
                                   "autohet train (--config JOB.yaml reads a job file; the flags given override "
                                   "its fields). Fields planning does not read (steps, storage, ...) are ignored.")
    p.add_argument("--config", metavar="FILE", help="a job file (YAML), as autohet train reads it (default: none)")
    skip = tuple(f.name for f in dataclasses.fields(TrainJob) if f.name not in PLAN_FIELDS)
    dests = add_options(p, Launch, skip=("steps",),
                        notes={"emulate": "Here: price the dtype emulated workers compute in."}) + \
        add_options(p, TrainJob, skip=skip, reference=REFERENCES, aliases=PLAN_ALIASES)
    p.set_defaults(job_dests=dests, plan_fields=PLAN_FIELDS)
    p.add_argument("--out", metavar="FILE", help="write the plan JSON here (default: none)")
    p.add_argument("--json", action="store_true", help=JSON_HELP)


def _train_parser(sub) -> None:
    t = sub.add_parser("train", help="train on a Ray cluster: discover, profile, plan, place, train",
                       description="Every field of a job is a flag below; --config FILE gives a whole job (a job "
                                   "file), and the flags given override its fields one by one.")
    t.add_argument("--config", metavar="FILE", help="a job file (YAML): the whole job, its fields named as these "
                   "flags are (default: none)")
    t.add_argument("--print-config", action="store_true",
                   help="write the fully resolved job as YAML (itself a job file) and exit (default: off)")
    dests = add_options(t, Launch) + add_options(t, TrainJob, reference=REFERENCES, aliases=TRAIN_ALIASES,
                                                 notes=TRAIN_NOTES)
    t.set_defaults(job_dests=dests)
    run_options(t)
    t.add_argument("--json", action="store_true", help="end with one JSON line of the run's figures (default: off)")


def _message(exc: ConfigError) -> str:
    """The error's own message: one raised in a Ray actor arrives wrapped with the remote traceback, its
    original as `cause`."""
    cause = getattr(exc, "cause", None)
    return str(cause) if isinstance(cause, ConfigError) else str(exc)


COMMANDS = {"plan": cmd_plan, "evaluate": cmd_evaluate, "show": cmd_show, "train": cmd_train, "data": cmd_data,
            "resume": cmd_resume, "export": cmd_export,
            "testbed": cmd_testbed}


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _logging(level: str, log_file: str | None) -> None:
    """The library's records on stderr from `level` up, and all of them into `log_file`."""
    package = logging.getLogger("autohet_ray")
    CONSOLE.setLevel(level)
    for handler in [h for h in package.handlers if getattr(h, "autohet_file", False)]:
        package.removeHandler(handler)          # a second main() in one process keeps one file handler
        handler.close()
    package.setLevel(logging.DEBUG if log_file else level)
    if log_file:
        handler = logging.FileHandler(log_file)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler.autohet_file = True
        package.addHandler(handler)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.log_file:
            check_writable(args.log_file, "--log-file")
        _logging(args.log_level, args.log_file)
        check_numeric_flags(args)
        for option in ("out", "png"):             # outputs are checked before the work that fills them
            if getattr(args, option, None):
                check_writable(getattr(args, option), f"--{option}")
        if args.command == "profile":
            if args.local == bool(args.cluster):
                raise ConfigError("profile needs exactly one of --local (this device) or --cluster FILE (Ray)")
            return cmd_profile_ray(args) if args.cluster else cmd_profile_local(args)
        return COMMANDS[args.command](args)
    except ConfigError as exc:
        print(f"autohet {args.command}: error: {_message(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"autohet {args.command}: interrupted", file=sys.stderr)
        return 130
