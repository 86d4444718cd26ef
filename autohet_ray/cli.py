"""The `autohet` command. Bad input gets one line naming the value and what is valid, exit code 2."""
from __future__ import annotations

import argparse
import sys

from autohet_ray import ConfigError
from autohet_ray.cli_checks import check_numeric_flags
from autohet_ray.config_io import check_writable

AUTO_ITERATION_WALL_S = 10.0      # --time-scale auto: one predicted iteration takes about this long on the wall


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
    from autohet_ray.cli_money import add_money_options
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
    from autohet_ray.cli_resume import add_resume_parser
    add_resume_parser(sub)
    from autohet_ray.cli_data import add_data_parser
    add_data_parser(sub)
    from autohet_ray.cli_export import add_export_parser
    add_export_parser(sub)
    return ap


def _schedule_option(parser) -> None:
    parser.add_argument("--schedule", default="auto",
                        help="pipeline schedule: auto (the faster that fits in memory), 1f1b, or zb-h1 "
                             "(zero-bubble: weight gradients deferred into the pipeline's idle time)")
    parser.add_argument("--recompute", default="none", choices=("none", "full", "auto"),
                        help="activation recomputation: none, full (every stage), or auto (the planner picks it "
                             "per stage where it makes the plan fit or faster)")
    parser.add_argument("--optimizer-sharding", default="none", choices=("none", "dp", "auto"),
                        help="shard optimizer state (fp32 master, AdamW moments) across each layer's data-parallel "
                             "holders: none, dp (every stage), or auto (the planner picks it per stage where it "
                             "makes the plan fit or faster)")


def _train_parser(sub) -> None:
    from autohet_ray.job.config import TrainJob
    t = sub.add_parser("train", help="train on a Ray cluster: discover, profile, plan, place, train")
    t.add_argument("--cluster", required=True, help="cluster file (nodes, GPU types, links)")
    t.add_argument("--model", required=True, help="preset name, model YAML, or hf:DIR (a Hugging Face config.json)")
    t.add_argument("--init-from", help="Hugging Face directory (config.json + safetensors) to start from; each rank "
                   "reads only its slices")
    t.add_argument("--global-batch", type=int, required=True)
    t.add_argument("--steps", type=int, required=True)
    t.add_argument("--plan", help="plan JSON to run (default: plan now)")
    t.add_argument("--emulate", action="store_true",
                   help="emulated GPUs: pace each op to the profile's prediction (starts a local emulated "
                        "cluster unless --address or RAY_ADDRESS is given)")
    t.add_argument("--time-scale", default="auto",
                   help="wall seconds per emulated second, or auto (a predicted iteration lasts --iteration-wall-s)")
    t.add_argument("--iteration-wall-s", type=float, default=AUTO_ITERATION_WALL_S,
                   help="--time-scale auto: wall seconds of one predicted iteration (room for the real CPU work)")
    t.add_argument("--data", help="a dataset made by `autohet data prepare` (directory or s3://bucket/prefix); "
                   "default: synthetic random tokens")
    t.add_argument("--eval-every", type=int, default=TrainJob.eval_every,
                   help="--data: validation loss every N steps (forward only, with the running plan)")
    t.add_argument("--eval-batches", type=int, default=TrainJob.eval_batches,
                   help="validation global batches per evaluation")
    t.add_argument("--storage", help="directory or s3://bucket/prefix: the job's checkpoints, plan, profile and "
                   "per-step metrics")
    t.add_argument("--tensorboard", metavar="DIR", help="also write the per-step metrics (loss, lr, tokens/s, MFU, "
                   "peak memory) as TensorBoard events into DIR (needs: pip install 'autohet_ray[tensorboard]')")
    t.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS or a running local cluster)")
    t.add_argument("--seq-len", type=int)
    t.add_argument("--micro-batch", type=int)
    _schedule_option(t)
    from autohet_ray.cli_money import add_money_options
    add_money_options(t)
    t.add_argument("--profile", default="analytic", help="analytic, measured (profile on Ray), or a profile JSON")
    t.add_argument("--profile-cache", help="directory caching measured profiles")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--dtype", default=TrainJob.dtype,
                   help="compute dtype: bf16 (fp32 master weights and AdamW), fp32, fp64, or auto (bf16 on GPUs, "
                        "fp32 on CPU); also float32, float64, bfloat16")
    _optimizer_options(t)
    t.add_argument("--plan-time-limit", type=float, default=TrainJob.plan_time_limit_s)
    t.add_argument("--placement-timeout", type=float, default=TrainJob.setup_timeout_s,
                   help="seconds the workers may take to start and join")
    t.add_argument("--json", action="store_true", help="end with one JSON line of the run's figures")
    t.add_argument("--elastic", action="store_true",
                   help="checkpoint every step to the nodes (two copies) and recover from node loss local-first")
    t.add_argument("--checkpoint-every", "--cloud-every", dest="checkpoint_every", type=int,
                   default=TrainJob.checkpoint_every, help="commit to --storage every N steps (and at the end)")
    t.add_argument("--dataset-cache-gb", type=float, default=TrainJob.dataset_cache_gb,
                   help="--data s3://...: the node's dataset cache keeps at most this many GB (least recently "
                        "used datasets that no running job holds are evicted)")
    t.add_argument("--loss-grace-s", type=float, default=TrainJob.loss_grace_s,
                   help="a node whose raylet stays silent this long is lost (a shorter stall costs nothing)")
    t.add_argument("--endpoint-url", help="S3 endpoint of an s3:// --storage (default: AWS_ENDPOINT_URL, or AWS)")
    t.add_argument("--max-recoveries", type=int, default=TrainJob.max_recoveries,
                   help="recoveries allowed within --recovery-window steps without progress; one more failure "
                        "stops the job (its newest committed step secured first; exit status 4)")
    t.add_argument("--recovery-window", type=int, default=TrainJob.recovery_window_steps, metavar="M",
                   help="--max-recoveries counts the recoveries until the job gets M steps past where it was")
    t.add_argument("--spot-watch", action="store_true",
                   help="--elastic: watch each node's instance metadata for spot interruption notices")
    t.add_argument("--spot-provider", default="aws", help="--spot-watch: aws, gcp, azure, or auto (tries each)")
    t.add_argument("--break-lease", action="store_true", help="take the storage's lease even though another run "
                   "holds it (only when that run is gone; one on this host that is gone is broken without this)")


def _optimizer_options(parser) -> None:
    from autohet_ray.runtime.lr_schedule import DECAYS, OptimizerConfig
    d = OptimizerConfig()
    parser.add_argument("--lr", type=float, default=d.lr, help="peak learning rate")
    parser.add_argument("--min-lr", type=float, default=d.min_lr, help="learning rate at the end of the decay")
    parser.add_argument("--warmup-steps", type=int, default=d.warmup_steps, help="linear warm-up updates")
    parser.add_argument("--decay", default=d.decay, help=f"decay after warm-up: {', '.join(DECAYS)}")
    parser.add_argument("--decay-steps", type=int, help="step at which the decay reaches --min-lr (default: --steps)")
    parser.add_argument("--weight-decay", type=float, default=d.weight_decay,
                        help="AdamW weight decay (never on norms, biases or embeddings)")
    parser.add_argument("--clip-grad", type=float, default=d.clip_grad, help="global grad-norm clip (0: none)")
    parser.add_argument("--adam-beta1", type=float, default=d.betas[0])
    parser.add_argument("--adam-beta2", type=float, default=d.betas[1])


def _message(exc: ConfigError) -> str:
    """The error's own message: one raised in a Ray actor arrives wrapped with the remote traceback, its
    original as `cause`."""
    cause = getattr(exc, "cause", None)
    return str(cause) if isinstance(cause, ConfigError) else str(exc)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        check_numeric_flags(args)
        for option in ("out", "png"):             # outputs are checked before the work that fills them
            if getattr(args, option, None):
                check_writable(getattr(args, option), f"--{option}")
        if args.command == "plan":
            from autohet_ray.cli_plan import cmd_plan
            return cmd_plan(args)
        if args.command == "evaluate":
            from autohet_ray.cli_plan import cmd_evaluate
            return cmd_evaluate(args)
        if args.command == "show":
            from autohet_ray.cli_plan import cmd_show
            return cmd_show(args)
        if args.command == "profile":
            if args.local == bool(args.cluster):
                raise ConfigError("profile needs exactly one of --local (this device) or --cluster FILE (Ray)")
            if args.cluster:
                from autohet_ray.cli_train import cmd_profile_ray
                return cmd_profile_ray(args)
            from autohet_ray.cli_train import cmd_profile_local
            return cmd_profile_local(args)
        if args.command == "train":
            from autohet_ray.cli_train import cmd_train
            return cmd_train(args)
        if args.command == "data":
            from autohet_ray.cli_data import cmd_data
            return cmd_data(args)
        if args.command == "resume":
            from autohet_ray.cli_resume import cmd_resume
            return cmd_resume(args)
        if args.command == "export":
            from autohet_ray.cli_export import cmd_export
            return cmd_export(args)
    except ConfigError as exc:
        print(f"autohet {args.command}: error: {_message(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"autohet {args.command}: interrupted", file=sys.stderr)
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
