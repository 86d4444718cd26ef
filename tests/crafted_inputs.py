"""Crafted inputs for the tests that no name read from a file escapes its directory: a sentinel file outside
the directory (not read, not written, nothing created beside it), a `..` and an absolute name pointing at it,
and a dataset index, a checkpoint manifest and a Hugging Face directory to put them in.

Test modules import it by path (tests/ is not a package), as s3_server.py.
"""
from __future__ import annotations

import json
import os
import pathlib
import time

import torch


class Sentinel:
    """A file outside the directory under test. Inside `with`, its atime lies in the past (below its ctime),
    so any read moves it (relatime); afterwards `untouched()`: not read, not written, nothing new beside it."""

    def __init__(self, folder: pathlib.Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.path = folder, folder / "sentinel.bin"
        self.content = b"\x01\x00" * 8
        self.path.write_bytes(self.content)
        self.mtime, self.listing = self.path.stat().st_mtime_ns, sorted(os.listdir(folder))
        self.atime = None
        check_reads_are_seen(folder.parent / "control.bin")

    def __enter__(self):
        self.atime = time.time_ns() - 3 * 86400 * 10**9
        os.utime(self.path, ns=(self.atime, self.mtime))
        return self

    def __exit__(self, *exc):
        return False

    def untouched(self) -> bool:
        info = self.path.stat()
        unread = info.st_atime_ns == self.atime
        return (unread and info.st_mtime_ns == self.mtime and self.path.read_bytes() == self.content
                and sorted(os.listdir(self.folder)) == self.listing)


def check_reads_are_seen(control: pathlib.Path) -> None:
    """This filesystem moves the atime of a file read after its atime was set into the past."""
    control.write_bytes(b"x")
    past = time.time_ns() - 3 * 86400 * 10**9
    os.utime(control, ns=(past, past))
    control.read_bytes()
    assert control.stat().st_atime_ns != past, "this filesystem does not record reads (noatime)"
    control.unlink()


def crafted_names(sentinel: Sentinel, directory: pathlib.Path) -> list[str]:
    """A `..` path and an absolute path, both to the sentinel."""
    return [os.path.relpath(sentinel.path, directory), str(sentinel.path)]


def index_with(file: str, data: bytes) -> dict:
    """A dataset index whose one shard is `file` (its hash and fingerprint right: only the name is wrong)."""
    from autohet_ray.data.index import DataIndex, ShardInfo, hash_bytes
    shard = ShardInfo(file=file, num_tokens=len(data) // 2, num_documents=1, xxh3_64=hash_bytes(data))
    return DataIndex(dtype="uint16", vocab_size=100, eos_id=0, mask_id=None, tokenizer_fingerprint="xxh3-64:0",
                     shards=(shard,), train_tokens=len(data) // 2).to_dict()


def manifest_with(tmp_path, name: str, chunk: dict | None = None):
    """A committed manifest in a directory tier, hash right, whose one tensor is `name`."""
    from autohet_ray.checkpoint import ChunkRecord, LocalDirTier, Manifest
    from autohet_ray.layout import Chunk
    tier = LocalDirTier(tmp_path / "ckpt", name="cloud")
    record = ChunkRecord(step=1, name=name, global_shape=(2,), chunk=Chunk.whole((2,)), dtype="float32",
                         digest="xxh3-64:0", nbytes=8, replicas=("cloud",))
    body = json.loads(Manifest(step=1, records=(record,)).to_json())
    if chunk is not None:
        from autohet_ray.checkpoint.codec import digest
        body["body"]["tensors"][name]["chunks"][0]["chunk"] = chunk
        canonical = json.dumps(body["body"], sort_keys=True, separators=(",", ":"))
        body["digest"] = digest(canonical.encode())
    (tmp_path / "ckpt" / "manifests").mkdir(parents=True, exist_ok=True)
    (tmp_path / "ckpt" / "manifests" / "step-0000000001.json").write_text(json.dumps(body))
    return tier


def hf_dir(path: pathlib.Path) -> None:
    """tiny-gpt as a sharded Hugging Face directory (config.json, two safetensors files and their index)."""
    from autohet_ray.model.spec import PRESETS
    from autohet_ray.nn import build_model
    from autohet_ray.nn.hf import save_hf_dir
    torch.manual_seed(0)
    spec = PRESETS["tiny-gpt"]
    state = {n: t.detach() for n, t in build_model(spec).state_dict().items()}
    assert len(save_hf_dir(str(path), spec, state, max_shard_bytes=30_000)) > 1
