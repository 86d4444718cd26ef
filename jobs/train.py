"""Train with autohet on the Ray cluster this job runs in. Runs unchanged under

    ray job submit --working-dir . -- python jobs/train.py --config jobs/paper-24.yaml --no-emulate

or with flags only (`--cluster jobs/local-1.yaml --model tiny-gpt --global-batch 4 --steps 2 --emulate`): the
same options as `autohet train`, a job file (--config) with flags over single fields included. RAY_ADDRESS, set by
`ray job submit`, selects the cluster."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the working dir's package

from autohet_ray.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
