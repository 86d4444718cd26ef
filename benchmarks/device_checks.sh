#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one run (a few minutes on one H200), for a session lent a device:
#   profiling accuracy (profiled vs measured stage time), the cost of splitting the backward for zero-bubble
#   H1, and the checkpoint overhead with every step snapshotted (background copy vs on the training thread).
# Needs only torch, pyyaml and xxhash (no Ray, SCIP or boto3). Each script's output, ending with its JSON line,
# is kept in $OUT (or ./device-out).
#     bash benchmarks/device_checks.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device-out}
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
shape=(--model gpt3-1.3b --micro-batch 4 --seq-len 2048)

$py -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"; print(torch.cuda.get_device_name(0))'
$py benchmarks/gpu_profile_check.py --device-type H200 --layers 8 --num-microbatches 4 "${shape[@]}" \
    2>&1 | tee "$out/gpu_profile_check.txt"
$py benchmarks/wgrad_split_cost.py --layers 4 --dtype bfloat16 "${shape[@]}" 2>&1 | tee "$out/wgrad_split_cost.txt"
# 48 micro-batches (393K tokens a step): about 1 GB of snapshotted state per second of step, heavier than
# 7B-class training on 24 GPUs with 1.5M-token batches (~0.7 GB/s per GPU), so the check is on the safe side
$py benchmarks/snapshot_overhead_device.py --layers 8 --num-microbatches 48 "${shape[@]}" \
    2>&1 | tee "$out/snapshot_overhead_device.txt"
