"""The benchmark runner.

    python -m benchmarks list                                  one line per case
    python -m benchmarks run NAME [--quick] [-- OPTIONS...]    one case (NAME:PART for one part of it)

`run` passes OPTIONS to the case, prints what it prints (its result last, as one JSON line) and writes the result,
with the commit, this machine's cores and load, and the time, to benchmarks/measured/NAME-<date>.json."""
from __future__ import annotations

import argparse
import pathlib
import sys

from benchmarks.cases import CASES, find
from benchmarks.harness import MEASURED, run_case


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="one line per case")
    run = sub.add_parser("run", help="run one case and record its result")
    run.add_argument("name", help="a case, or CASE:PART")
    run.add_argument("--quick", action="store_true", help="the case's quick form (under a minute here)")
    run.add_argument("--out", type=pathlib.Path, default=MEASURED, help="where the record goes (%(default)s)")
    run.epilog = "The case's own options follow --, e.g. run recovery -- --hidden 256."
    argv = sys.argv[1:] if argv is None else list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)      # after --: the case's own options
    args, options = ap.parse_args(argv[:cut]), argv[cut + 1:]
    if args.command == "list":
        width = max(len(c.name) for c in CASES)
        for case in CASES:
            parts = f" (parts: {', '.join(case.parts)})" if case.parts else ""
            print(f"{case.name:<{width}}  {case.measures}{parts}")
        return 0
    try:
        case, part = find(args.name)
    except KeyError as err:
        print(err.args[0], file=sys.stderr)
        return 2
    if args.quick and case.quick is None:
        print(f"{case.name} has no quick form; run it without --quick", file=sys.stderr)
        return 2
    return run_case(case, part, (list(case.quick) if args.quick and part is None else []) +
                    (["--quick"] if args.quick and part else []) + options, out_dir=args.out)


if __name__ == "__main__":
    sys.exit(main())
