"""The `autohet` command. Bad input gets one line naming the value and what is valid, exit code 2."""
from __future__ import annotations

import argparse
import sys

from autohet_ray import ConfigError


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="autohet", description="Asymmetric 3D-parallel training on mixed GPUs")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="plan a job and compare with Megatron-LM and Whale")
    p.add_argument("--cluster", required=True)
    p.add_argument("--model", required=True, help="preset name or model YAML")
    p.add_argument("--global-batch", type=int, required=True)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--micro-batch", type=int)
    p.add_argument("--profile", help="profile DB JSON (default: analytic, from the device catalog)")
    p.add_argument("--time-limit", type=float, default=60.0)
    p.add_argument("--out")
    p.add_argument("--json", action="store_true")
    e = sub.add_parser("evaluate", help="price a hand-written plan, or say why it is infeasible")
    e.add_argument("--plan", required=True)
    e.add_argument("--cluster", required=True)
    e.add_argument("--profile")
    e.add_argument("--json", action="store_true")
    s = sub.add_parser("show", help="draw a plan: pipeline timeline and memory per device")
    s.add_argument("plan")
    s.add_argument("--png")
    pr = sub.add_parser("profile", help="profile the local device's real torch layers")
    pr.add_argument("--local", action="store_true", required=True)
    pr.add_argument("--model", required=True)
    pr.add_argument("--device-type", default="CPU", help="name to file the local device under")
    pr.add_argument("--tp", default="1", help="comma-separated TP degrees to emulate on one device")
    pr.add_argument("--micro-batch", default="1", help="comma-separated micro-batch sizes")
    pr.add_argument("--seq-len", type=int)
    pr.add_argument("--out", required=True)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
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
            from autohet_ray.profile.measure import cmd_profile_local
            return cmd_profile_local(args)
    except ConfigError as exc:
        print(f"autohet {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
