"""The `autohet` command. Bad input gets one line naming the value and what is valid, exit code 2."""
from __future__ import annotations

import argparse
import sys

from autohet_ray import ConfigError
from autohet_ray.cli.checks import check_numeric_flags
from autohet_ray.cli.common import TRAIN_ALIASES, TRAIN_NOTES, run_options
from autohet_ray.cli.data import add_data_parser, cmd_data
from autohet_ray.cli.export import add_export_parser, cmd_export
from autohet_ray.cli.money import add_money_options
from autohet_ray.cli.options import add_options
from autohet_ray.cli.plan import cmd_evaluate, cmd_plan, cmd_show
from autohet_ray.cli.resume import add_resume_parser, cmd_resume
from autohet_ray.cli.testbed import add_testbed_parser, cmd_testbed
from autohet_ray.cli.train import cmd_profile_local, cmd_profile_ray, cmd_train
from autohet_ray.config_io import check_writable
from autohet_ray.job.config import TrainJob
from autohet_ray.job.file import REFERENCES, Launch


class _OneLineParser(argparse.ArgumentParser):
    """A bad flag is one line on stderr and exit code 2 (argparse would print the usage first: see --help)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    ap = _OneLineParser(prog="autohet", description="Asymmetric 3D-parallel training on mixed GPUs")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="plan a job and compare with Megatron-LM and Whale")
    p.add_argument("--cluster", required=True)
    p.add_argument("--model", required=True, help="preset name, model YAML, or hf:DIR (a Hugging Face config.json)")
    p.add_argument("--global-batch", type=int, required=True)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--micro-batch", type=int)
    _schedule_option(p)
    add_money_options(p)
    p.add_argument("--profile", help="profile DB JSON (default: analytic, from the device catalog)")
    p.add_argument("--time-limit", type=float, default=60.0)
    p.add_argument("--dtype", choices=("bf16", "fp32", "bfloat16", "float32"), default="bf16",
                   help="training dtype the analytic profile prices (bf16: fp32 master weights; default bf16)")
    p.add_argument("--out")
    p.add_argument("--json", action="store_true")
    e = sub.add_parser("evaluate", help="price a hand-written plan, or say why it is infeasible")
    e.add_argument("--plan", required=True)
    e.add_argument("--cluster", required=True)
    e.add_argument("--profile")
    e.add_argument("--dtype", choices=("bf16", "fp32", "bfloat16", "float32"),
                   help="dtype the analytic profile prices (default: the dtype the plan records, else bf16)")
    e.add_argument("--json", action="store_true")
    s = sub.add_parser("show", help="draw a plan: pipeline timeline and memory per device")
    s.add_argument("plan")
    s.add_argument("--png")
    pr = sub.add_parser("profile", help="profile the real torch layers: on this device (--local), or once per GPU "
                                        "type of a Ray cluster (--cluster)")
    pr.add_argument("--local", action="store_true", help="profile this machine's device, without Ray")
    pr.add_argument("--cluster", help="cluster file; profile each of its GPU types on the Ray cluster")
    pr.add_argument("--emulate", action="store_true", help="start an emulated Ray cluster from --cluster")
    pr.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS or a running local cluster)")
    pr.add_argument("--cache", help="directory caching per-GPU-type profiles")
    pr.add_argument("--model", required=True)
    pr.add_argument("--device-type", default="CPU", help="name to file the local device under")
    pr.add_argument("--tp", default="1", help="comma-separated TP degrees to emulate on one device")
    pr.add_argument("--micro-batch", default="1", help="comma-separated micro-batch sizes")
    pr.add_argument("--seq-len", type=int)
    pr.add_argument("--ranks", type=int, help="--local: devices computing at once during the in-situ timing, as "
                                              "a step runs them (one process each: a GPU, or a CPU core with "
                                              "one thread); default: each entry's TP degree")
    pr.add_argument("--out", required=True)
    _train_parser(sub)
    add_resume_parser(sub)
    add_data_parser(sub)
    add_export_parser(sub)
    add_testbed_parser(sub)
    return ap


def _schedule_option(parser) -> None:
    parser.add_argument("--schedule", default=TrainJob.schedule,
                        help="pipeline schedule: auto (the faster that fits in memory), 1f1b, or zb-h1 "
                             "(zero-bubble: weight gradients deferred into the pipeline's idle time)")
    parser.add_argument("--recompute", default=TrainJob.recompute, choices=("none", "full", "auto"),
                        help="activation recomputation: none, full (every stage), or auto (the planner picks it "
                             "per stage where it makes the plan fit or faster)")
    parser.add_argument("--optimizer-sharding", default=TrainJob.optimizer_sharding, choices=("none", "dp", "auto"),
                        help="shard optimizer state (fp32 master, AdamW moments) across each layer's data-parallel "
                             "holders: none, dp (every stage), or auto (the planner picks it per stage where it "
                             "makes the plan fit or faster)")


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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
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
