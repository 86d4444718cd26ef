"""`autohet export --storage DIR|s3://... [--step N] --out DIR`: a committed step of a job as a Hugging Face model
directory (config.json, sharded safetensors with their index, the dataset's tokenizer when the job had one),
which `transformers.AutoModelForCausalLM.from_pretrained(DIR)` loads."""
from __future__ import annotations

import json
import sys

from autohet_ray import ConfigError
from autohet_ray.data.index import INDEX_FILE, TOKENIZER_FILE
from autohet_ray.job.record import read_job_record
from autohet_ray.model.spec import model_from_dict
from autohet_ray.storage import job_files
from autohet_ray.storage.spec import check_storage, storage_spec

SIZE_UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "B": 1}


def add_export_parser(sub) -> None:
    e = sub.add_parser("export", help="write a committed step of a job as a Hugging Face model directory")
    e.add_argument("--storage", required=True, help="the job's storage: directory or s3://bucket/prefix "
                   "(default: none, required)")
    e.add_argument("--step", type=int, help="committed step to export (default: the newest)")
    e.add_argument("--out", dest="out_dir", required=True,
                   help="new (or empty) directory to write (default: none, required)")
    e.add_argument("--max-shard-size", default="5GiB", help="largest safetensors file, e.g. 5GiB, 500MB "
                   "(default: 5GiB)")
    e.add_argument("--endpoint-url", help="S3 endpoint of an s3:// --storage (default: AWS_ENDPOINT_URL, or AWS)")
    e.add_argument("--json", action="store_true", help="print the export report as one JSON line (default: off)")


def parse_size(text: str) -> int:
    """Bytes of "5GiB", "500MB", "1000" (bytes)."""
    for unit in sorted(SIZE_UNITS, key=len, reverse=True):
        if text.endswith(unit):
            number = text[: -len(unit)]
            break
    else:
        unit, number = "B", text
    try:
        value = float(number) * SIZE_UNITS[unit]
    except ValueError:
        raise ConfigError(f"--max-shard-size={text!r} must be a size such as 5GiB, 500MB or 1000000") from None
    if not 1 <= value < float("inf"):
        raise ConfigError(f"--max-shard-size={text!r} must be a finite size of at least one byte")
    return int(value)


def _job_record(storage: dict) -> dict:
    return read_job_record(storage, check="model")[1]


def _tokenizer(job: dict, storage: dict) -> tuple[str | None, int | None]:
    """(tokenizer.json text, end-of-document id) of the job's dataset; Nones for synthetic data. A dataset that
    is gone is reported, and the model exported without them."""
    if not job.get("data"):
        return None, None
    data = storage_spec(job["data"], endpoint_url=storage.get("endpoint_url"))
    text, index = job_files.read_text(data, TOKENIZER_FILE), job_files.read_text(data, INDEX_FILE)
    if text is None:
        print(f"autohet export: warning: the job's dataset {job['data']!r} has no {TOKENIZER_FILE} (moved?); "
              "exporting the model without a tokenizer", file=sys.stderr)
    return text, json.loads(index)["eos_id"] if index else None


def cmd_export(args) -> int:
    from autohet_ray.checkpoint.hf_export import export_step  # lazy: torch
    from autohet_ray.elastic.tiers import build_tier  # lazy: Ray and torch
    max_shard = parse_size(args.max_shard_size)
    storage = storage_spec(args.storage, endpoint_url=args.endpoint_url)
    check_storage(storage, create=False)
    job = _job_record(storage)
    spec = model_from_dict(job["model"], source=f"{args.storage} job.json")
    tokenizer_json, eos_id = _tokenizer(job, storage)
    report = export_step([build_tier(storage)], spec, args.out_dir, step=args.step, max_shard_bytes=max_shard,
                         tokenizer_json=tokenizer_json, eos_token_id=eos_id)
    print(f"exported step {report.step} of {spec.name} to {report.out}: {len(report.files)} safetensors files, "
          f"{report.tensors} tensors, {report.bytes_written} bytes" + (", tokenizer" if report.tokenizer else ""))
    if args.json:
        print(json.dumps(vars(report)))
    return 0
