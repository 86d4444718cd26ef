"""`autohet data prepare`: tokenize a corpus on Ray into a dataset for `autohet train --data`;
`autohet data check DIR`: verify a prepared dataset (every shard's hash) and summarize it."""
from __future__ import annotations

import json

from autohet_ray import ConfigError
from autohet_ray.data import Dataset


def add_data_parser(sub) -> None:
    d = sub.add_parser("data", help="prepare (tokenize) a training corpus on Ray, or check a prepared one")
    verbs = d.add_subparsers(dest="data_command", required=True)
    p = verbs.add_parser("prepare", help="tokenize text, JSONL or Parquet files into token shards and an index")
    p.add_argument("--input", action="append", required=True,
                   help="file, directory, glob or s3://bucket/prefix (a key glob is allowed); repeatable "
                        "(default: none, required)")
    p.add_argument("--tokenizer", help="directory (or file) of a Hugging Face tokenizer.json; never fetched "
                                                       "(default: none)")
    p.add_argument("--train-tokenizer", type=int, metavar="VOCAB",
                   help="train a byte-level BPE of VOCAB ids on the inputs (saved as tokenizer.json in --out) "
                        "(default: none)")
    # dest is not "out": `autohet` checks an --out as a file to be written, and this one is a directory
    p.add_argument("--out", dest="dataset_out", required=True, help="dataset directory or s3://bucket/prefix "
                   "(default: none, required)")
    p.add_argument("--val-fraction", type=float, default=0.0,
                   help="fraction of the tokens held out at the end of the corpus for validation (default: 0)")
    p.add_argument("--workers", type=int,
                   help="Ray tasks at once, one CPU each (default: every CPU of the cluster, or of this machine)")
    p.add_argument("--text-field", default="text", help="JSONL field / Parquet column holding the text (default: text)")
    p.add_argument("--eos-token", help="the tokenizer's end-of-document token (default: found by name)")
    p.add_argument("--shard-mb", type=float, default=16.0,
                   help="input megabytes per shard (one Ray task each) (default: 16)")
    p.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a local Ray of --workers CPUs)")
    p.add_argument("--endpoint-url",
                   help="S3 endpoint for s3:// inputs and outputs (default: AWS_ENDPOINT_URL, or AWS)")
    p.add_argument("--json", action="store_true", help="end with one JSON line of the figures (default: off)")
    c = verbs.add_parser("check", help="verify every shard's hash of a prepared dataset and summarize it")
    c.add_argument("dataset", help="dataset directory (default: none, required)")
    c.add_argument("--json", action="store_true", help="one JSON line instead of the summary (default: off)")


def cmd_data(args) -> int:
    if args.data_command == "prepare":
        return _prepare(args)
    if args.data_command == "check":
        return _check(args)
    raise ConfigError(f"data {args.data_command!r}; valid: prepare, check")


def _prepare(args) -> int:
    from autohet_ray.orchestrate.data_prepare import prepare_dataset, ray_for_prepare  # lazy: Ray and torch
    if args.shard_mb <= 0:
        raise ConfigError(f"--shard-mb {args.shard_mb} must be > 0")
    with ray_for_prepare(args.address, args.workers):
        figures = prepare_dataset(args.input, args.dataset_out, tokenizer=args.tokenizer,
                                  train_vocab=args.train_tokenizer, val_fraction=args.val_fraction,
                                  workers=args.workers, text_field=args.text_field, eos_token=args.eos_token,
                                  shard_bytes=int(args.shard_mb * (1 << 20)), endpoint_url=args.endpoint_url)
    if args.json:
        print(json.dumps({k: v for k, v in figures.items() if k != "index"}))
    return 0


def _check(args) -> int:
    index = Dataset.open(args.dataset).index
    summary = {"dataset": args.dataset, "fingerprint": index.fingerprint, "shards": len(index.shards),
               "documents": index.num_documents, "tokens": index.num_tokens, "train_tokens": index.train_tokens,
               "validation_tokens": index.validation_tokens, "vocab_size": index.vocab_size, "dtype": index.dtype}
    print(json.dumps(summary) if args.json else
          f"{args.dataset}: {index.num_tokens} tokens ({index.train_tokens} train, {index.validation_tokens} "
          f"validation) in {len(index.shards)} shards, {index.num_documents} documents, vocab {index.vocab_size} "
          f"({index.dtype}); every shard's hash matches; fingerprint {index.fingerprint}")
    return 0
