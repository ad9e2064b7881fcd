#!/usr/bin/env bash
# The fingerprint and overhead benchmarks on a CUDA machine, in under 5 minutes.
#
#   bash benchmarks/gpu.sh     # JSON results under $OUT (or $TMPDIR/sdc-bench-results)
#
# Needs a Python with a CUDA build of torch (and numpy); Triton is used when importable. The
# agent is taken from this checkout (PYTHONPATH), so nothing is installed. Each step has its own
# time limit so a hang cannot eat the machine's time: 380 s in the worst case, ~4 min expected.
set -uo pipefail  # no -e: a failed step is reported, and the next steps still run
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
RESULTS=${OUT:-${TMPDIR:-/tmp}/sdc-bench-results}
mkdir -p "$RESULTS"
export PYTHONPATH="$PWD/agent/src${PYTHONPATH:+:$PYTHONPATH}"
failed=()

$PY - <<'PY' || exit 1
import torch, importlib.util
assert torch.cuda.is_available(), "no CUDA device visible to torch"
print("torch", torch.__version__, "|", torch.cuda.get_device_name(),
      "| triton", "yes" if importlib.util.find_spec("triton") else "no")
PY
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv || true

echo "== 1. every backend against the definition (torch ops, Triton kernel; CPU and GPU)"
timeout 60 $PY benchmarks/fingerprint_check.py --scale 20000000 || failed+=(check)

echo "== 2. fingerprint throughput on the GPU: Triton kernel, then torch ops"
timeout 60 $PY benchmarks/fingerprint.py --devices cuda --sizes 10M,100M --large \
  --reference-max 1G --reps 9 --backend auto --json "$RESULTS/fingerprint_cuda_auto.json" || failed+=(cuda-auto)
timeout 50 $PY benchmarks/fingerprint.py --devices cuda --sizes 10M,100M --large \
  --reference-max 0 --reps 9 --backend torch --json "$RESULTS/fingerprint_cuda_torch.json" || failed+=(cuda-torch)

echo "== 3. fingerprint throughput on this machine's CPU (1 thread and all threads)"
timeout 30 $PY benchmarks/fingerprint.py --devices cpu --sizes 100M --reps 5 \
  --reference-max 0 --threads "1,$(nproc)" --json "$RESULTS/fingerprint_cpu.json" || failed+=(cpu)

echo "== 4. guard overhead over plain DDP (gloo on the CPU: 3 simulated nodes)"
timeout 90 $PY benchmarks/overhead.py --rounds 1 --steps 100 --json "$RESULTS/overhead.json" || failed+=(overhead)

echo "== 5. online sensors on CUDA: fp32-accumulator checks, the Triton checksum kernel against"
echo "   torch ops, detection, overhead per layer with each check backend (torch ops, Triton)"
timeout 90 $PY benchmarks/sensor_gpu.py --backends torch,triton \
  --json "$RESULTS/sensor_gpu.json" || failed+=(sensors)

echo "results in $RESULTS"
if ((${#failed[@]})); then
  echo "FAILED steps: ${failed[*]}"
  exit 1
fi
