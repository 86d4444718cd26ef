"""`autohet train`, `autohet resume` and `autohet profile --cluster`: console UI over the one controller.

Without --elastic a job checkpoints every --checkpoint-every steps (and its final step) into --storage
(default: a new `autohet-runs/<time>` directory under the working directory). With
--elastic every step is snapshotted into two nodes' stores as well; between steps the controller acts on spot
notices (`--spot-watch`) and Ray drains, and re-plans onto nodes of the cluster file that (re)joined; a lost
node is recovered from the cheapest copies. Every exit (the end, Ctrl-C, SIGTERM, an error) first gets the
newest committed step into --storage. With `--emulate`, every op is stretched to its emulated device's
predicted time (`--time-scale`; auto: a predicted iteration lasts --iteration-wall-s).
"""
from __future__ import annotations

import json
import os
import sys
import time

from autohet_ray import ConfigError
from autohet_ray.cli_progress import run_in_console
from autohet_ray.cli_signals import exit_status, stop_signals
from autohet_ray.cli_checks import check_train_files
from autohet_ray.cluster.spec import load_cluster
from autohet_ray.model.spec import load_model
from autohet_ray.plan.schema import load_plan


def job_fields(args) -> dict:
    """TrainJob fields from the `autohet train` arguments (checked before any cluster starts)."""
    from autohet_ray.cloud.notices import check_provider
    from autohet_ray.storage.job_record import refuse_existing_job
    from autohet_ray.storage.spec import check_storage, storage_spec
    if args.spot_watch:
        check_provider(args.spot_provider)
    if args.elastic and not args.storage:
        raise ConfigError("--elastic needs --storage DIR|s3://bucket/prefix (the durable tier and resume point)")
    default_storage = not args.storage    # every run leaves its model behind, in a directory it names
    if default_storage:
        args.storage = os.path.abspath(os.path.join("autohet-runs", time.strftime("%Y%m%d-%H%M%S")))
        print(f"storage: {args.storage} (the default; --storage DIR|s3://... chooses)", flush=True)
    storage = storage_spec(args.storage, endpoint_url=args.endpoint_url)
    refuse_existing_job(storage, args.storage)     # before anything is made in the storage
    if not default_storage:
        check_storage(storage)
    elif not os.access(os.getcwd(), os.W_OK | os.X_OK):   # the default is made when the job starts
        raise ConfigError(f"the working directory {os.getcwd()!r} is not writable; pass --storage DIR|s3://...")
    clock = {}
    if args.emulate:
        if args.time_scale == "auto":
            clock = {"iteration_wall_s": args.iteration_wall_s}
        else:
            try:
                clock = {"time_scale": float(args.time_scale)}
            except ValueError:
                raise ConfigError(f"--time-scale={args.time_scale!r} must be a positive number or 'auto'") from None
            if clock["time_scale"] <= 0:
                raise ConfigError(f"--time-scale={args.time_scale!r} must be a positive number or 'auto'")
    cluster, model = load_cluster(args.cluster), load_model(args.model)
    check_train_files(args, cluster, model)
    if args.init_from:                    # the weights must fit the model before any cluster starts
        from autohet_ray.checkpoint.hf_weights import check_hf_dir
        check_hf_dir(args.init_from, model)
    return {"model": model.to_dict(), "optimizer": optimizer_fields(args), "cluster": cluster.to_dict(),
            "init_from": os.path.abspath(args.init_from) if args.init_from else None,
            "global_batch": args.global_batch, "tensorboard": _tensorboard_dir(args),
            "storage": storage, "data": args.data, "eval_every": args.eval_every,
            "eval_batches": args.eval_batches, "elastic": args.elastic, "checkpoint_every": args.checkpoint_every,
            "seq_len": args.seq_len, "micro_batch": args.micro_batch, "schedule": args.schedule,
            "recompute": args.recompute, "optimizer_sharding": args.optimizer_sharding,
            "plan": load_plan(args.plan).to_dict() if args.plan else None, "profile": args.profile,
            "profile_cache": args.profile_cache, "seed": args.seed, "dtype": args.dtype, "plan_time_limit_s": args.plan_time_limit,
            "setup_timeout_s": args.placement_timeout, "loss_grace_s": args.loss_grace_s,
            "max_recoveries": args.max_recoveries, "recovery_window_steps": args.recovery_window,
            "dataset_cache_gb": args.dataset_cache_gb, **clock}


def _tensorboard_dir(args) -> str | None:
    """--tensorboard as an absolute directory, checked before any cluster starts."""
    if not args.tensorboard:
        return None
    from autohet_ray.metrics.tensorboard import check_available
    check_available(args.tensorboard)
    return os.path.abspath(args.tensorboard)


def optimizer_fields(args) -> dict:
    """OptimizerConfig fields from the `autohet train` arguments; a decay ends at --steps unless
    --decay-steps says otherwise."""
    decay_steps = args.decay_steps
    if decay_steps is None and args.decay != "constant":
        decay_steps = args.steps
    return {"lr": args.lr, "min_lr": args.min_lr, "warmup_steps": args.warmup_steps, "decay": args.decay,
            "decay_steps": decay_steps, "weight_decay": args.weight_decay, "clip_grad": args.clip_grad,
            "betas": (args.adam_beta1, args.adam_beta2)}


def _starting(cluster) -> None:
    print(f"starting an emulated Ray cluster: {', '.join(f'{n.name} ({n.count}x {n.device})' for n in cluster.nodes)}",
          flush=True)


def cmd_train(args) -> int:
    from autohet_ray.orchestrate.controller import Controller
    from autohet_ray.job.config import job_from_dict
    from autohet_ray.orchestrate.session import ray_session
    from autohet_ray.storage.job_record import refuse_existing_job
    from autohet_ray.storage.lease import new_job_id, storage_lease
    job = job_from_dict(job_fields(args))          # bad values fail here, before a cluster starts
    job_id = new_job_id()
    with storage_lease(job.storage, args.storage, job_id=job_id, break_lease=args.break_lease):
        refuse_existing_job(job.storage, args.storage)     # again under the lease: a train that began meanwhile
        with ray_session(load_cluster(args.cluster), address=args.address, emulate=args.emulate,
                         on_start=_starting), stop_signals():
            out = run_in_console(Controller(job, job_id=job_id), args.steps,
                                 spot_provider=args.spot_provider if args.spot_watch else None)
    code = exit_status(out)
    if out["steps"] and code == 0:
        print(f"done: {len(out['steps'])} steps, final loss {out['final_loss']:.4f}; iteration "
              f"{out['measured_iteration_s']:.4f} s measured (steady state) vs {out['predicted_iteration_s']:.4f} s "
              f"predicted{' (emulated)' if out['emulated'] else ''}")
        print(f"model: autohet export --storage {args.storage} --out DIR  (writes the final step as a Hugging Face "
              f"model)")
    if args.json:
        print(json.dumps(out, default=str))
    return code


def cmd_profile_ray(args) -> int:
    """`autohet profile --cluster FILE --model M --out F [--emulate]`: one profile per GPU type on Ray."""
    from autohet_ray.orchestrate.session import profile_on_ray, ray_session
    cluster, model = load_cluster(args.cluster), load_model(args.model)
    seq_len = args.seq_len or model.max_seq_len
    start = time.perf_counter()
    with ray_session(cluster, address=args.address, emulate=args.emulate, on_start=_starting):
        db = profile_on_ray(cluster, model, seq_len, args.cache)
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
    import torch

    from autohet_ray.runtime.in_situ_cost import devices_on_host
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
    from autohet_ray.profile.measure import measure_profile, parse_ints
    from autohet_ray.runtime.in_situ_cost import add_in_situ_costs
    from autohet_ray.runtime.update_rate import update_s_per_param
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

