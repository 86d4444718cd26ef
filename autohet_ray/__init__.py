"""autohet_ray: asymmetric 3D-parallel training on heterogeneous GPU clusters, on Ray."""
import logging
import sys

__version__ = "0.1.0"


class ConfigError(ValueError):
    """A user-supplied value is invalid; the message names the value and what would be valid."""


class _Console(logging.StreamHandler):
    """Each record as its plain line on whatever sys.stderr is when it is emitted (a CLI or a test may swap it)."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


# Every module logs through its own logger under "autohet_ray"; its records reach stderr as the lines they always
# were (the CLI sets the level, --log-level, and adds --log-file). Remove CONSOLE to route them elsewhere only.
CONSOLE = _Console()
CONSOLE.setLevel(logging.INFO)
logging.getLogger(__name__).addHandler(CONSOLE)
logging.getLogger(__name__).setLevel(logging.INFO)


_BASE_RECORDS = logging.getLogRecordFactory()


def label_records(*, rank: int, pipeline: int, stage: int, device: str) -> None:
    """In a Ray worker: each record names the rank, stage and device that wrote it, as fields (record.rank,
    .pipeline, .stage, .device) and at the start of its console line (Ray forwards a worker's stderr to the
    driver, prefixed with the worker's pid and node). A reused worker that takes a new place calls it again."""
    place = {"rank": rank, "pipeline": pipeline, "stage": stage, "device": device}

    def placed(*args, **kwargs) -> logging.LogRecord:
        record = _BASE_RECORDS(*args, **kwargs)
        record.__dict__.update(place)
        return record
    logging.setLogRecordFactory(placed)
    CONSOLE.setFormatter(logging.Formatter(f"[rank {rank} pipeline {pipeline} stage {stage} {device}] %(message)s"))
