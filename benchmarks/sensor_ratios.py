"""The healthy ratio distribution of every sensor: what a fault-free check reads, per op family,
shape, dtype and kind of data. The sensors' first-check threshold (``SensorConfig.
initial_threshold``) is set above everything this prints, with margin.

Each check divides its identity's residual by a rounding bound (``sensors/abft.py``,
``sensors/rows.py``), so a healthy ratio is a property of the data's rounding, not of the size of
the op: this measures how far that holds. Every op runs through its protected module (the code
path training runs), forward and backward, every sensor armed, on fresh data per trial; the data
kinds are those that stretch a rounding bound: ``randn``; ``llama`` (weights of std 0.02 as Hugging
Face initialises them, unit-RMS inputs); ``positive`` (inputs after a ReLU-like activation: every
term of a row has the same sign, so nothing cancels); ``offset`` (a mean of 30 over a spread of
1); ``heavy`` (log-normal magnitudes, a few elements dominating each row). Single process, CPU.

    python benchmarks/sensor_ratios.py                 # the grid below, 40 trials per cell
    python benchmarks/sensor_ratios.py --trials 200 --json ratios.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sdc_agent.sensors import ResidualAdd, protect

Data = Callable[[tuple[int, ...], torch.Generator], torch.Tensor]

DATA: dict[str, Data] = {
    "randn": lambda shape, g: torch.randn(shape, generator=g),
    "llama": lambda shape, g: torch.randn(shape, generator=g),
    "positive": lambda shape, g: torch.randn(shape, generator=g).clamp_min(0) + 1e-3,
    "offset": lambda shape, g: torch.randn(shape, generator=g) + 30.0,
    "heavy": lambda shape, g: (
        torch.randn(shape, generator=g) * torch.randn(shape, generator=g).exp()
    ),
}

LINEAR_SHAPES = [  # (in_features, out_features, rows)
    (4, 32, 8),
    (16, 32, 8),
    (32, 4, 8),
    (32, 32, 8),
    (64, 64, 64),
    (64, 256, 32),
    (64, 128, 512),
    (128, 64, 512),
    (256, 1024, 128),
    (1024, 1024, 256),
    (1024, 4096, 256),
    (4096, 1024, 256),
    (512, 512, 4096),
]
NORM_FEATURES = [(32, 8), (64, 64), (256, 32), (1024, 256), (4096, 64)]  # (features, rows)
SOFTMAX_WIDTHS = [(4, 8), (16, 64), (128, 256), (1024, 64), (8192, 16)]  # (row length, rows)


def _fill_linear(layer: nn.Linear, kind: str, g: torch.Generator) -> None:
    with torch.no_grad():
        std = 0.02 if kind == "llama" else 1.0 / math.sqrt(layer.in_features)
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=g) * std)
        if kind == "heavy":
            layer.weight.mul_(torch.randn(layer.weight.shape, generator=g).exp())
        if layer.bias is not None:
            layer.bias.copy_(torch.randn(layer.bias.shape, generator=g) * 0.1)


def _run(model: nn.Module, x: torch.Tensor, bf16: bool, upstream: torch.Tensor | None) -> None:
    x = x.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        y = model(x)
    y.float().backward(upstream if upstream is not None else torch.randn_like(y.float()))


def measure_cell(
    build: Callable[[], nn.Module],
    shape: tuple[int, ...],
    kind: str,
    bf16: bool,
    trials: int,
    seed: int,
    prepare: Callable[[nn.Module, str, torch.Generator], None] | None = None,
    input_dtype: torch.dtype = torch.float32,
) -> dict[str, list[float]]:
    """Per sensor op (``kind op``): the largest ratio of each trial."""
    g = torch.Generator().manual_seed(seed)
    model = build()
    board = protect(model)
    out: dict[str, list[float]] = {}
    for _ in range(trials):
        if prepare is not None:
            prepare(model, kind, g)
        board.arm(frozenset(range(len(board))))
        x = DATA[kind](shape, g).to(input_dtype)
        _run(model, x, bf16, None)
        _, ratios = board.take_flags()
        for sensor, ratio in zip(board.sensors, ratios.tolist(), strict=True):
            out.setdefault(f"{sensor.kind} {sensor.gemm}", []).append(ratio)
    return out


class _Only(nn.Module):
    """One op to measure; ``protect()`` needs an ``nn.Linear`` somewhere, which never runs."""

    def __init__(self, op: nn.Module) -> None:
        super().__init__()
        self.unused = nn.Linear(1, 1)
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.op, ResidualAdd):
            return self.op(x, x * 0.5 + 0.1)
        return self.op(x)


def grid(trials: int, seed: int) -> list[dict[str, Any]]:
    """Every cell of the grid: (family, shape, dtype, data) -> the largest ratio seen."""
    rows: list[dict[str, Any]] = []

    def record(found: dict[str, list[float]], shape: Any, dtype: str, kind: str) -> None:
        for family, values in found.items():
            values = sorted(values)
            rows.append(
                {
                    "family": family,
                    "shape": shape,
                    "dtype": dtype,
                    "data": kind,
                    "trials": len(values),
                    "median": values[len(values) // 2],
                    "max": values[-1],
                }
            )

    cell = 0
    for k, n, m in LINEAR_SHAPES:
        for dtype in ("fp32", "bf16"):
            for kind in DATA:
                cell += 1
                found = measure_cell(
                    lambda k=k, n=n: nn.Sequential(nn.Linear(k, n)),
                    (m, k),
                    kind,
                    dtype == "bf16",
                    trials,
                    seed + cell,
                    prepare=lambda model, kind, g: _fill_linear(model[0], kind, g),
                )
                record(found, f"{k}->{n} x{m}", dtype, kind)
    # The ops beyond GEMMs take their input's dtype (bf16 inputs: bf16 outputs, as the CPU's
    # autocast leaves them); the unused linear layer's sensors never check and are left out.
    ops: list[tuple[Callable[[int], nn.Module], tuple[int, int]]] = [
        (lambda d: _Only(nn.LayerNorm(d)), shape) for shape in NORM_FEATURES
    ]
    ops += [(lambda d: _Only(ResidualAdd(d)), shape) for shape in NORM_FEATURES]
    ops += [
        (lambda d, module=module: _Only(module(dim=-1)), shape)
        for shape in SOFTMAX_WIDTHS
        for module in (nn.Softmax, nn.LogSoftmax)
    ]
    for build, (d, m) in ops:
        for dtype in ("fp32", "bf16"):
            for kind in DATA:
                cell += 1
                found = measure_cell(
                    lambda build=build, d=d: build(d),
                    (m, d),
                    kind,
                    False,
                    trials,
                    seed + cell,
                    input_dtype=torch.bfloat16 if dtype == "bf16" else torch.float32,
                )
                beyond = {f: v for f, v in found.items() if not f.startswith("linear")}
                record(beyond, f"D={d} x{m}", dtype, kind)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=40, help="trials per cell")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument("--json", type=Path, help="also write every cell here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    started = time.perf_counter()
    rows = grid(args.trials, args.seed)
    by_family: dict[str, dict[str, Any]] = {}
    for row in rows:
        best = by_family.setdefault(row["family"], {"max": 0.0, "median_of_cells": []})
        best["median_of_cells"].append(row["median"])
        if row["max"] > best["max"]:
            best.update(max=row["max"], at=f"{row['shape']} {row['dtype']} {row['data']}")
    print(f"{'family':24} {'cells':>5} {'median':>7} {'max':>7}  where")
    for family, best in sorted(by_family.items()):
        medians = sorted(best["median_of_cells"])
        print(
            f"{family:24} {len(medians):5d} {medians[len(medians) // 2]:7.3f} "
            f"{best['max']:7.3f}  {best['at']}"
        )
    print(f"\n{len(rows)} cells x {args.trials} trials in {time.perf_counter() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
