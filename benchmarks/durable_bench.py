"""Two costs of durable storage writes, one JSON line each.

metrics: bytes PUT to S3 (moto on loopback; the request bodies counted on the client) for `--steps` metrics lines
of `--line-bytes` each: metrics.jsonl as numbered parts (LineLog, PART_LINES lines a part) against the old way,
the whole log uploaded again every step.
fsync: seconds to write `--chunks` chunks of `--chunk-mib` MiB into a LocalDirTier on disk with fsync (file, then
directory) and without; the median of `--reps` repetitions each, and their ratio.

    python -m benchmarks run durable -- [--steps 200] [--line-bytes 1750] [--chunks 64] [--chunk-mib 1] [--reps 3]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path


from autohet_ray.checkpoint.tiers.localdir import LocalDirTier
from autohet_ray.storage import job_files
from autohet_ray.storage.spec import storage_spec


def metric_line(step: int, size: int) -> str:
    head = json.dumps({"step": step, "loss": 1.0 / step, "pad": ""})
    return head[:-2] + "x" * (size - len(head)) + '"}'


def count_put_bytes(client) -> list[int]:
    """A one-element list that grows by the body size of every PutObject the client sends."""
    total = [0]

    def count(params, **_):                  # params: the request as it is sent (its body serialized)
        body = params["body"]
        total[0] += len(body) if isinstance(body, (bytes, bytearray)) else len(body.getvalue())
    client.meta.events.register("before-call.s3.PutObject", count)
    return total


def metrics_bytes(steps: int, line_bytes: int) -> dict:
    from tests.s3_server import CREDENTIALS, moto_endpoint, new_bucket
    os.environ.update({"AWS_ACCESS_KEY_ID": CREDENTIALS["aws_access_key_id"],
                       "AWS_SECRET_ACCESS_KEY": CREDENTIALS["aws_secret_access_key"],
                       "AWS_DEFAULT_REGION": CREDENTIALS["region_name"]})
    with moto_endpoint() as endpoint:
        bucket = new_bucket(endpoint)
        client = job_files.s3_client(bucket, endpoint)
        counted = count_put_bytes(client)
        lines = [metric_line(step, line_bytes) for step in range(1, steps + 1)]
        parts_spec = storage_spec(f"s3://{bucket}/parts", endpoint_url=endpoint)
        log = job_files.LineLog(parts_spec, job_files.METRICS_FILE)
        for line in lines:
            log.append(line)
        parts = counted[0]
        assert job_files.read_lines(parts_spec) == lines
        counted[0], text = 0, ""
        for line in lines:                                   # the old way: the whole log again every step
            text += line + "\n"
            client.put_object(Bucket=bucket, Key="whole/metrics.jsonl", Body=text.encode())
        whole = counted[0]
    return {"bench": "metrics_put_bytes", "steps": steps, "line_bytes": line_bytes,
            "part_lines": job_files.PART_LINES, "parts_bytes": parts, "whole_reupload_bytes": whole,
            "ratio_whole_over_parts": round(whole / parts, 2)}


def write_chunks(root: Path, chunks: int, blob: bytes, fsync: bool) -> float:
    tier = LocalDirTier(root, name="bench", fsync=fsync)
    start = time.perf_counter()
    for i in range(chunks):
        tier.put_chunk(f"step-0000000001/t{i % 8}/{i}-1", blob)
    return time.perf_counter() - start


def fsync_cost(chunks: int, chunk_mib: int, reps: int) -> dict:
    blob = os.urandom(chunk_mib << 20)
    base = Path(tempfile.mkdtemp(prefix="durable-bench-", dir=os.environ.get("BENCH_DIR", "/var/tmp")))
    seconds = {True: [], False: []}
    try:
        for rep in range(reps):
            for fsync in (False, True):
                root = base / f"{rep}-{fsync}"
                seconds[fsync].append(write_chunks(root, chunks, blob, fsync))
                shutil.rmtree(root)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    on, off = statistics.median(seconds[True]), statistics.median(seconds[False])
    return {"bench": "fsync_chunk_writes", "chunks": chunks, "chunk_mib": chunk_mib, "reps": reps,
            "dir": str(base.parent), "seconds_fsync": round(on, 3), "seconds_no_fsync": round(off, 3),
            "ratio": round(on / off, 2), "all_fsync": [round(s, 3) for s in seconds[True]],
            "all_no_fsync": [round(s, 3) for s in seconds[False]], "load_avg_1m": os.getloadavg()[0]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--line-bytes", type=int, default=1750)
    parser.add_argument("--chunks", type=int, default=64)
    parser.add_argument("--chunk-mib", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    print(json.dumps(metrics_bytes(args.steps, args.line_bytes)), flush=True)
    print(json.dumps(fsync_cost(args.chunks, args.chunk_mib, args.reps)), flush=True)


if __name__ == "__main__":
    main()
