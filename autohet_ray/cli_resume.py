"""`autohet resume --storage DIR|s3://bucket/prefix`: restart a stopped elastic job from its storage.

The newest committed step's manifest carries the job (model, cluster file, batch, storage, seed); the job is
re-planned on the nodes the Ray cluster has now (reusing the analytic profile), every rank loads its chunks
from the storage, and training continues to --steps (a total step count)."""
from __future__ import annotations

import json
import os
import sys
import time

from autohet_ray import ConfigError


def resume_job(storage_url: str, *, endpoint_url: str | None = None) -> tuple[dict, int]:
    """The job (ElasticJob fields) and newest committed step found in `storage_url`."""
    from autohet_ray.checkpoint import find_manifest, scan_manifests
    from autohet_ray.orchestrate.elastic_tiers import build_tier, check_storage, storage_spec
    spec = storage_spec(storage_url, endpoint_url=endpoint_url)
    if spec["kind"] == "dir" and not os.path.isdir(spec["path"]):
        raise ConfigError(f"storage {storage_url!r} is not a directory; give the --storage the job wrote to")
    check_storage(spec, create=False)
    tier = build_tier(spec)
    scan = scan_manifests([tier])
    if not scan.steps:
        rejected = f"; rejected: {scan.rejected[:3]}" if scan.rejected else ""
        raise ConfigError(f"storage {storage_url!r} holds no committed step to resume from{rejected}")
    step = max(scan.steps)
    job = dict(find_manifest([tier], step).extra.get("job") or {})
    if not job:
        raise ConfigError(f"step {step} in {storage_url!r} has no job description (not written by an elastic job)")
    job |= {"storage": spec, "plan": None}            # the nodes may have changed: plan afresh
    return job, step


def cmd_resume(args) -> int:
    from autohet_ray.cluster.spec import cluster_from_dict
    from autohet_ray.orchestrate.elastic_config import elastic_job_from_dict
    from autohet_ray.orchestrate.recovery import ElasticController
    from autohet_ray.orchestrate.session import ray_session

    raw, step = resume_job(args.storage, endpoint_url=args.endpoint_url)
    if args.steps is not None and args.steps <= step:
        raise ConfigError(f"--steps {args.steps} must exceed the committed step {step} the job resumes from")
    job = elastic_job_from_dict(raw)
    print(f"resume: {args.storage} step {step}", file=sys.stderr)
    with ray_session(cluster_from_dict(job.cluster), address=args.address, emulate=args.emulate):
        ctl = ElasticController(job)
        try:
            start = time.perf_counter()
            launch = ctl.start(restore="cloud_only")
            launch["start_s"] = time.perf_counter() - start
            print(f"restored step {launch['restored_step']} on {launch['plan']} "
                  f"({launch['bytes_by_tier']} bytes, {launch['start_s']:.1f} s)", file=sys.stderr)
            target = args.steps if args.steps is not None else step + 1
            while ctl.step_index < target:
                metrics = ctl.step()
                print(f"step {metrics['step']}: loss {metrics['loss']:.4f}", file=sys.stderr)
            ctl.flush()
        finally:
            ctl.close()
    out = {"resumed_from": step, "steps": [{"step": m["step"], "loss": m["loss"]} for m in ctl.history],
           "launch": launch, "recoveries": ctl.recoveries}
    if args.json:
        print(json.dumps(out, default=str))
    return 0


def add_resume_parser(sub) -> None:
    r = sub.add_parser("resume", help="restart a stopped elastic job from its storage's newest committed step")
    r.add_argument("--storage", required=True, help="the job's storage: a directory or s3://bucket/prefix")
    r.add_argument("--endpoint-url", help="S3 endpoint (default: AWS, or AWS_ENDPOINT_URL)")
    r.add_argument("--steps", type=int, help="train until this total step count (default: one more step)")
    r.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS or a running local cluster)")
    r.add_argument("--emulate", action="store_true", help="start an emulated cluster from the job's cluster file")
    r.add_argument("--json", action="store_true", help="end with one JSON line")
