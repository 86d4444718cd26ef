"""Every benchmark case, in one list: `python -m benchmarks list` prints it, `python -m benchmarks run NAME` runs one.
Each case's own docstring says how it measures; docs/benchmarks.md gives the figures and the files that hold them."""
from __future__ import annotations

from benchmarks.harness import Case

CASES = (
    # planner (predicted: the cost model with the analytic profile)
    Case(name="planner", module="planner_bench",
         measures="planner tables: optimality vs exhaustive, whole `autohet plan` wall time vs GPUs, gains over the "
                  "baselines, money scaling, sweep (predicted)",
         inputs="[--quick] [--only optimality|scaling|money|gains|sweep|deep]",
         result_fields=("optimality", "whole_command_wall_s", "solve_time_s")),
    Case(name="optimality", module="optimality", parts=("plans", "money", "sharding"),
         measures="planner / exhaustive optimum - 1 on tiny instances: samples/s, money goals, sharded state "
                  "(predicted)",
         inputs="[--part plans|money|sharding] [--quick]; plans: [--quick]; money: [--goal G] [--shapes] "
                "[--only I,J]; sharding: [--rows I,J]",
         result_fields=("parts", "max_gap"), quick=("--quick",)),
    Case(name="budget-bar", module="budget_bar",
         measures="samples/s within 60% of the fleet's $/hour against the throughput-optimal plan (predicted)",
         inputs="[--top N]", result_fields=("budget_usd_per_hour", "settings", "subsets", "mixed_micro_batch")),
    Case(name="sharding-gains", module="sharding_gains",
         measures="predicted samples/s with optimizer sharding none vs auto on issue 33's fleets (predicted)",
         inputs="[--time-limit S] [--global-batch N] [--seq-len S] [--rows I,J]", result_fields=("rows",)),
    Case(name="sharding-ceiling", module="sharding_ceiling",
         measures="two ceilings of what sharded optimizer state could gain, in the cost model's terms (predicted)",
         inputs="[--time-limit S] [--global-batch N] [--seq-len S] [--rows I,J] [--no-auto] [--activation-scale X]",
         result_fields=("rows",)),
    # cost model and runtime on this CPU (unpaced)
    Case(name="cost-model-accuracy", module="cost_model_accuracy",
         measures="measured vs predicted step time of PP2, uneven PP2, TP2, DP2 runs, unpaced on this CPU, each "
                  "priced with its paired in-situ profile",
         inputs="[--steps N] [--passes N] [--cores N] [--nice N] [--plans P,Q] [--workdir DIR]",
         result_fields=("max_abs_error", "plans", "load_average")),
    Case(name="sharding-activation-check", module="sharding_activation_check",
         measures="the cost model's activation bytes per token against autograd's saved tensors of the runtime's "
                  "own blocks", inputs="(none)", result_fields=("rows",), quick=()),
    Case(name="runtime", module="runtime_bench",
         measures="1F1B step time over the ideal from measured stage compute (PP2, PP4), TP2 over TP1 (gloo, CPU)",
         inputs="[--steps N] [--microbatches N]",
         result_fields=("pp2_step_over_ideal_1f1b", "pp4_step_over_ideal_1f1b", "tp2_over_tp1_step_time"),
         quick=("--steps", "1")),
    Case(name="shard-gather-overlap", module="shard_gather_overlap",
         measures="what the sharded path's all-gather costs a step, overlapped or not (gloo, CPU)",
         inputs="[--steps N] [--microbatches N]", result_fields=("steps", "microbatches"),
         quick=("--steps", "2")),
    Case(name="wgrad-split-cost", module="wgrad_split_cost",
         measures="the split backward (B + deferred W) over the plain backward, and the W share (CPU or one GPU)",
         inputs="[--model M] [--layers N] [--seq-len S] [--micro-batch N] [--dtype D] [--repeats N]",
         result_fields=("split_over_plain_backward", "measured_wgrad_share", "cost_model_wgrad_share"),
         quick=("--repeats", "2")),
    # checkpoints and storage
    Case(name="snapshot-cost", module="snapshot_cost",
         measures="CPU cost of one node-store snapshot, by phase, in one process",
         inputs="[--tensors N] [--steps S]", result_fields=("cpu_s", "cpu_s_per_100_mib"), quick=("--steps", "3")),
    Case(name="durable", module="durable_bench",
         measures="the cost of durable writes: metrics lines per step and an fsync per checkpoint chunk",
         inputs="[--steps N] [--line-bytes B] [--chunks N] [--chunk-mib M] [--reps N]", result_fields=(),
         quick=("--steps", "20", "--chunks", "8", "--reps", "1")),
    Case(name="data-prepare", module="data_prepare_bench",
         measures="`data prepare` speed on 1 vs 2 Ray workers beside the tokenizers library's own rate",
         inputs="[--mb N] [--shard-mb N] [--vocab N] [--rounds N]",
         result_fields=("mb_per_s", "speedup_2_vs_1", "one_worker_vs_library", "pass")),
    # recovery and spot (emulated on Ray, or simulated with the cost model)
    Case(name="recovery", module="recovery_bench",
         measures="whole-recovery ratio, cloud-only reload over local-first, per cloud bandwidth, and the checkpoint "
                  "overhead (emulated 3-node cluster, moto S3)",
         inputs="[--hidden 256|512] [--layers N --vocab N] [--cloud-mib-s R,R] [--overhead-only] [--emulate-wall-s S] "
                "[--reassemble FILE] ...",
         result_fields=("speedup_total", "pairs", "overhead", "goals")),
    Case(name="restart-scaling", module="restart_scaling",
         measures="a relaunch's phases (process groups every-rank vs members-only, engine build, state load, first "
                  "step) at 8, 16, 32, ... ranks, fitted and extrapolated to 1024 (gloo, CPU)",
         inputs="[--ranks 8,16,32,48] [--json-out FILE]", result_fields=("fits", "restart_at_1024_s"),
         quick=("--ranks", "8")),
    Case(name="spot-replay", module="spot_replay",
         measures="goodput and USD per million tokens of ours vs checkpoint-restart over AWS spot traces on 1024 GPUs "
                  "(simulated: cost-model predictions)",
         inputs="[--quick] [--plans-in FILE] [--notice-s S] [--emulate ...] ... (see --help)",
         result_fields=("goodput", "checkpoint_restart_goodput", "ours_over_checkpoint_restart", "systems"),
         quick=("--plans-in", "benchmarks/measured/spot_replay_plans_2026-12-05.json")),
    Case(name="spot-replay-emulated", module="spot_replay_emulated",
         measures="an elastic job on an emulated cluster whose nodes come and go as the spot traces say (emulated)",
         inputs="[--events N] [--compression X] [--notice-s S] ... (see --help)",
         result_fields=("checks", "wall_s")),
    Case(name="spot-replay-join-cost", module="spot_replay_join_cost",
         measures="what a node joining stops the job for, with and without plan-ahead (emulated)",
         inputs="[--joins N] [--iteration-wall-s S]", result_fields=("medians", "joins")),
    Case(name="spot-replay-switch-cost", module="spot_replay_switch_cost",
         measures="what a prepared switch (notice or join) stops the job for (emulated)",
         inputs="[--runs N] [--iteration-wall-s S]", result_fields=("medians", "runs")),
    # end to end and convergence (emulated)
    Case(name="e2e", module="e2e_bench",
         measures="measured vs predicted iteration and speedup of the planner's plan and Megatron-LM on the paper-24 "
                  "mix (emulated: checks the schedule, not the cost model)",
         inputs="[--models M,N] [--plans autohet,megatron] [--steps N] ... (see --help)",
         result_fields=("models", "bars", "load_average")),
    Case(name="convergence", module="convergence_bench",
         measures="an asymmetric plan's loss curve against a one-GPU plan's on real text (emulated, unpaced)",
         inputs="[--steps N] [--eval-every N] [--lr X] [--dtype D] ... (see --help)",
         result_fields=("final_val_loss", "final_val_loss_one_gpu", "reached_target_at_step", "curves_agree")),
    # on the heterogeneous testbed (root: CPU shares, shaped links, one raylet per namespace; nothing paced)
    Case(name="testbed", module="testbed_bench",
         measures="autohet vs Megatron-LM (all, best subset) and Whale, measured vs predicted samples/s, heterogeneous "
                  "efficiency, a vanished node's recovery at 3 storage rates (testbed)",
         inputs="[--testbed FILE] [--homogeneous FILE] [--repeats N] [--steps N] [--storage-mbit R,S,T] [--skip P]",
         result_fields=("measured", "predicted", "speedup_measured", "speedup_predicted", "max_abs_error",
                        "heterogeneous_efficiency", "recovery", "testbed", "load_average")),
    # on one real GPU (a CPU dry run without one)
    Case(name="gpu-profile-check", module="gpu_profile_check",
         measures="profiled vs measured one-stage forward+backward time (one GPU; CPU dry run without)",
         inputs="[--device-type T] [--model M] [--layers N] [--micro-batch N] [--num-microbatches N] [--seq-len S]",
         result_fields=("predicted_stage_s", "measured_stage_s", "measured_over_predicted"), quick=()),
    Case(name="snapshot-overhead-device", module="snapshot_overhead_device",
         measures="step time with every step snapshotted vs none, copy in the background or not (one GPU; CPU dry "
                  "run without)", inputs="[--model M] [--layers N] [--blocks N] [--steps-per-block N] ...",
         result_fields=("state_bytes_per_step", "step_s", "goal_overhead"), quick=()),
    Case(name="cuda-paths-check", module="cuda_paths_check",
         measures="bf16 on CUDA with a one-rank NCCL group against fp32 on the CPU, step by step (one GPU)",
         inputs="[--steps N] [--backend B]", result_fields=("max_rel_loss_gap", "final_rel_loss_gap")),
)

BY_NAME = {case.name: case for case in CASES}
# modules under benchmarks/ that are no case: what cases share
HELPERS = ("harness", "cases", "recovery_curve", "spot_replay_plot", "spot_replay_snapshot")


def find(name: str) -> tuple[Case, str | None]:
    """(the case, the part or None) that NAME or NAME:PART names; KeyError naming the valid ones."""
    base, _, part = name.partition(":")
    case = BY_NAME.get(base)
    if case is None or (part and part not in case.parts):
        valid = [c.name for c in CASES] + [f"{c.name}:{p}" for c in CASES for p in c.parts]
        raise KeyError(f"no benchmark case {name!r}; valid: {', '.join(valid)}")
    return case, part or None
