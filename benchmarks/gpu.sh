#!/usr/bin/env bash
# What the first GPU must show, on one CUDA machine (one H200: <= 8 minutes in the worst case).
#
#   bash benchmarks/gpu.sh             # results: benchmarks/results/gpu-*.json (or $RESULTS)
#   bash benchmarks/gpu.sh --dry-run   # every step's CPU fallback (gloo, CPU, no CUDA events),
#                                      # results under $TMPDIR/sdc-gpu-dry-run (or $RESULTS)
#
# The steps (their Python is benchmarks/gpu_checks.py, and the kernel benchmarks):
#   1. versions and capabilities: torch, CUDA, NCCL, Triton, whether mm(out_dtype) exists
#   2. the CUDA-parametrised unit tests (their CPU cases on a dry run)
#   3. a guarded Llama slice on a 1-rank NCCL group (DDP), then a 1-rank FSDP2 mesh: CUDA-event
#      step times, allocator peak, the host syncs torch.cuda.set_sync_debug_mode("warn") reports
#   4. two processes replay one micro-batch: bit for bit with CUBLAS_WORKSPACE_CONFIG and
#      deterministic kernels, and a negative control without
#   5. three gloo processes name an injected GEMM output fault, a NaN and a weight flip
#   6. the kernels at real shapes: every fingerprint backend against the definition and the
#      fingerprint's throughput, the sensors' checksum kernels and their overhead per layer
#   7. graph breaks of a protected decoder layer under torch._dynamo.explain
# Needs a Python with a CUDA build of torch (>= 2.8), numpy, transformers and pytest; Triton
# when importable. The agent is taken from this checkout (PYTHONPATH): nothing is installed.
# Each step has its own time limit (their sum is 480 s), so a hang cannot eat the machine.
set -uo pipefail  # no -e: a failed step is reported, and the next steps still run
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DRY=()
SCALE=1
if [[ "${1:-}" == "--dry-run" ]]; then
  DRY=(--dry-run)
  SCALE=4  # a CPU (shared, here) is slower than the GPU the limits are sized for
  RESULTS=${RESULTS:-${TMPDIR:-/tmp}/sdc-gpu-dry-run}
  echo "== dry run: each CUDA step runs its CPU fallback (gloo, CPU tensors, wall-clock time)"
elif [[ $# -gt 0 ]]; then
  echo "usage: bash benchmarks/gpu.sh [--dry-run]" >&2
  exit 2
fi
RESULTS=${RESULTS:-benchmarks/results}
mkdir -p "$RESULTS"
export PYTHONPATH="$PWD/agent/src:$PWD/agent/contract/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} HF_HUB_OFFLINE=1
failed=()
step() {  # step NAME SECONDS COMMAND...: run it under its limit, note a failure
  local name=$1 limit=$(($2 * SCALE))
  shift 2
  timeout "$limit" "$@" || failed+=("$name")
}
CHECKS=(benchmarks/gpu_checks.py)

echo "== 1. versions and capabilities"
step versions 30 $PY "${CHECKS[@]}" versions "${DRY[@]}" --json "$RESULTS/gpu-versions.json"
((${#DRY[@]})) || nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv || true

echo "== 2. the CUDA-parametrised unit tests"
if ((${#DRY[@]})); then
  step unit 60 $PY -m pytest -q -x -p no:cacheprovider tests/unit/test_finite_check.py
else
  step unit 60 $PY -m pytest -q -x -p no:cacheprovider tests/unit/test_finite_check.py \
    tests/unit/test_fingerprint.py tests/unit/test_sensor_triton.py
fi

echo "== 3. a guarded Llama slice on one rank: DDP on NCCL, then a 1-rank FSDP2 mesh"
step llama-ddp 55 $PY "${CHECKS[@]}" llama --layout ddp "${DRY[@]}" --json "$RESULTS/gpu-llama-ddp.json"
step llama-fsdp 55 $PY "${CHECKS[@]}" llama --layout fsdp "${DRY[@]}" --json "$RESULTS/gpu-llama-fsdp.json"

echo "== 4. two processes replay one micro-batch (CUBLAS_WORKSPACE_CONFIG; negative control)"
step replay 45 $PY "${CHECKS[@]}" replay "${DRY[@]}" --json "$RESULTS/gpu-replay.json"

echo "== 5. three gloo processes name a GEMM output fault, a NaN and a weight flip"
step drills 90 $PY "${CHECKS[@]}" drills "${DRY[@]}" --timeout $((40 * SCALE)) --json "$RESULTS/gpu-drills.json"

echo "== 6. the kernels at real shapes"
if ((${#DRY[@]})); then
  step kernels-fingerprint 30 $PY benchmarks/fingerprint_check.py --scale 100000
  step kernels-throughput 30 $PY benchmarks/fingerprint.py --devices cpu --sizes 1M --reps 1 \
    --reference-max 0 --json "$RESULTS/fingerprint-gpu.json"
  step kernels-sensors 60 $PY benchmarks/sensor_gpu.py --device cpu --k 128 --n 128 --rows 256 \
    --trials 3 --iters 2 --backends torch --json "$RESULTS/sensor-gpu.json"
else
  step kernels-fingerprint 30 $PY benchmarks/fingerprint_check.py --scale 20000000
  step kernels-throughput 30 $PY benchmarks/fingerprint.py --devices cuda --sizes 10M,100M \
    --reference-max 0 --reps 5 --backend auto --json "$RESULTS/fingerprint-gpu.json"
  step kernels-sensors 60 $PY benchmarks/sensor_gpu.py --backends torch,triton \
    --json "$RESULTS/sensor-gpu.json"
fi

echo "== 7. graph breaks of a protected decoder layer (torch._dynamo.explain)"
step explain 25 $PY "${CHECKS[@]}" explain "${DRY[@]}" --json "$RESULTS/gpu-explain.json"

echo "results in $RESULTS"
if ((${#failed[@]})); then
  echo "FAILED steps: ${failed[*]}"
  exit 1
fi
