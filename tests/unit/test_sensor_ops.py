"""Sensors beyond GEMMs, in one process: layer norm (output and input gradient), residual add,
softmax and log-softmax (output and input gradient).

They must change no value (bit for bit the plain modules', checked or not), stay silent on
healthy data after their warm-up, and catch one wrong element of what they check.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import pytest
import torch
from torch import nn

from sdc_agent.drills.faults import _flip_bit_
from sdc_agent.sensors import ResidualAdd, protect
from sdc_agent.sensors.ops.norm import ProtectedLayerNorm
from sdc_agent.sensors.ops.residual import ProtectedResidualAdd
from sdc_agent.sensors.ops.softmax import ProtectedLogSoftmax, ProtectedSoftmax

ROWS, D, TRIALS = 16, 256, 200


class Block(nn.Module):
    """Every op family beyond GEMMs, around two linear layers."""

    def __init__(self, d: int = 24) -> None:
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.gate = nn.Softmax(dim=-1)
        self.add = ResidualAdd(d)
        self.out = nn.Linear(d, 5)
        self.logp = nn.LogSoftmax(dim=1)
        self.legacy = nn.Softmax()  # dim=None: not protected

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.inp(x))
        h = self.add(h, h * self.gate(h))
        return self.logp(self.out(h))


def run_block(model: nn.Module, x: torch.Tensor, bf16: bool = False) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = model(x)
    (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
    return [out, x.grad, *(p.grad for p in model.parameters())]


@pytest.mark.parametrize("armed, bf16", [(False, False), (True, False), (True, True)])
def test_protected_ops_keep_the_plain_modules_values_bit_for_bit(armed, bf16):
    # Given a model with every op family, plain and protected (sensors armed or not), in fp32
    # or under the CPU's bf16 autocast (norm, softmax and add in bf16, GEMMs fp32-accumulated)
    torch.manual_seed(0)
    plain = Block()
    guarded = copy.deepcopy(plain)
    board = protect(guarded)
    if armed:
        board.arm(frozenset(range(len(board))))
    x = torch.randn(7, 24)
    # When both run forward and backward
    expected, got = run_block(plain, x, bf16), run_block(guarded, x, bf16)
    # Then every output and gradient is the same bit for bit (the protected ops run the plain
    # modules' kernels; this small model's bf16 GEMMs happen to match too), and every op family
    # is on the board
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
    assert dict(board.layers) == {
        "inp": "linear",
        "norm": "layer_norm",
        "out": "linear",
        "gate": "softmax",
        "add": "residual_add",
        "logp": "log_softmax",
        "/mul": "mul",  # h * gate(h) in the forward: a function site (sensors/ops/sites.py)
    }
    assert type(guarded.legacy) is nn.Softmax  # torch's implicit dim stays unchecked
    assert not board.take_flags()[0].any()


def test_a_residual_add_needs_a_valid_width():
    with pytest.raises(ValueError, match="features"):
        ResidualAdd(0)


# ---------------------------------------------------------------- detection, per sensor
def make(kind: str) -> nn.Module:
    if kind == "layer_norm":
        norm = ProtectedLayerNorm(D, name="op")
        with torch.no_grad():
            norm.weight.copy_(1 + 0.1 * torch.randn(D))
            norm.bias.copy_(0.1 * torch.randn(D))
        return norm
    if kind == "softmax":
        return ProtectedSoftmax(-1, name="op")
    if kind == "log_softmax":
        return ProtectedLogSoftmax(-1, name="op")
    return ProtectedResidualAdd(D, name="op")


def one_pass(module: nn.Module, kind: str, gen: torch.Generator) -> torch.Tensor:
    """Forward and backward of a fresh batch with every sensor armed; the per-sensor flags."""
    board = module.sensor_board
    board.arm(frozenset(range(len(board))))
    # Norm and add inputs off-centre and wide; softmax logits of unit spread (as attention
    # scales them): with much wider logits most probabilities are too small for a 10% change
    # of one of them to show, or to matter (docs/performance.md, the campaign).
    spread, centre = (1.0, 0.0) if "softmax" in kind else (2.0, 1.0)
    x = (torch.randn(ROWS, D, generator=gen) * spread + centre).requires_grad_()
    y = module(x, torch.randn(ROWS, D, generator=gen)) if kind == "residual_add" else module(x)
    (y * torch.randn(ROWS, D, generator=gen)).sum().backward()
    return board.take_flags()[0]


def warmed(kind: str) -> tuple[nn.Module, torch.Generator]:
    torch.manual_seed(1)
    module, gen = make(kind), torch.Generator().manual_seed(2)
    for _ in range(module.sensor_board.config.warmup_checks):
        assert not one_pass(module, kind, gen).any()  # healthy rows stay under the first check's
    module.sensor_board.agree_alone()  # the thresholds a job's ranks agree on after as many
    return module, gen


SENSORS = [
    ("layer_norm", "forward"),
    ("layer_norm", "dgrad"),
    ("residual_add", "forward"),
    ("softmax", "forward"),
    ("softmax", "dgrad"),
    ("log_softmax", "forward"),
    ("log_softmax", "dgrad"),
]


def caught(module: nn.Module, kind: str, op: str, gen, corrupt: Callable) -> int:
    def tap(name: str, value: torch.Tensor) -> None:
        if name == op:
            corrupt(value.view(-1), int(torch.randint(value.numel(), (1,), generator=gen)))

    module.gemm_taps[:] = [tap]
    index = module.sensor_ops.index(op)
    hits = sum(int(one_pass(module, kind, gen)[index]) for _ in range(TRIALS))
    module.gemm_taps.clear()
    return hits


@pytest.mark.parametrize("kind, op", SENSORS)
def test_each_op_sensor_is_silent_on_healthy_rows_and_catches_one_wrong_element(kind, op):
    # Given a warmed-up protected op (fp32, 16 rows of 256 features)
    module, gen = warmed(kind)
    # Then TRIALS healthy batches raise no flag
    assert sum(int(one_pass(module, kind, gen).any()) for _ in range(TRIALS)) == 0

    # And x1.1 on one random element of what the sensor checks is caught in >= 99% of trials
    def scale(flat, i):
        flat[i] *= 1.1

    assert caught(module, kind, op, gen, scale) >= 0.99 * TRIALS

    # And so is a flip of one random bit in 20-30 of one random fp32 element
    def flip(flat, i):
        _flip_bit_(flat, i, int(torch.randint(20, 31, (1,), generator=gen)))

    assert caught(module, kind, op, gen, flip) >= 0.99 * TRIALS


@pytest.mark.parametrize("kind, op", [("softmax", "forward"), ("layer_norm", "dgrad")])
def test_a_nan_in_a_checked_op_is_a_flag(kind, op):
    # Given a warmed-up protected op
    module, gen = warmed(kind)
    # When one element of its result turns NaN
    module.gemm_taps[:] = [
        lambda name, v: v.view(-1).__setitem__(3, math.nan) if name == op else None
    ]
    # Then its sensor flags
    assert one_pass(module, kind, gen)[module.sensor_ops.index(op)]
