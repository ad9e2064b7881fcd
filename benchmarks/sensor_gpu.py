"""The online sensors on a GPU: correctness of the CUDA path and its overhead, in one run.

For a protected linear layer under bf16 autocast on CUDA (the 16-bit GEMMs output their fp32
accumulator through ``torch.mm(..., out_dtype=torch.float32)``), this script checks, then times:

1. numerics: the protected layer against ``nn.Linear`` under the same autocast (output and
   gradients agree to bf16 rounding) and against itself (a second run is bit-identical, as the
   replays need);
2. healthy batches raise no flag after the warm-up; x1.1 on one element of each GEMM's fp32
   result, and bit flips 20..30, are caught (rates printed);
3. the fused Triton checksum kernel (``sdc_agent.sensors.maths._triton_checksum``) against the torch
   path on the self-check's known cases, when Triton is importable;
4. overhead: forward + backward of ``nn.Linear`` vs the protected layer with no sensor armed and
   with all three armed, once per check backend (``--backends``: torch ops, the Triton kernel;
   CUDA events, median of ``--iters``), as a percentage.

Detection and false flags (2.) run on the backend ``SDC_SENSOR_BACKEND`` picks (auto: the
kernel when it passed its self-check), named in the output.

    python benchmarks/sensor_gpu.py                      # 4096 -> 4096, 8192 rows, on cuda
    python benchmarks/sensor_gpu.py --device cpu --k 64 --n 128 --rows 32 --iters 5   # smoke

Not run by the test suite (it needs a GPU for the CUDA branch); ``--device cpu`` exercises the
script itself on the CPU stand-in path.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sdc_agent.faults import FlipGemmBit, ScaleGemmElement
from sdc_agent.sensors.maths import _triton_checksum, abft
from sdc_agent.sensors.ops.linear import ProtectedLinear
from sdc_agent.sensors.runtime.board import GEMMS


def step(layer: nn.Module, x: torch.Tensor, device: str) -> list[torch.Tensor]:
    """Forward and backward under bf16 autocast; the output and gradients."""
    layer.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    with torch.autocast(device, dtype=torch.bfloat16):
        y = layer(x)
    y.float().square().mean().backward()
    return [y.detach(), x.grad, *(p.grad for p in layer.parameters())]


def flags_of(layer: ProtectedLinear, x: torch.Tensor, device: str) -> list[int]:
    board = layer.sensor_board
    board.arm(frozenset(range(3)))
    step(layer, x, device)
    return [int(v) for v in board.take_flags()[0].tolist()]


def timed(run: Any, iters: int, device: str) -> float:
    """Median milliseconds of ``run()`` over ``iters`` (after two warm-up calls)."""
    for _ in range(2):
        run()
    times = []
    for _ in range(iters):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="where to run")
    parser.add_argument("--k", type=int, default=4096, help="input features")
    parser.add_argument("--n", type=int, default=4096, help="output features")
    parser.add_argument("--rows", type=int, default=8192, help="rows (tokens) per batch")
    parser.add_argument("--trials", type=int, default=100, help="fault trials per GEMM")
    parser.add_argument("--iters", type=int, default=50, help="timed iterations")
    parser.add_argument(
        "--backends",
        default="torch,triton",
        help="check backends to time (comma-separated; triton is left out when not importable, "
        "and on the CPU unless TRITON_INTERPRET=1)",
    )
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no GPU here (use --device cpu for a smoke run)")
    dev = args.device
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if any(b not in ("torch", "triton") for b in backends):
        parser.error(f"--backends: torch and/or triton, got {args.backends!r}")
    kernel_runs = _triton_checksum.AVAILABLE and (dev == "cuda" or _triton_checksum.interpreting())
    skipped = [] if kernel_runs else [b for b in backends if b == "triton"]
    backends = [b for b in backends if b not in skipped]
    kernel_agrees = abft.kernel_agrees(torch.device(dev)) if kernel_runs else None
    default_backend = abft.sensor_backend(torch.device(dev))
    torch.manual_seed(0)
    plain = nn.Linear(args.k, args.n).to(dev)
    layer = ProtectedLinear(args.k, args.n, name="fc").to(dev)
    layer.load_state_dict(plain.state_dict())
    board = layer.sensor_board
    gen = torch.Generator(device=dev).manual_seed(1)

    def batch() -> torch.Tensor:
        return torch.randn(args.rows, args.k, device=dev, generator=gen)

    # 1. numerics
    x = batch()
    board.arm(frozenset(range(3)))
    expected, first = step(plain, x, dev), step(layer, x, dev)
    again = step(layer, x, dev)
    board.disarm()
    worst = max(
        float(((a.float() - b.float()).abs() / (a.float().abs() + 1e-6)).max())
        for a, b in zip(expected, first, strict=True)
    )
    reproducible = all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    # 2. warm-up, false flags, detection
    for _ in range(board.config.warmup_checks):
        flags_of(layer, batch(), dev)
    board.agree_alone()  # the agreed thresholds, as a job's ranks reach them
    false_flags = sum(any(flags_of(layer, batch(), dev)) for _ in range(args.trials))
    detection: dict[str, dict[str, float]] = {}
    for label, make in (
        ("x1.1", lambda g: ScaleGemmElement("fc", gemm=g, factor=1.1, rank=0)),
        *(
            (f"bit {b}", lambda g, b=b: FlipGemmBit("fc", gemm=g, bit=b, rank=0))
            for b in (20, 25, 30)
        ),
    ):
        detection[label] = {}
        for index, gemm in enumerate(GEMMS):
            fault = make(gemm)

            def corrupt(name: str, result: torch.Tensor, fault: Any = fault) -> None:
                if name == fault.gemm:
                    at = int(torch.randint(result.numel(), (1,), device=dev, generator=gen))
                    fault.corrupt_(result.view(-1), at)

            layer.gemm_taps[:] = [corrupt]
            caught = sum(flags_of(layer, batch(), dev)[index] for _ in range(args.trials))
            detection[label][gemm] = caught / args.trials
        layer.gemm_taps.clear()
    # 4. overhead, per check backend
    x = batch()
    base = timed(lambda: step(plain, x, dev), args.iters, dev)
    board.disarm()
    unchecked = timed(lambda: step(layer, x, dev), args.iters, dev)
    checked: dict[str, float] = {}
    forced = os.environ.get(abft.BACKEND_ENV)
    try:
        for backend in backends:
            os.environ[abft.BACKEND_ENV] = backend
            checked[backend] = timed(
                lambda: (board.arm(frozenset(range(3))), step(layer, x, dev)), args.iters, dev
            )
    finally:
        if forced is None:
            os.environ.pop(abft.BACKEND_ENV, None)
        else:
            os.environ[abft.BACKEND_ENV] = forced
    board.disarm()
    result = {
        "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
        "shape": {"k": args.k, "n": args.n, "rows": args.rows},
        "max_relative_difference_vs_nn_linear": worst,
        "bit_reproducible": reproducible,
        "check_backend": default_backend,
        "triton_kernel_agrees_with_torch": kernel_agrees,
        "backends_not_timed": skipped,
        "false_flags": false_flags,
        "trials": args.trials,
        "detection": detection,
        "ms": {
            "nn_linear": base,
            "protected_unchecked": unchecked,
            **{f"protected_all_checked_{b}": ms for b, ms in checked.items()},
        },
        "overhead_pct": {
            "unchecked": 100 * (unchecked / base - 1),
            **{f"all_checked_{b}": 100 * (ms / base - 1) for b, ms in checked.items()},
        },
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if reproducible and false_flags == 0 and kernel_agrees is not False else 1


if __name__ == "__main__":
    sys.exit(main())
