"""Train an autohet job inside Ray Train's TorchTrainer: planned on the workers Ray Train starts, on prepared data
or synthetic tokens, from Hugging Face weights or a fresh init, checkpointed in autohet's format, recovering
from worker failures with Ray Train's FailureConfig. On this machine, on an emulated 3-node cluster:

    python jobs/ray_train.py --cluster jobs/local-3.yaml --model tiny-gpt --global-batch 4 --steps 6 \
        --checkpoint-every 2 --num-to-keep 2 --max-failures 1 --fail-at 3 --emulate --storage /tmp/autohet-ray-train

It asks Ray Train for one worker per GPU of the cluster file (by GPU type), plans inside the trainer on the
workers it got (or takes --plan FILE when it fits them), and reports every step (loss, tokens/s, MFU per GPU type,
every stage's figures) to Ray Train, with a checkpoint every --checkpoint-every steps and at once when Ray Train
announces the preemption of a node (a drain). Ray Train keeps the newest --num-to-keep checkpoints. A killed
worker (--fail-at N kills the last plan rank's process, once, after step N) makes Ray Train restart the group, up
to --max-failures times; the restart re-plans when the workers changed and resumes from the newest checkpoint,
with the data position it recorded. --data DIR trains on a dataset of `autohet data prepare`; --init-from DIR
starts from Hugging Face weights (with --model hf:DIR); --export OUT writes the final step as a Hugging Face
model. Running again with the same --name and --storage continues that run; --resume-from DIR starts a new run
from a checkpoint directory of another run. Without --emulate it joins the running Ray cluster (RAY_ADDRESS, as
under `ray job submit`) and its GPUs. Emulated runs are not paced.
"""
import argparse
import os
import signal
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the working dir's package

from autohet_ray import ConfigError  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cluster", required=True, help="cluster file (YAML), e.g. jobs/local-3.yaml")
    p.add_argument("--model", default="tiny-gpt", help="model preset, YAML file or hf:DIR")
    p.add_argument("--global-batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=None, help="default: the model's max_seq_len")
    p.add_argument("--micro-batch", type=int, default=None)
    p.add_argument("--plan", default=None, help="plan JSON (default: plan inside the trainer on its workers)")
    p.add_argument("--data", default=None, help="a dataset directory of `autohet data prepare` (default: synthetic)")
    p.add_argument("--init-from", default=None, help="a Hugging Face model directory to start from")
    p.add_argument("--export", default=None, help="write the final step as a Hugging Face model directory here")
    p.add_argument("--steps", type=int, default=6, help="train until this step")
    p.add_argument("--checkpoint-every", type=int, default=2, help="report a checkpoint every N steps (0: never)")
    p.add_argument("--num-to-keep", type=int, default=None, help="checkpoints Ray Train keeps (default: all)")
    p.add_argument("--max-failures", type=int, default=1, help="worker-group restarts Ray Train may make")
    p.add_argument("--min-workers", type=int, default=None,
                   help="let Ray Train start as few as this many workers (elastic; default: one per GPU)")
    p.add_argument("--fail-at", type=int, default=None, help="demo: kill the last plan rank's process once after "
                                                             "this step")
    p.add_argument("--storage", required=True, help="RunConfig(storage_path): a shared directory or s3://...")
    p.add_argument("--name", default=None, help="run name; the same name and storage continue that run")
    p.add_argument("--resume-from", default=None, help="checkpoint directory (or URI) of another run to start from")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64", "bfloat16", "auto"))
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--emulate", action="store_true", help="start an emulated Ray cluster from the cluster file")
    return p.parse_args(argv)


def make_job(args, cluster, model):
    from autohet_ray.job.config import TrainJob
    from autohet_ray.plan.schema import load_plan
    return TrainJob(model=model.to_dict(), cluster=cluster.to_dict(), global_batch=args.global_batch,
                    seq_len=args.seq_len, micro_batch=args.micro_batch, data=args.data, init_from=args.init_from,
                    plan=load_plan(args.plan).to_dict() if args.plan else None, dtype=args.dtype, seed=args.seed,
                    optimizer={"lr": args.lr}, baselines=False)


def train_loop(config: dict) -> list:
    """One Ray Train worker: plan on the group, restore, train to `steps` reporting every step."""
    import ray.train

    from autohet_ray.orchestrate.train_api import TrainReporter, start_worker
    initial = ray.train.Checkpoint(config["resume_from"]) if config["resume_from"] else None
    start = start_worker(config["job"], initial=initial)
    reporter = TrainReporter(start, checkpoint_every=config["checkpoint_every"])
    engine, data = start.engine, start.data
    if engine is None:                   # the plan leaves this worker's GPU out
        reporter.stand_by(config["steps"])
        return [start.restored, []]
    if engine.rank == 0:
        where = f"resumed from step {start.restored}" if start.restored is not None else "starting at step 0"
        print(f"[plan rank 0] {where}; plan ({start.plan_source}): {len(engine.plan.pipelines)} pipelines on "
              f"{engine.plan.num_devices} of {sum(n for _, _, n in start.workers)} workers; data: "
              f"{data.describe()}", flush=True)
    log = []
    while engine.step < config["steps"]:
        out = engine.train_step(data.batch(engine.step))
        if engine.step == config["fail_at"] and engine.rank == engine.plan.num_devices - 1 \
                and not os.path.exists(config["fail_marker"]):
            open(config["fail_marker"], "w").close()
            ray.train.get_all_reported_checkpoints()      # the checkpoints so far are registered
            print(f"[plan rank {engine.rank}] killing this worker after step {engine.step} (--fail-at)", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        saved = reporter.report(out)
        if engine.rank == 0:
            print(f"[plan rank 0] step {engine.step} loss {out['loss']:.6f}{' (checkpoint)' if saved else ''}",
                  flush=True)
        log.append((engine.step, out["loss"]))
    data.close()
    return [start.restored, log]


def run(args, job, cluster, model) -> None:
    from ray.train import CheckpointConfig, FailureConfig, RunConfig
    from ray.train.torch import TorchTrainer

    from autohet_ray.orchestrate.train_api import cluster_scaling_config, plan_scaling_config
    from autohet_ray.orchestrate.train_checkpoint import checkpoint_manifest, export_train_checkpoint
    from autohet_ray.plan.schema import plan_from_dict
    local_storage = "://" not in args.storage
    if args.fail_at is not None and not local_storage:
        raise ConfigError(f"--fail-at keeps its marker file in --storage, which must be a directory: {args.storage!r}")
    storage = os.path.abspath(args.storage) if local_storage else args.storage
    if local_storage:
        os.makedirs(storage, exist_ok=True)
    config = {"job": job.to_dict(), "steps": args.steps, "checkpoint_every": args.checkpoint_every,
              "resume_from": args.resume_from, "fail_at": args.fail_at,
              "fail_marker": os.path.join(storage, f".failed-once-{uuid.uuid4().hex}")}
    # an emulated worker holds a CPU, not a GPU, so only pinning it to its node keeps a node's workers to its GPUs
    resources = {"CPU": 1} if args.emulate else None
    if job.plan is not None and args.min_workers is None:
        scaling = plan_scaling_config(plan_from_dict(job.plan), use_gpu=not args.emulate,
                                      resources_per_worker=resources)
    else:
        scaling = cluster_scaling_config(cluster, use_gpu=not args.emulate, resources_per_worker=resources,
                                         min_workers=args.min_workers, pin_nodes=args.emulate)
    trainer = TorchTrainer(train_loop, train_loop_config=config, scaling_config=scaling,
                           run_config=RunConfig(name=args.name, storage_path=storage,
                                                failure_config=FailureConfig(max_failures=args.max_failures),
                                                checkpoint_config=CheckpointConfig(num_to_keep=args.num_to_keep)))
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
        if args.export:
            report = export_train_checkpoint(result.checkpoint, model, args.export, data=args.data)
            print(f"exported step {report['step']} to {args.export}: {len(report['files'])} safetensors files")


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import ray

    from autohet_ray.cluster.spec import load_cluster
    from autohet_ray.model.spec import load_model
    cluster, model = load_cluster(args.cluster), load_model(args.model)
    job = make_job(args, cluster, model)
    if args.emulate and not os.environ.get("RAY_ADDRESS"):
        from autohet_ray.emulate.cluster import emulated_cluster
        with emulated_cluster(cluster, head_cpus=1, cpus_per_gpu=1):
            run(args, job, cluster, model)
    else:
        ray.init(address=os.environ.get("RAY_ADDRESS", "auto"))
        run(args, job, cluster, model)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ConfigError as err:
        sys.exit(f"error: {err}")
