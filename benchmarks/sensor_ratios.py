"""The healthy ratio distribution of every sensor: what a fault-free check reads, per op family,
shape, dtype and kind of data. The sensors' first-check threshold (``SensorConfig.
initial_threshold``) is set above everything this prints, with margin.

Each check divides its identity's residual by a rounding bound (``sensors/maths/abft.py``,
``sensors/ops/rows.py``), so a healthy ratio is a property of the data's rounding, not of the size of
the op: this measures how far that holds. Every op runs through its protected module (the code
path training runs), forward and backward, every sensor armed, on fresh data per trial; the data
kinds are those that stretch a rounding bound: ``randn``; ``llama`` (weights of std 0.02 as Hugging
Face initialises them, unit-RMS inputs); ``positive`` (inputs after a ReLU-like activation: every
term of a row has the same sign, so nothing cancels); ``offset`` (a mean of 30 over a spread of
1); ``heavy`` (log-normal magnitudes, a few elements dominating each row). Single process, CPU.

Each trial then runs again with one random element of every checked result multiplied by
``--fault`` (x1.1 by default): each sensor reads the fault in its own op, and the table says
the smallest such ratio and how often it is above the first-check threshold and above the floor
of an agreed one (the separation the thresholds leave).

    python benchmarks/sensor_ratios.py                 # the grid below, 40 trials per cell
    python benchmarks/sensor_ratios.py --trials 200 --json ratios.json
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from results import Recorder
from torch import nn

from sdc_agent.sensors import ResidualAdd, SensorConfig, protect, protected_layers

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


def _run(
    model: nn.Module, x: torch.Tensor, bf16: bool, upstream: torch.Tensor | None
) -> torch.Tensor:
    """Forward and backward (``upstream``: the output's gradient; random when None); returns
    the gradient used, so a second run can take the same."""
    x = x.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        y = model(x)
    upstream = upstream if upstream is not None else torch.randn(y.shape)
    y.float().backward(upstream)
    return upstream


def measure_cell(
    build: Callable[[], nn.Module],
    shape: tuple[int, ...],
    kind: str,
    bf16: bool,
    trials: int,
    seed: int,
    prepare: Callable[[nn.Module, str, torch.Generator], None] | None = None,
    input_dtype: torch.dtype = torch.float32,
    fault: float = 0.0,
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per sensor op (``kind op``): the largest ratio of each healthy trial, and with ``fault``
    the ratio of the same trial run again with one random element of every checked result
    multiplied by ``fault`` (each sensor reads the fault in its own op)."""
    g = torch.Generator().manual_seed(seed)
    model = build()
    board = protect(model)
    layers = list(protected_layers(model).values())
    healthy: dict[str, list[float]] = {}
    faulty: dict[str, list[float]] = {}
    for _ in range(trials):
        if prepare is not None:
            prepare(model, kind, g)
        x = DATA[kind](shape, g).to(input_dtype)
        upstream = None
        for out, factor in ((healthy, 0.0), (faulty, fault)):
            if out is faulty and not fault:
                break
            where = int(torch.randint(1 << 30, (1,), generator=g))

            def tap(_op: str, result: torch.Tensor, factor: float = factor, where: int = where):
                result.view(-1)[where % result.numel()] *= factor

            for layer in layers:
                layer.gemm_taps[:] = [tap] if factor else []
            board.arm(frozenset(range(len(board))))
            upstream = _run(model, x, bf16, upstream)
            _, ratios = board.take_flags()
            for sensor, ratio in zip(board.sensors, ratios.tolist(), strict=True):
                out.setdefault(f"{sensor.kind} {sensor.gemm}", []).append(ratio)
    for layer in layers:
        layer.gemm_taps.clear()
    return healthy, faulty


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


def grid(trials: int, seed: int, fault: float) -> list[dict[str, Any]]:
    """Every cell of the grid: (family, shape, dtype, data) -> the median and largest healthy
    ratio, and with ``fault`` the smallest faulty one and the share of faulty trials above the
    first-check threshold and above the floor."""
    rows: list[dict[str, Any]] = []
    config = SensorConfig()

    def record(
        found: tuple[dict[str, list[float]], dict[str, list[float]]],
        shape: Any,
        dtype: str,
        kind: str,
    ) -> None:
        healthy, faulty = found
        for family, values in healthy.items():
            if family.startswith("linear") and not any(values):
                continue  # the unused linear layer of a cell that measures another op
            values = sorted(values)
            row = {
                "family": family,
                "shape": shape,
                "dtype": dtype,
                "data": kind,
                "trials": len(values),
                "median": values[len(values) // 2],
                "max": values[-1],
            }
            if family in faulty:
                hits = faulty[family]
                row["fault_min"] = min(hits)
                row["fault_over_initial"] = sum(h > config.initial_threshold for h in hits)
                row["fault_over_floor"] = sum(h > config.min_threshold for h in hits)
            rows.append(row)

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
                    fault=fault,
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
                    fault=fault,
                )
                record(found, f"D={d} x{m}", dtype, kind)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=40, help="trials per cell")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument(
        "--fault",
        type=float,
        default=1.1,
        help="each trial again with one element x this (0: none)",
    )
    parser.add_argument("--json", type=Path, help="also write every cell here")
    args = parser.parse_args(argv)
    recorder = Recorder(__file__, argv)
    if args.trials < 1:
        parser.error("--trials must be >= 1")
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    rows = grid(args.trials, args.seed, args.fault)
    families: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        families.setdefault(row["family"], []).append(row)
    config = SensorConfig()
    print(
        f"{'family':22} {'cells':>5} {'median':>7} {'max':>7}  {'where':32}"
        + (
            f" x{args.fault:g}: {'min':>7} >{config.initial_threshold:g} >{config.min_threshold:g}"
            if args.fault
            else ""
        )
    )
    for family, cells in sorted(families.items()):
        medians = sorted(c["median"] for c in cells)
        top = max(cells, key=lambda c: c["max"])
        line = (
            f"{family:22} {len(cells):5d} {medians[len(medians) // 2]:7.3f} {top['max']:7.3f}  "
            f"{top['shape'] + ' ' + top['dtype'] + ' ' + top['data']:32}"
        )
        if args.fault:
            trials = sum(c["trials"] for c in cells)
            weakest = min(c["fault_min"] for c in cells)
            over_initial = sum(c["fault_over_initial"] for c in cells) / trials
            over_floor = sum(c["fault_over_floor"] for c in cells) / trials
            line += f"        {weakest:7.2f} {over_initial:4.0%} {over_floor:4.0%}"
        print(line)
    print(f"\n{len(rows)} cells x {args.trials} trials in {time.perf_counter() - started:.0f} s")
    if args.json:
        recorder.write(args.json, {"args": vars(args), "cells": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
