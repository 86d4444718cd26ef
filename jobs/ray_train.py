"""Train an autohet plan inside Ray Train's TorchTrainer, checkpointed in autohet's format, recovering from
worker failures with Ray Train's FailureConfig. On this machine, on an emulated 3-node cluster:

    python jobs/ray_train.py --cluster jobs/local-3.yaml --model tiny-gpt --global-batch 4 --steps 6 \
        --checkpoint-every 2 --max-failures 1 --fail-at 3 --emulate --storage /tmp/autohet-ray-train

It plans the job for the cluster file (or takes --plan FILE), starts one Ray Train worker per GPU of the plan on
the node the plan puts it on, and reports every step (step, loss) to Ray Train, with a checkpoint every
--checkpoint-every steps. A failing worker (--fail-at N injects one, once, after step N) makes Ray Train restart
the worker group, up to --max-failures times; the loop then resumes from the newest reported checkpoint. Running
again with the same --name and --storage continues that run, under the plan given this time (e.g. --plan for
the GPUs that are left); --resume-from DIR starts a new run from a checkpoint directory of another run.
Without --emulate it joins the running Ray cluster (RAY_ADDRESS, as under `ray job submit`) and its GPUs.
The data are synthetic batches (one per step, the same on every rank); emulated runs are not paced.
"""
import argparse
import os
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the working dir's package

from autohet_ray import ConfigError  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cluster", required=True, help="cluster file (YAML), e.g. jobs/local-3.yaml")
    p.add_argument("--model", default="tiny-gpt", help="model preset or YAML file")
    p.add_argument("--global-batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=None, help="default: the model's max_seq_len")
    p.add_argument("--micro-batch", type=int, default=None)
    p.add_argument("--plan", default=None, help="plan JSON (default: plan now for the cluster file)")
    p.add_argument("--steps", type=int, default=6, help="train until this step")
    p.add_argument("--checkpoint-every", type=int, default=2, help="report a checkpoint every N steps (0: never)")
    p.add_argument("--max-failures", type=int, default=1, help="worker-group restarts Ray Train may make")
    p.add_argument("--fail-at", type=int, default=None, help="demo: the last plan rank fails once after this step")
    p.add_argument("--storage", required=True, help="RunConfig(storage_path): a shared directory or s3://...")
    p.add_argument("--name", default=None, help="run name; the same name and storage continue that run")
    p.add_argument("--resume-from", default=None, help="checkpoint directory (or URI) of another run to start from")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64", "bfloat16"))
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--emulate", action="store_true", help="start an emulated Ray cluster from the cluster file")
    return p.parse_args(argv)


def make_plan(args, cluster, model, seq_len: int):
    from autohet_ray.plan.schema import load_plan
    if args.plan:
        return load_plan(args.plan)
    from autohet_ray.job.config import TrainJob
    from autohet_ray.planner import plan_training
    from autohet_ray.profile.analytic import analytic_profile, with_micro_batches
    profile = analytic_profile(model, cluster, seq_len, with_micro_batches(args.micro_batch))
    return plan_training(cluster=cluster, model=model, profile=profile, global_batch=args.global_batch,
                         seq_len=seq_len, micro_batch=args.micro_batch,
                         time_limit_s=TrainJob.plan_time_limit_s).plan


def train_loop(config: dict) -> list:
    """One Ray Train worker: its plan rank's Engine, resumed from the newest checkpoint, trained to `steps`."""
    import ray.train
    import torch

    from autohet_ray.model.spec import model_from_dict
    from autohet_ray.data.synthetic import synthetic_batch
    from autohet_ray.orchestrate.train_api import engine_for_worker, report_step, restore_from_train_checkpoint
    from autohet_ray.plan.schema import plan_from_dict
    plan, model = plan_from_dict(config["plan"]), model_from_dict(config["model"])
    engine = engine_for_worker(plan, model, seed=config["seed"], lr=config["lr"], dtype=getattr(torch, config["dtype"]))
    initial = ray.train.Checkpoint(config["resume_from"]) if config["resume_from"] else None
    restored = restore_from_train_checkpoint(engine, initial=initial)
    if engine.rank == 0:
        print(f"[plan rank 0] {'resumed from step ' + str(restored) if restored else 'starting at step 0'}", flush=True)
    log = []
    while engine.step < config["steps"]:
        batch = synthetic_batch(vocab_size=model.vocab_size, global_batch=plan.global_batch, seq_len=plan.seq_len,
                                seed=config["seed"], step=engine.step)
        out = engine.train_step(batch)
        if engine.step == config["fail_at"] and engine.rank == plan.num_devices - 1 \
                and not os.path.exists(config["fail_marker"]):
            open(config["fail_marker"], "w").close()
            raise RuntimeError(f"injected failure of plan rank {engine.rank} after step {engine.step} (--fail-at)")
        saved = report_step(engine, out, checkpoint_every=config["checkpoint_every"])
        if engine.rank == 0:
            print(f"[plan rank 0] step {engine.step} loss {out['loss']:.6f}{' (checkpoint)' if saved else ''}",
                  flush=True)
        log.append((engine.step, out["loss"]))
    return [restored, log]


def run(args, plan, model) -> None:
    from ray.train import FailureConfig, RunConfig
    from ray.train.torch import TorchTrainer

    from autohet_ray.orchestrate.train_api import plan_scaling_config
    from autohet_ray.orchestrate.train_checkpoint import checkpoint_manifest
    local_storage = "://" not in args.storage
    if args.fail_at is not None and not local_storage:
        raise ConfigError(f"--fail-at keeps its marker file in --storage, which must be a directory: {args.storage!r}")
    storage = os.path.abspath(args.storage) if local_storage else args.storage
    config = {"plan": plan.to_dict(), "model": model.to_dict(), "steps": args.steps, "seed": args.seed, "lr": args.lr,
              "dtype": args.dtype, "checkpoint_every": args.checkpoint_every, "resume_from": args.resume_from,
              "fail_at": args.fail_at, "fail_marker": os.path.join(storage, f".failed-once-{uuid.uuid4().hex}")}
    scaling = plan_scaling_config(plan, use_gpu=not args.emulate,
                                  resources_per_worker={"CPU": 1} if args.emulate else None)
    trainer = TorchTrainer(train_loop, train_loop_config=config, scaling_config=scaling,
                           run_config=RunConfig(name=args.name, storage_path=storage,
                                                failure_config=FailureConfig(max_failures=args.max_failures)))
    result = trainer.fit()
    restored, log = result.return_value
    resumed = f" (resumed from step {restored})" if restored else ""
    if log:
        print(f"done: steps {log[0][0]}..{log[-1][0]} in the last attempt{resumed}, final loss {log[-1][1]:.6f}")
    else:
        print(f"done: nothing left to train{resumed}; --steps is {args.steps}")
    if os.path.exists(config["fail_marker"]):
        os.remove(config["fail_marker"])
    print(f"run directory: {result.path}")
    for checkpoint, metrics in result.best_checkpoints or []:
        print(f"  step {metrics['step']:>4}  loss {metrics['loss']:.6f}  {checkpoint.path}")
    if result.checkpoint is not None:
        manifest = checkpoint_manifest(result.checkpoint)
        print(f"newest checkpoint: step {manifest.step}, {len(manifest.records)} chunks, "
              f"{sum(r.nbytes for r in manifest.records)} bytes")


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import ray

    from autohet_ray.cluster.spec import load_cluster
    from autohet_ray.model.spec import load_model
    cluster, model = load_cluster(args.cluster), load_model(args.model)
    plan = make_plan(args, cluster, model, args.seq_len or model.max_seq_len)
    print(f"plan: {plan.num_devices} GPUs; " + "; ".join(
        " -> ".join(f"{s.node}:{s.device_type}x{s.tp}[{s.layers[0]},{s.layers[1]})" for s in p.stages)
        for p in plan.pipelines), flush=True)
    if args.emulate and not os.environ.get("RAY_ADDRESS"):
        from autohet_ray.emulate.cluster import emulated_cluster
        with emulated_cluster(cluster, head_cpus=1, cpus_per_gpu=1):
            run(args, plan, model)
    else:
        ray.init(address=os.environ.get("RAY_ADDRESS", "auto"))
        run(args, plan, model)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ConfigError as err:
        sys.exit(f"error: {err}")
