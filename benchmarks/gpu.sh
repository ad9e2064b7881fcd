#!/usr/bin/env bash
# The fingerprint and overhead benchmarks on a CUDA machine, in under 5 minutes.
#
#   bash benchmarks/gpu.sh            # results under ${OUT:-benchmarks/results}
#
# Needs a Python with a CUDA build of torch (and numpy); Triton is used when importable. The
# agent is taken from this checkout (PYTHONPATH), so nothing is installed. Each step has its own
# time limit so a hang cannot eat the machine's time; the budget is about 4 minutes in all.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
RESULTS=${OUT:-benchmarks/results}
mkdir -p "$RESULTS"
export PYTHONPATH="$PWD/agent/src${PYTHONPATH:+:$PYTHONPATH}"

$PY - <<'PY'
import torch, importlib.util
assert torch.cuda.is_available(), "no CUDA device visible to torch"
print("torch", torch.__version__, "|", torch.cuda.get_device_name(),
      "| triton", "yes" if importlib.util.find_spec("triton") else "no")
PY
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv || true

echo "== 1. every backend against the definition (torch ops, Triton kernel; CPU and GPU)"
timeout 90 $PY benchmarks/fingerprint_check.py --scale 20000000

echo "== 2. fingerprint throughput on the GPU: Triton kernel, then torch ops"
timeout 75 $PY benchmarks/fingerprint.py --devices cuda --sizes 10M,100M --large \
  --reference-max 1G --reps 9 --backend auto --json "$RESULTS/fingerprint_cuda_auto.json"
timeout 75 $PY benchmarks/fingerprint.py --devices cuda --sizes 10M,100M --large \
  --reference-max 0 --reps 9 --backend torch --json "$RESULTS/fingerprint_cuda_torch.json"

echo "== 3. fingerprint throughput on this machine's CPU (1 thread and all threads)"
timeout 45 $PY benchmarks/fingerprint.py --devices cpu --sizes 100M --reps 5 \
  --reference-max 0 --threads "1,$(nproc)" --json "$RESULTS/fingerprint_cpu.json"

echo "== 4. guard overhead over plain DDP (gloo on the CPU: 3 simulated nodes)"
timeout 100 $PY benchmarks/overhead.py --rounds 2 --steps 100 --json "$RESULTS/overhead.json"

echo "results in $RESULTS"
