"""What `autohet train` and `autohet resume` share: the options of a run that are not part of its job, and the
aliases and notes their generated options get."""
from __future__ import annotations

AUTO_ITERATION_WALL_S = 10.0      # --emulate, unpaced otherwise: one predicted iteration takes this long

# deprecated spellings: still read, hidden from --help
TRAIN_ALIASES = {"checkpoint_every": ["--cloud-every"], "recovery_window_steps": ["--recovery-window"]}
TRAIN_NOTES = {"iteration_wall_s": f"With --emulate and neither this nor --time-scale: {AUTO_ITERATION_WALL_S}.",
               "decay_steps": "A decay with none given ends at --steps."}


def run_options(parser) -> None:
    """The options of a run that are not part of its job (`train` and `resume`)."""
    parser.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS or a running local cluster)")
    parser.add_argument("--endpoint-url", help="S3 endpoint of an s3:// storage (default: AWS_ENDPOINT_URL, or AWS)")
    parser.add_argument("--break-lease", action="store_true", help="take the storage's lease even though another "
                        "run holds it (only when that run is gone; one on this host that is gone is broken without "
                        "this) (default: off)")
