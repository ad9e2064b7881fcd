"""Detection rate of the online GEMM sensors vs fault size and bit, and their false-flag rate.

Single process, CPU. A protected linear layer (``--k`` inputs, ``--n`` outputs, ``--rows`` rows
per batch) first warms its three sensors up on healthy batches (observe only). Then, for each
fault kind (one element of one GEMM's fp32 result scaled by a factor, or one of its bits
flipped) and each GEMM (forward, dgrad, wgrad), ``--trials`` fresh batches run with the fault
and the sensor of the corrupted GEMM either flags or not; the same number of healthy batches
measure the false-flag rate. Printed as a table (``--json`` writes it too).

    python benchmarks/sensor.py                      # 64 -> 256, 200 trials: a few seconds
    python benchmarks/sensor.py --k 1024 --n 4096 --rows 64 --trials 500
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from sdc_agent.faults import FlipGemmBit, ScaleGemmElement
from sdc_agent.sensors.ops.linear import ProtectedLinear
from sdc_agent.sensors.runtime.board import GEMMS

FACTORS = (1.001, 1.01, 1.1, 2.0)
BITS = (10, 16, 18, 20, 22, 24, 26, 30)


def run_batch(layer: ProtectedLinear, x: torch.Tensor) -> torch.Tensor:
    """One forward and backward with every sensor armed; returns the per-sensor flags."""
    board = layer.sensor_board
    board.arm(frozenset(range(3)))
    layer.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    layer(x).square().sum().backward()
    return board.take_flags()[0]


def measure(k: int, n: int, rows: int, trials: int, seed: int) -> dict[str, Any]:
    """The detection and false-flag rates (see the module docstring)."""
    torch.manual_seed(seed)
    layer = ProtectedLinear(k, n, name="fc")
    gen = torch.Generator().manual_seed(seed + 1)
    for _ in range(layer.sensor_board.config.warmup_checks):
        run_batch(layer, torch.randn(rows, k, generator=gen))
    layer.sensor_board.agree_alone()  # the agreed threshold, as a job's ranks reach it
    false_flags = sum(
        bool(run_batch(layer, torch.randn(rows, k, generator=gen)).any()) for _ in range(trials)
    )
    faults: list[tuple[str, Any]] = [
        (f"x{f}", lambda gemm, f=f: ScaleGemmElement("fc", gemm=gemm, factor=f, rank=0))
        for f in FACTORS
    ]
    faults += [
        (f"bit {b}", lambda gemm, b=b: FlipGemmBit("fc", gemm=gemm, bit=b, rank=0)) for b in BITS
    ]
    table: dict[str, dict[str, float]] = {}
    for label, make in faults:
        table[label] = {}
        for g, gemm in enumerate(GEMMS):
            fault = make(gemm)

            def corrupt(name: str, result: torch.Tensor, fault: Any = fault) -> None:
                # The drill's own corruption, at a random element of the GEMM's fp32 result.
                if name == fault.gemm:
                    index = int(torch.randint(result.numel(), (1,), generator=gen))
                    fault.corrupt_(result.view(-1), index)

            layer.gemm_taps[:] = [corrupt]
            caught = sum(
                int(run_batch(layer, torch.randn(rows, k, generator=gen))[g]) for _ in range(trials)
            )
            layer.gemm_taps.clear()
            table[label][gemm] = caught / trials
    return {
        "shape": {"k": k, "n": n, "rows": rows},
        "trials": trials,
        "false_flag_rate": false_flags / trials,
        "detection": table,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, default=64, help="input features")
    parser.add_argument("--n", type=int, default=256, help="output features")
    parser.add_argument("--rows", type=int, default=32, help="rows per batch")
    parser.add_argument("--trials", type=int, default=200, help="trials per cell")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args(argv)
    if min(args.k, args.n, args.rows, args.trials) < 1:
        parser.error("--k, --n, --rows and --trials must be >= 1")
    result = measure(args.k, args.n, args.rows, args.trials, args.seed)
    print(
        f"linear {args.k} -> {args.n}, {args.rows} rows, {args.trials} trials per cell; "
        f"healthy false-flag rate {result['false_flag_rate']:.2%}"
    )
    print(f"{'fault':<10}" + "".join(f"{g:>10}" for g in GEMMS))
    for label, row in result["detection"].items():
        print(f"{label:<10}" + "".join(f"{row[g]:>10.1%}" for g in GEMMS))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
