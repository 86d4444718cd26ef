"""Ray Train checkpoints in autohet's own format, so a `TorchTrainer` run takes part in recovery.

A reported checkpoint directory is a checkpoint tier laid out as `LocalDirTier` lays one out:
`step-<step>/<tensor>/<chunk>` hashed blobs plus `manifests/step-<step>.json`.

Saving (`report_step`, every worker after each train_step): on a checkpoint step each rank writes the chunks
it is the writer of (per tensor the tiles of one pipeline, one writer per tile, so the chunks tile every
tensor exactly once) into its own local staging directory; plan rank 0 gathers every rank's records, which
returns only once every rank has written (the barrier), and commits the step's manifest into its directory.
Then every worker calls `ray.train.report` with its directory. Ray Train copies all of them into one
directory of the run's storage, `<storage_path>/<run name>/checkpoint_<time>/` (rank 0 picks the name for
all), and registers the checkpoint once every worker's upload is done; the union is one complete step,
since no two ranks write the same key (a worker the plan leaves out reports an empty directory). That
directory is the step's only copy, so Ray Train's CheckpointConfig(num_to_keep) is its retention: deleting a
checkpoint directory deletes the step.

Restoring (`restore_from_train_checkpoint`, every worker at the start of the loop): each rank reads only the
saved chunks that overlap its own layout, straight from the checkpoint's filesystem (local, NFS, S3, ...
through pyarrow), verifies each against the manifest's hash and loads them: the plan may differ from the one
that saved (other GPUs, TP degrees, stage boundaries). The manifest's extra (the data position, the plan and
the workers that saved it) tells the next start where to continue and whether its plan still fits.
"""
from __future__ import annotations

import tempfile

from pyarrow import fs as pafs
import ray.train
import torch.distributed as dist

from autohet_ray import ConfigError
from autohet_ray.checkpoint import (ChunkMissingError, ChunkRecord, LocalDirTier, Manifest, TierUnavailableError,
                                    commit_step, find_manifest, latest_committed_step, restore)
from autohet_ray.checkpoint.codec import digest
from autohet_ray.checkpoint.hf_export import export_step
from autohet_ray.checkpoint.hf_weights import load_rank_state
from autohet_ray.checkpoint.holdings import tiling_holdings as tile_holdings
from autohet_ray.checkpoint.keys import MANIFEST_PREFIX, chunk_key, manifest_key, step_of_manifest_key
from autohet_ray.checkpoint.peers import assign_writers
from autohet_ray.checkpoint.snapshot import encode_shards
from autohet_ray.data.dataset import Dataset
from autohet_ray.orchestrate.worker import holdings_of
from autohet_ray.runtime.lr_schedule import check_resumed_config

TIER_NAME = "ray-train"


def writer_items(engine) -> set:
    """Collective (every rank of the plan): the (name, chunk)s this rank writes in a step's checkpoint."""
    assert dist.get_rank() == engine.rank, "the default process group's ranks must be plan ranks (engine_for_worker)"
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (engine.info.pipeline, holdings_of(engine)))
    holdings = {rank: items for rank, (_, items) in enumerate(gathered)}
    pipelines = {rank: pipeline for rank, (pipeline, _) in enumerate(gathered)}
    return assign_writers(tile_holdings(holdings, pipelines))[engine.rank]


def save_train_checkpoint(engine, directory: str, *, extra: dict | None = None) -> Manifest | None:
    """Collective: write this rank's chunks of the engine's current step into `directory`; plan rank 0 also
    commits the step's manifest there once every rank has written. Returns the manifest on plan rank 0."""
    step, owned = engine.step, writer_items(engine)
    tier = LocalDirTier(directory, name=TIER_NAME, fsync=False)    # a staging copy: Ray Train uploads it
    records = []
    for item in encode_shards(engine.snapshot_state(), owned):
        tier.put_chunk(chunk_key(step, item.name, item.chunk), item.blob)
        records.append(ChunkRecord(step=step, name=item.name, global_shape=item.shape, chunk=item.chunk,
                                   dtype=item.dtype, digest=digest(item.blob), nbytes=len(item.blob),
                                   replicas=(TIER_NAME,)))
    gathered = [None] * dist.get_world_size() if engine.rank == 0 else None
    dist.gather_object(records, gathered, dst=0)
    if engine.rank != 0:
        return None
    info = {"model": engine.spec.name, "plan": engine.plan.to_dict(),
            "optimizer": engine.optimizer_config.to_dict(), **(extra or {})}   # the schedule goes with the step
    return commit_step(step, [r for rank_records in gathered for r in rank_records], [tier], extra=info)


def check_checkpoint_every(checkpoint_every) -> None:
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 0:
        raise ConfigError(f"checkpoint_every={checkpoint_every!r} must be an integer >= 0 (0: no checkpoints)")


def report_step(engine, out: dict, *, checkpoint: bool, metrics: dict | None = None, extra: dict | None = None) -> bool:
    """Every worker, after each `train_step` (its result is `out`): `ray.train.report` the step and loss (and
    `metrics`), with the step's checkpoint when `checkpoint` (every worker must agree); `extra` goes in the
    step's manifest (the data position). Returns `checkpoint`."""
    assert out["step"] == engine.step, (out["step"], engine.step)
    reported = {"step": engine.step, "loss": float(out["loss"]), **(metrics or {})}
    if not checkpoint:
        ray.train.report(reported)
        return False
    with tempfile.TemporaryDirectory(prefix=f"autohet-step-{engine.step}-") as staging:
        save_train_checkpoint(engine, staging, extra=extra)
        ray.train.report(reported, checkpoint=ray.train.Checkpoint.from_directory(staging))
    return True


def report_idle(metrics: dict, *, checkpoint: bool) -> None:
    """A worker that holds no part of the plan: its share of a step's `ray.train.report` (with an empty
    directory when the others report a checkpoint, so that every worker reports one)."""
    if not checkpoint:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory(prefix="autohet-idle-") as empty:
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(empty))


class TrainCheckpointTier:
    """A read-only checkpoint tier over a `ray.train.Checkpoint`'s directory on its own filesystem."""

    def __init__(self, checkpoint: ray.train.Checkpoint, *, name: str = TIER_NAME):
        self.name, self.filesystem, self.root = name, checkpoint.filesystem, checkpoint.path.rstrip("/")

    def get_chunk(self, key: str) -> bytes:
        try:
            with self.filesystem.open_input_file(f"{self.root}/{key}") as f:
                return f.read()
        except FileNotFoundError:
            raise ChunkMissingError(key, self.name) from None
        except OSError as err:
            raise TierUnavailableError(self.name, f"{self.root}/{key}: {err}") from None

    def has(self, key: str) -> bool:
        return self.filesystem.get_file_info(f"{self.root}/{key}").type == pafs.FileType.File

    def get_manifest(self, step: int) -> bytes:
        return self.get_chunk(manifest_key(step))

    def list_manifests(self) -> list[int]:
        selector = pafs.FileSelector(f"{self.root}/{MANIFEST_PREFIX.rstrip('/')}", allow_not_found=True)
        names = (info.path.rsplit("/", 1)[-1] for info in self.filesystem.get_file_info(selector))
        steps = (step_of_manifest_key(MANIFEST_PREFIX + name) for name in names)
        return sorted(s for s in steps if s is not None)


def checkpoint_manifest(checkpoint: ray.train.Checkpoint) -> Manifest:
    """The committed step a checkpoint reported by `report_step` holds (checked: own hash, exact coverage)."""
    tier = TrainCheckpointTier(checkpoint)
    step = latest_committed_step([tier])
    if step is None:
        raise ConfigError(f"checkpoint {checkpoint.path!r} holds no committed autohet step "
                          f"({MANIFEST_PREFIX}step-*.json); report checkpoints with report_step")
    return find_manifest([tier], step)


def restore_from_train_checkpoint(engine, *, initial: ray.train.Checkpoint | None = None, data=None,
                                  init_from: str | None = None, num_threads: int = 4) -> int | None:
    """At the start of `train_loop_per_worker` (every worker): load the newest checkpoint this run reported
    (`ray.train.get_checkpoint()`, set when Ray Train restarted the worker group), else `initial` (e.g. a
    checkpoint of an earlier run passed in `train_loop_config`), into `engine`, resharded onto its plan; with
    `data` (a TrainingData), ConfigError unless the checkpoint's data position continues with it. With nothing
    to restore, load this rank's slices of the Hugging Face checkpoint `init_from` (when given). Returns the
    restored step, or None when there is nothing to restore."""
    checkpoint = ray.train.get_checkpoint() or initial
    if checkpoint is None:
        if init_from is not None:
            state, _ = load_rank_state(init_from, engine.spec, engine.layout)
            engine.load_state_dict(state)
        return None
    manifest = checkpoint_manifest(checkpoint)
    saved_model = manifest.extra.get("model")
    if saved_model is not None and saved_model != engine.spec.name:
        raise ConfigError(f"checkpoint {checkpoint.path!r} holds model {saved_model!r}, "
                          f"this run trains {engine.spec.name!r}")
    check_resumed_config(manifest.extra.get("optimizer"), engine.optimizer_config, f"checkpoint {checkpoint.path!r}")
    state, _ = restore(manifest, engine.restore_needs(), [TrainCheckpointTier(checkpoint)],
                       num_threads=num_threads)
    engine.load_state_dict(state)
    assert engine.step == manifest.step, (engine.step, manifest.step)
    if data is not None:
        data.check(manifest.extra, manifest.step)
    return manifest.step


def export_train_checkpoint(checkpoint: ray.train.Checkpoint, spec, out: str, *, data: str | None = None) -> dict:
    """Write the step a reported checkpoint holds as a Hugging Face directory `out` (config.json, safetensors,
    and the tokenizer of the prepared dataset `data`, when given), as `autohet export` does a job's step."""
    tokenizer_json = eos_id = None
    if data is not None:
        dataset = Dataset.open(data, verify=False)
        with open(dataset.tokenizer_path) as f:
            tokenizer_json = f.read()
        eos_id = dataset.index.eos_id
    report = export_step([TrainCheckpointTier(checkpoint)], spec, out, tokenizer_json=tokenizer_json,
                         eos_token_id=eos_id)
    return vars(report)
