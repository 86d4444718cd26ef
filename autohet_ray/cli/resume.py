"""`autohet resume --storage DIR|s3://bucket/prefix`: continue a stopped job from its storage.

The storage holds the job (job.json: its id and config) and the profile it was planned with (profile.json).
The job is re-planned on the nodes the Ray cluster has now, with that profile; every rank loads its chunks of
the newest committed step that any tier still holds (the job's node stores first, when they were kept, then
the storage), and training continues to --steps (a total step count). The output names the step actually
restored and every chunk that had to be skipped on the way."""
from __future__ import annotations

import argparse
import json
import os
import sys

from autohet_ray import ConfigError
from autohet_ray.checkpoint import scan_manifests
from autohet_ray.cli.common import run_options
from autohet_ray.cli.options import add_options, overrides
from autohet_ray.cli.progress import run_in_console
from autohet_ray.cli.signals import exit_status, stop_signals
from autohet_ray.cluster.spec import cluster_from_dict
from autohet_ray.config_io import parse_json
from autohet_ray.job.config import TrainJob, job_from_dict
from autohet_ray.job.record import read_job_record
from autohet_ray.profile.db import profile_from_dict
from autohet_ray.storage import job_files
from autohet_ray.storage.lease import storage_lease
from autohet_ray.storage.spec import check_storage, location, storage_spec

# what a job trains (its model, data, batch, rates): a resume keeps them; its other fields a flag may change
KEPT_ON_RESUME = ("model", "cluster", "priced_as", "storage", "plan", "global_batch", "seq_len", "priced_seq_len",
                  "data", "seed", "dtype", "optimizer", "init_from")


def resume_job(storage_url: str, *, endpoint_url: str | None = None, changes: dict | None = None):
    """(TrainJob, job id, profile, newest step in the storage) of the job that wrote `storage_url`, with the
    fields in `changes` changed."""
    from autohet_ray.elastic.tiers import build_tier  # lazy: Ray and torch
    spec = storage_spec(storage_url, endpoint_url=endpoint_url)
    if spec["kind"] == "dir" and not os.path.isdir(spec["path"]):
        raise ConfigError(f"storage {storage_url!r} is not a directory; give the --storage the job wrote to")
    check_storage(spec, create=False)
    job_id, recorded = read_job_record(spec)
    profile = job_files.read_text(spec, job_files.PROFILE_FILE)
    job = job_from_dict(recorded | (changes or {}) | {"storage": spec, "plan": None})   # plan afresh: the nodes
                                                                                        # may have changed
    newest = max(scan_manifests([build_tier(spec)]).steps, default=None)
    where = location(spec, job_files.PROFILE_FILE)
    return job, job_id, profile_from_dict(parse_json(profile, where)) if profile else None, newest


def cmd_resume(args) -> int:
    from autohet_ray.orchestrate.controller import Controller  # lazy: Ray and torch
    from autohet_ray.orchestrate.session import ray_session  # lazy: Ray

    changes = overrides(args, args.job_dests)
    job, job_id, _, _ = resume_job(args.storage, endpoint_url=args.endpoint_url, changes=changes)   # before a lease
    with storage_lease(job.storage, args.storage, job_id=job_id, break_lease=args.break_lease):
        job, job_id, profile, newest = resume_job(args.storage, endpoint_url=args.endpoint_url,
                                                  changes=changes)   # as it is now
        if newest is not None and args.steps is not None and args.steps <= newest:
            raise ConfigError(f"--steps {args.steps} must exceed the committed step {newest} the job resumes from")
        print(f"resume: job {job_id} from {args.storage} (newest step there: {newest})", file=sys.stderr)
        with ray_session(cluster_from_dict(job.cluster), address=args.address, emulate=args.emulate), \
                stop_signals():
            ctl = Controller(job, job_id=job_id, profile=profile)
            target = args.steps if args.steps is not None else (newest or 0) + 1
            out = run_in_console(ctl, target, restore="local_first",
                                 spot_provider=job.spot_provider if job.spot_watch else None)
    restored = out["launch"].get("restored_step")
    print(f"resumed from step {restored}" + (f" (newest in the storage: {newest})" if newest != restored else ""),
          file=sys.stderr)
    out |= {"resumed_from": restored, "skipped_chunks": out["launch"].get("skipped_chunks", []),
            "recoveries": ctl.recovery.recoveries}
    if args.json:
        print(json.dumps(out, default=str))
    return exit_status(out)


def add_resume_parser(sub) -> None:
    r = sub.add_parser("resume", help="continue a stopped job from the newest committed step of any tier",
                       description="The job's fields are those it was started with (its job.json); the flags "
                                   "below change the ones a resume may change.")
    r.add_argument("--storage", required=True, help="the job's storage: a directory or s3://bucket/prefix "
                   "(default: none, required)")
    r.add_argument("--steps", type=int, help="train until this total step count (default: one more step)")
    r.add_argument("--emulate", action=argparse.BooleanOptionalAction, default=False,
                   help="start an emulated cluster from the job's cluster file (default: off)")
    r.add_argument("--json", action="store_true", help="end with one JSON line (default: off)")
    run_options(r)
    r.set_defaults(job_dests=add_options(r, TrainJob, skip=KEPT_ON_RESUME))
