"""`autohet train`, `autohet resume` and `autohet profile --cluster`: console UI over the one controller.

Without --elastic a job checkpoints every --checkpoint-every steps (and its final step) into --storage
(default: a new `autohet-runs/<time>` directory under the working directory). With
--elastic every step is snapshotted into two nodes' stores as well; between steps the controller acts on spot
notices (`--spot-watch`) and Ray drains, and re-plans onto nodes of the cluster file that (re)joined; a lost
node is recovered from the cheapest copies. Every exit (the end, Ctrl-C, SIGTERM, an error) first gets the
newest committed step into --storage. With `--emulate`, every op is stretched to its emulated device's
predicted time (`--time-scale`, or `--iteration-wall-s`: a predicted iteration lasts that long). The job comes
from a job file (--config) with the flags over its fields (job/file.py); --print-config writes it and exits.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict

import yaml

from autohet_ray import ConfigError
from autohet_ray.cli.checks import check_job_files
from autohet_ray.cli.common import AUTO_ITERATION_WALL_S
from autohet_ray.cli.options import overrides
from autohet_ray.cli.progress import run_in_console
from autohet_ray.cli.signals import exit_status, stop_signals
from autohet_ray.cluster.spec import cluster_from_dict, load_cluster
from autohet_ray.config_io import dataclass_from_dict
from autohet_ray.job import file as job_file
from autohet_ray.job.config import TrainJob
from autohet_ray.job.record import refuse_existing_job
from autohet_ray.model.spec import load_model, model_from_dict
from autohet_ray.runtime.lr_schedule import OptimizerConfig
from autohet_ray.storage.lease import new_job_id, storage_lease
from autohet_ray.storage.spec import check_storage, storage_spec, storage_url


def job_fields(args, *, only=None) -> tuple[dict, dict, str | None, set]:
    """(TrainJob fields, Launch fields, where, the fields from the file): the job file's fields (--config) with
    the flags given over them, unresolved; `only`: just those TrainJob fields (`autohet plan` keeps the ones
    planning reads)."""
    where = f"job file {args.config!r}" if args.config else None
    given, flags = job_file.read_job_file(args.config) if args.config else {}, overrides(args, args.job_dests)
    from_file = job_file.file_names(given) - job_file.file_names(flags)     # the fields the flags leave alone
    fields, launch = job_file.split_launch(job_file.merge(given, flags))
    if only is not None:
        fields = {k: v for k, v in fields.items() if k in only}
    return fields, launch, where, from_file


def build_job(fields: dict, where: str | None, from_file: set) -> TrainJob:
    try:
        return dataclass_from_dict(TrainJob, fields, "train job")
    except ConfigError as exc:
        raise job_file.blamed(exc, where, from_file) from None


def train_job(args):
    """(TrainJob, Launch) of `autohet train`: the job file's fields (--config), the flags given over them, then
    TrainJob's defaults; checked before any cluster starts. The default storage is chosen here (a new directory
    named by the time) unless --print-config only shows the job."""
    fields, launch, where, from_file = job_fields(args)
    launch = job_file.build_launch(launch, where)
    job_file.check_required(fields, where)
    fields = job_file.resolve_all(fields, where=where, from_file=from_file, endpoint_url=args.endpoint_url)
    if launch.emulate and not fields.get("time_scale") and fields.get("iteration_wall_s") is None:
        fields["iteration_wall_s"] = AUTO_ITERATION_WALL_S
    _decay_ends_at_steps(fields, launch.steps)
    args.default_storage = not fields.get("storage") and not fields.get("elastic") and not args.print_config
    if args.default_storage:
        fields["storage"] = _default_storage()
    return build_job(fields, where, from_file), launch


def _decay_ends_at_steps(fields: dict, steps: int) -> None:
    """A decay with no decay_steps ends at the run's last step."""
    optimizer = fields.get("optimizer") or {}
    if isinstance(optimizer, dict) and optimizer.get("decay_steps") is None and optimizer.get("decay", OptimizerConfig.decay) != "constant":
        fields["optimizer"] = optimizer | {"decay_steps": steps}


def _default_storage() -> dict:
    """Every run leaves its model behind: in a new `autohet-runs/<time>` directory of the working directory."""
    if not os.access(os.getcwd(), os.W_OK | os.X_OK):     # the default is made when the job starts
        raise ConfigError(f"the working directory {os.getcwd()!r} is not writable; pass --storage DIR|s3://...")
    path = os.path.abspath(os.path.join("autohet-runs", time.strftime("%Y%m%d-%H%M%S")))
    print(f"storage: {path} (the default; --storage DIR|s3://... chooses)", flush=True)
    return storage_spec(path)


def check_before_start(job, *, default_storage: bool) -> None:
    """What the job reads once it starts, read now: the storage (no other job in it), the files (cli_checks)
    and the --init-from weights against the model."""
    refuse_existing_job(job.storage, storage_url(job.storage))     # before anything is made in the storage
    if not default_storage:
        check_storage(job.storage)
    model = model_from_dict(job.model)
    check_job_files(job, model)
    if job.init_from:                    # the weights must fit the model before any cluster starts
        from autohet_ray.checkpoint.hf_weights import check_hf_dir  # lazy: torch
        check_hf_dir(job.init_from, model)


def print_config(job, launch) -> None:
    """The resolved job as a job file (YAML): Launch's fields, then TrainJob's."""
    doc = json.loads(json.dumps(asdict(launch) | job.to_dict()))        # tuples as lists
    print(yaml.safe_dump(doc, sort_keys=False), end="")


def _starting(cluster) -> None:
    print(f"starting an emulated Ray cluster: {', '.join(f'{n.name} ({n.count}x {n.device})' for n in cluster.nodes)}",
          flush=True)


def cmd_train(args) -> int:
    job, launch = train_job(args)              # bad values fail here, before a cluster starts
    if args.print_config:
        print_config(job, launch)
        return 0
    check_before_start(job, default_storage=args.default_storage)
    from autohet_ray.orchestrate.controller import Controller  # lazy: Ray and torch (not for a config or error)
    from autohet_ray.orchestrate.session import ray_session  # lazy: Ray
    job_id, url = new_job_id(), storage_url(job.storage)
    with storage_lease(job.storage, url, job_id=job_id, break_lease=args.break_lease):
        refuse_existing_job(job.storage, url)     # again under the lease: a train that began meanwhile
        with ray_session(cluster_from_dict(job.cluster), address=args.address, emulate=launch.emulate,
                         on_start=_starting), stop_signals():
            out = run_in_console(Controller(job, job_id=job_id), launch.steps,
                                 spot_provider=job.spot_provider if job.spot_watch else None)
    code = exit_status(out)
    if out["steps"] and code == 0:
        print(f"done: {len(out['steps'])} steps, final loss {out['final_loss']:.4f}; iteration "
              f"{out['measured_iteration_s']:.4f} s measured (steady state) vs {out['predicted_iteration_s']:.4f} s "
              f"predicted{' (emulated)' if out['emulated'] else ''}")
        print(f"model: autohet export --storage {url} --out DIR  (writes the final step as a Hugging Face model)")
    if args.json:
        print(json.dumps(out, default=str))
    return code


def cmd_profile_ray(args) -> int:
    """`autohet profile --cluster FILE --model M --out F [--emulate]`: one profile per GPU type on Ray."""
    from autohet_ray.orchestrate.session import profile_on_ray, ray_session  # lazy: Ray
    cluster, model = load_cluster(args.cluster), load_model(args.model)
    seq_len = args.seq_len or model.max_seq_len
    start = time.perf_counter()
    with ray_session(cluster, address=args.address, emulate=args.emulate, on_start=_starting):
        db = profile_on_ray(cluster, model, seq_len, args.profile_cache)
    db.save(args.out)
    for name, info in db.meta["types"].items():
        print(f"{name}: node {info['node']} ({info['device_name']}), {info['seconds']:.1f} s"
              f"{' (cached)' if info['cached'] else ''}")
    print(f"wrote {args.out}: {len(db.entries)} entries, measured; profiling {db.meta['profile_time_s']:.1f} s, "
          f"total {time.perf_counter() - start:.1f} s", file=sys.stdout)
    return 0


def _collectives_cell(layers: dict) -> str:
    layer = layers["layer"]
    if layer.tp_comm_fwd_s is None:
        return ""
    return f"; a layer's TP collectives add {layer.tp_comm_fwd_s * 1e3:.3f}/{layer.tp_comm_bwd_s * 1e3:.3f} ms"


def _check_ranks(ranks: int | None) -> None:
    import torch  # lazy: torch

    from autohet_ray.runtime.in_situ_cost import devices_on_host  # lazy: torch
    if ranks is None:
        return
    cuda = torch.cuda.is_available()
    have, what = devices_on_host(torch.device("cuda" if cuda else "cpu")), "GPUs" if cuda else "CPU cores"
    if not 1 <= ranks <= have:
        raise ConfigError(f"--ranks={ranks} must lie in [1, {have}]: this host has {have} {what}, one per rank")


def cmd_profile_local(args) -> int:
    """`autohet profile --local --model M --out FILE [--tp 1,2] [--micro-batch 1,2] [--device-type NAME]
    [--ranks N]`: the layers' memory (profile/measure.py), their compute and TP collectives timed in situ on a
    group of ranks where this host can run one (runtime/in_situ_cost.py), and the update's rate
    (runtime/update_rate.py) on this device."""
    from autohet_ray.profile.measure import measure_profile, parse_ints  # lazy: torch
    from autohet_ray.runtime.in_situ_cost import add_in_situ_costs  # lazy: torch
    from autohet_ray.runtime.update_rate import update_s_per_param  # lazy: torch
    spec = load_model(args.model)
    seq_len = args.seq_len or spec.max_seq_len
    _check_ranks(args.ranks)
    start = time.perf_counter()
    db = measure_profile(spec, args.device_type, parse_ints(args.tp, "--tp"),
                         parse_ints(args.micro_batch, "--micro-batch"), seq_len)
    add_in_situ_costs(db, spec, ranks=args.ranks)
    if args.device_type not in db.optimizer_s_per_param:        # no group ran: time it on this rank alone
        db.optimizer_s_per_param[args.device_type] = update_s_per_param(spec)
    db.meta["profile_time_s"] = time.perf_counter() - start
    db.save(args.out)
    for (dev, tp, mb), layers in sorted(db.entries.items()):
        cells = "  ".join(f"{k} {v.fwd_s * 1e3:.3f}/{v.bwd_s * 1e3:.3f} ms" for k, v in layers.items())
        print(f"{dev} tp={tp} mb={mb}: {cells}  (fwd/bwd, measured){_collectives_cell(layers)}")
    for tp, how in db.meta.get("compute", {}).items():
        print(f"tp={tp} compute: {how}")
    for tp, how in db.meta.get("tp_collectives", {}).items():
        print(f"tp={tp} collectives: {how}")
    print(f"{args.device_type} update (norm, clip, AdamW): "
          f"{db.optimizer_s_per_param[args.device_type] * 1e9:.2f} ns/parameter (measured"
          f"{', ' + db.meta['update'] if 'update' in db.meta else ''})")
    print(f"wrote {args.out} ({len(db.entries)} entries, {db.meta['profile_time_s']:.1f} s)")
    return 0

