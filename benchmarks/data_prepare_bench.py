"""`data prepare` speed, side by side in one run, on the Python standard library's own source:
- the `tokenizers` library's own single-thread encode rate (encode_batch with TOKENIZERS_PARALLELISM=false, in
  this process, on the texts already in memory, one call per group of files of the same size as a task's, which
  is faster than one call for every file at once) — the reference: no reading, no Ray, no writing;
- `prepare_dataset` with 1 Ray worker, then with 2 (each task single-threaded), on one local Ray of 2 CPUs
  started (and warmed up with a small preparation) before either is timed; --rounds rounds of the three
  phases in turn, each phase's fastest round counted. The timed span is the whole call:
  listing, reading and shipping the files, tokenizing, writing and hashing the shards and the index.
Bars: 2 workers >= 1.6x one worker; one worker >= 80% of the library's rate. Whether the machine was busy
with anything else shows per phase: the machine's busy cores (/proc/stat) less those used by this process and
its descendants (the local Ray) = the cores other processes took meanwhile. Ends with one JSON line.

    python -m benchmarks run data-prepare -- [--mb 16] [--shard-mb 1] [--vocab 4096] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sysconfig
import tempfile
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"     # before tokenizers is imported: one thread for everything

import numpy as np  # noqa: E402
import ray  # noqa: E402

from autohet_ray.data.tokenize import tokenizer_from_json, train_byte_level_bpe  # noqa: E402
from autohet_ray.data.parts import Source, group_into_parts  # noqa: E402
from autohet_ray.orchestrate.data_prepare import prepare_dataset  # noqa: E402

SPEEDUP_BAR, VS_LIBRARY_BAR = 1.6, 0.8


def stdlib_corpus(megabytes: float) -> list[pathlib.Path]:
    """The first `megabytes` of the standard library's UTF-8 .py files (site-packages left out), by path."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    chosen, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or not path.is_file():
            continue
        data = path.read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue                                    # a few test files are deliberately not UTF-8
        if b"\0" in data or not data.strip():
            continue
        chosen.append(path)
        total += len(data)
        if total >= megabytes * 1e6:
            break
    return chosen


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) CPU jiffies of the whole machine since boot."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def own_jiffies() -> int:
    """CPU jiffies used by this process and its descendants (the local Ray: raylet, GCS, workers)."""
    parents, used = {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue                                # ended meanwhile
            parents[int(entry)] = int(fields[1])
            used[int(entry)] = int(fields[11]) + int(fields[12])        # utime + stime
    ours, frontier = {os.getpid()}, [os.getpid()]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in ours]
        ours.update(children)
        frontier += children
    return sum(used.get(pid, 0) for pid in ours)


def timed(fn):
    """(result, wall seconds, CPU cores busy on the whole machine, CPU cores used by others) of fn()."""
    (busy0, total0), own0 = machine_jiffies(), own_jiffies()
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
    (busy1, total1), own1 = machine_jiffies(), own_jiffies()
    cores = os.cpu_count() / max(total1 - total0, 1)
    return result, seconds, (busy1 - busy0) * cores, max(0, busy1 - busy0 - (own1 - own0)) * cores


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=16.0, help="corpus size, megabytes of stdlib source")
    ap.add_argument("--shard-mb", type=float, default=1.0, help="input megabytes per task")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3, help="each phase's fastest round counts")
    args = ap.parse_args(argv)
    load_before = os.getloadavg()
    files = stdlib_corpus(args.mb)
    texts = [p.read_bytes().decode("utf-8") for p in files]     # as prepare reads them: no newline translation
    num_bytes = sum(p.stat().st_size for p in files)
    print(f"corpus: {len(files)} stdlib files, {num_bytes / 1e6:.1f} MB; load average {load_before}", flush=True)
    tokenizer_json = train_byte_level_bpe(texts[:max(1, len(texts) // 6)], args.vocab)
    tok = tokenizer_from_json(tokenizer_json)
    work = pathlib.Path(tempfile.mkdtemp(prefix="data-prepare-bench-"))
    (work / "tok").mkdir()
    (work / "tok" / "tokenizer.json").write_text(tokenizer_json)

    def run(workers: int, out: str, inputs=files):
        return prepare_dataset([str(p) for p in inputs], str(work / out), tokenizer=str(work / "tok"),
                               workers=workers, shard_bytes=int(args.shard_mb * (1 << 20)), progress=quiet)

    sources = [Source(str(p), p.stat().st_size) for p in files]
    at = np.cumsum([0] + [len(part) for part in group_into_parts(sources, int(args.shard_mb * (1 << 20)))])
    groups = [texts[at[k]:at[k + 1]] for k in range(len(at) - 1)]
    quiet = open(os.devnull, "w")
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    best = {}                          # phase -> (seconds, machine cores busy, others' cores, result), fastest round
    try:
        run(2, "warm-up", files[:len(files) // 4])      # both worker processes started, imports done
        for r in range(args.rounds):
            phases = {"library": lambda: [e for g in groups for e in tok.encode_batch(g, add_special_tokens=False)],
                      "one_worker": lambda: run(1, f"one-{r}"), "two_workers": lambda: run(2, f"two-{r}")}
            for name, fn in phases.items():
                result, seconds, busy, others = timed(fn)
                print(f"round {r}: {name} {seconds:.2f} s ({busy:.2f} cores busy, {others:.2f} of them by "
                      "other processes)", flush=True)
                if name not in best or seconds < best[name][0]:
                    best[name] = (seconds, busy, others, result)
    finally:
        ray.shutdown()
        quiet.close()
        shutil.rmtree(work)
    (library_s, _, _, encodings), (one_s, _, _, one), (two_s, _, _, two) = (
        best["library"], best["one_worker"], best["two_workers"])
    num_tokens = sum(len(e.ids) for e in encodings) + len(encodings)
    print(f"tokenizers library, 1 thread: {num_bytes / library_s / 1e6:.2f} MB/s ({library_s:.1f} s, "
          f"{best['library'][2]:.2f} cores used by other processes)")
    assert one["fingerprint"] == two["fingerprint"] and one["tokens"] == two["tokens"] == num_tokens
    rates = {"library": num_bytes / library_s, "one_worker": num_bytes / one_s, "two_workers": num_bytes / two_s}
    speedup, vs_library = one_s / two_s, rates["one_worker"] / rates["library"]
    for name, key, seconds in (("1 worker", "one_worker", one_s), ("2 workers", "two_workers", two_s)):
        print(f"data prepare, {name}: {rates[key] / 1e6:.2f} MB/s, {num_tokens / seconds / 1e3:.0f} k tokens/s "
              f"({seconds:.1f} s, {best[key][1]:.2f} cores busy, {best[key][2]:.2f} by other processes)")
    print(f"2 workers vs 1: {speedup:.2f}x (bar {SPEEDUP_BAR}x)  1 worker vs the library: {vs_library:.0%} "
          f"(bar {VS_LIBRARY_BAR:.0%})")
    print(json.dumps({"bench": "data_prepare", "files": len(files), "bytes": num_bytes, "tokens": num_tokens,
                      "shards": len(one["index"]["shards"]), "mb_per_s": {k: v / 1e6 for k, v in rates.items()},
                      "seconds": {"library": library_s, "one_worker": one_s, "two_workers": two_s},
                      "cores_busy": {k: v[1] for k, v in best.items()},
                      "cores_used_by_others": {k: v[2] for k, v in best.items()},
                      "load_average_before": load_before, "rounds": args.rounds, "speedup_2_vs_1": speedup,
                      "one_worker_vs_library": vs_library,
                      "pass": {"speedup": speedup >= SPEEDUP_BAR, "vs_library": vs_library >= VS_LIBRARY_BAR}}))


if __name__ == "__main__":
    main()
