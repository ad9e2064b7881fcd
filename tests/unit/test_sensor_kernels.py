"""No tax when nothing is checked: an unarmed protected 16-bit linear layer runs nn.Linear's own
kernels, an armed one pays only for the GEMMs armed, and the audit's replays of a step run the
kernels that step ran (so their bits compare with training's).

The ops are counted by a TorchDispatchMode: every aten call with the dtype of its result."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from sdc_agent.checks.protocol import StepStart
from sdc_agent.checks.replay.environment import deterministic_kernels
from sdc_agent.checks.replay.replayer import Replayer
from sdc_agent.checks.sensors.check import SensorCheck
from sdc_agent.fingerprint import fingerprints
from sdc_agent.schedule import Schedule
from sdc_agent.sensors import protect
from sdc_agent.sensors.ops.linear import ProtectedLinear

GEMM_OPS = {"aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.matmul.default"}


class OpLog(TorchDispatchMode):
    """Every aten op run inside, as (name, dtype of its first tensor result)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, torch.dtype | None]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        first = out[0] if isinstance(out, (tuple, list)) and out else out
        self.ops.append((str(func), first.dtype if isinstance(first, torch.Tensor) else None))
        return out


def model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(33, 47), nn.Tanh(), nn.Linear(47, 5))


def data() -> torch.Tensor:
    return torch.randn(4, 9, 33, generator=torch.Generator().manual_seed(1))


def run(net: nn.Module, x: torch.Tensor, *, mode: str) -> tuple[OpLog, OpLog, list[torch.Tensor]]:
    """Forward and backward (``mode``: "autocast" bf16, or "bf16" weights and inputs); the ops
    of each and every result (output, input gradient, parameter gradients)."""
    net.zero_grad(set_to_none=True)
    x = (x.bfloat16() if mode == "bf16" else x).clone().requires_grad_()
    forward, backward = OpLog(), OpLog()
    with forward, torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast"):
        y = net(x)
    with backward:
        y.float().square().sum().backward()
    return forward, backward, [y.detach(), x.grad] + [p.grad.clone() for p in net.parameters()]


def same_bits(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(u, v) for u, v in zip(a, b, strict=True))


def fp32_gemms(log: OpLog) -> int:
    return sum(1 for name, dtype in log.ops if name in GEMM_OPS and dtype == torch.float32)


@pytest.mark.parametrize("mode", ["autocast", "bf16"])
def test_an_unarmed_protected_16_bit_layer_runs_exactly_nn_linears_ops_and_bits(mode):
    # Given a model and a protected copy of it, no sensor armed (a step outside the rotation)
    plain = model()
    guarded = copy.deepcopy(plain)
    if mode == "bf16":
        plain, guarded = plain.bfloat16(), guarded.bfloat16()
    protect(guarded).arm(frozenset())
    # When both run forward and backward on the same input
    f_plain, b_plain, expected = run(plain, data(), mode=mode)
    f_guard, b_guard, got = run(guarded, data(), mode=mode)
    # Then the protected model issues exactly nn.Linear's ops, in order, with the same result
    # dtypes (no fp32 GEMM, no copy), and computes the same bits
    assert f_guard.ops == f_plain.ops and b_guard.ops == b_plain.ops
    assert fp32_gemms(f_guard) == fp32_gemms(b_guard) == 0
    assert same_bits(expected, got)
    # And no Python autograd function stands in the graph
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast"):
        y = guarded(data().bfloat16() if mode == "bf16" else data())
    assert "BackwardCFunction" not in type(y.grad_fn).__name__


def test_each_gemm_pays_for_the_fp32_path_only_when_its_own_sensor_is_armed():
    # Given a protected model under bf16 autocast (layer "0": sensors 0-2, layer "2": 3-5)
    guarded = model()
    board = protect(guarded)
    cases = {
        frozenset(): (0, 0),
        frozenset([0]): (1, 0),  # layer 0's forward only: its backward GEMMs stay plain
        frozenset([1]): (0, 1),  # layer 0's input gradient only: its forward stays plain
        frozenset([2, 5]): (0, 2),  # both weight gradients
        frozenset(range(6)): (2, 4),  # everything (layer 0's input gradient included)
    }
    for armed, (forward32, backward32) in cases.items():
        board.arm(armed)
        # When the model runs forward and backward
        forward, backward, _ = run(guarded, data(), mode="autocast")
        # Then exactly the armed GEMMs ran with an fp32 result
        assert (fp32_gemms(forward), fp32_gemms(backward)) == (forward32, backward32), armed
        # And every armed sensor checked, and no other
        assert [n > 0 for n in board.checks] == [i in armed for i in range(6)], armed
        board.take_flags()
        board.checks[:] = [0] * 6


def test_the_backward_of_an_unarmed_forward_stays_plain_when_the_board_is_armed_before_it():
    # Given a protected model whose forward ran unarmed
    plain, guarded = model(), model()
    board = protect(guarded)
    board.disarm()
    x = data().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = guarded(x)
    # When every sensor is armed between its forward and its backward
    board.arm(frozenset(range(len(board))))
    with OpLog() as backward:
        y.float().square().sum().backward()
    _, b_plain, _ = run(plain, data(), mode="autocast")
    # Then the backward is nn.Linear's (plain ops, nothing checked)
    assert backward.ops == b_plain.ops
    assert board.checks == [0] * len(board)


def test_a_drill_tap_on_an_unarmed_16_bit_layer_corrupts_the_plain_result_and_is_silent_otherwise():
    # Given a protected model under autocast, nothing armed, and an idle tap on every GEMM of
    # layer "2" (a drill installed but not firing)
    plain = model()
    guarded = copy.deepcopy(plain)
    protect(guarded).arm(frozenset())
    seen: list[tuple[str, torch.dtype]] = []
    layer = guarded[2]
    layer.gemm_taps.append(lambda gemm, result: seen.append((gemm, result.dtype)))
    _, _, expected = run(plain, data(), mode="autocast")
    _, _, got = run(guarded, data(), mode="autocast")
    # Then the tap saw each of its three GEMMs' results as fp32 and nothing changed
    assert sorted(seen) == [(gemm, torch.float32) for gemm in ("dgrad", "forward", "wgrad")]
    assert same_bits(expected, got)
    # When the tap scales one element of the forward result
    layer.gemm_taps[:] = [lambda gemm, r: r.view(-1)[3].mul_(4.0) if gemm == "forward" else None]
    _, _, corrupted = run(guarded, data(), mode="autocast")
    # Then that output element (and only it) differs from nn.Linear's
    differs = corrupted[0] != expected[0]
    assert int(differs.sum()) == 1 and bool(differs.view(-1)[3])


def training_and_replay(armed: frozenset[int]) -> tuple[torch.Tensor, torch.Tensor, OpLog, OpLog]:
    """Train one step of a protected bf16-autocast model with ``armed`` sensors, take the flags
    (what the guard does before its audit), then replay the same batch with check 2's replayer.
    Returns the step's and the replay's gradient fingerprints and ops."""
    net = model()
    board = protect(net)
    batch = (data(), torch.randint(0, 5, (4, 9), generator=torch.Generator().manual_seed(2)))

    def compute_loss(module: nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = module(b[0])
        return F.cross_entropy(out.float().reshape(-1, 5), b[1].reshape(-1))

    params = list(net.parameters())
    board.arm(armed)
    with OpLog() as trained, deterministic_kernels(True):
        compute_loss(net, batch).backward()
    step_table = fingerprints([p.grad for p in params])
    board.take_flags()
    checks = list(board.checks)
    replayer = Replayer(net, params, compute_loss)
    with OpLog() as replayed:
        replayer.replay(batch, seed=0, deterministic=True)
    # The replay checks nothing (it teaches and counts nothing) and leaves the step's gradients
    assert board.checks == checks
    assert torch.equal(fingerprints([p.grad for p in params]), step_table)
    return step_table, replayer.last_table, trained, replayed


@pytest.mark.parametrize(
    "armed", [frozenset(), frozenset([0, 5]), frozenset(range(6))], ids=["none", "some", "all"]
)
def test_an_audit_replay_runs_the_kernels_of_the_step_it_replays_and_reproduces_its_bits(armed):
    # Given a step trained with `armed` sensors and then replayed after the flags were taken
    step_table, replay_table, trained, replayed = training_and_replay(armed)
    # Then the replay ran the same GEMMs, in the same dtypes, as the step (plain where the step
    # was unarmed), and its gradient fingerprints equal the step's bit for bit
    gemms = [op for op in trained.ops if op[0] in GEMM_OPS]
    assert [op for op in replayed.ops if op[0] in GEMM_OPS] == gemms
    assert fp32_gemms(replayed) == fp32_gemms(trained) and (fp32_gemms(trained) > 0) == bool(armed)
    assert torch.equal(replay_table, step_table)


def test_the_guards_sensor_check_keeps_the_steps_kernels_for_its_replays_and_drops_them_after():
    # Given the guard's sensor check on a protected model, in its burn-in (every sensor armed)
    net = model()
    protect(net)
    sensors = SensorCheck(net, Schedule(audit_every=0, check_every=0, sensor_burn_in=5))
    layer: ProtectedLinear = net[0]
    sensors.begin_step(StepStart(0))
    run(net, data(), mode="autocast")
    # When the step's flag is taken (before the audit's replays)
    flag = sensors.take_flag()
    # Then nothing checks any more but the step's kernels stay for the replays
    assert flag is not None and not bool(flag)
    assert not sensors.board.active_layers and layer.kernels() == (True, True, True)
    # And a confirmation replay checks the step's sensors on the step's kernels, uncounted
    checks = list(sensors.board.checks)
    sensors.board.confirm_step()
    run(net, data(), mode="autocast")
    ratios = sensors.board.take_flags()[1]
    assert bool((ratios > 0).all()) and sensors.board.checks == checks
    assert layer.kernels() == (True, True, True)
    # When the step ends, every layer runs its plain kernels again
    sensors.end_step()
    assert layer.kernels() == (False, False, False)
    assert not sensors.board.checked_layers


def test_confirm_step_checks_only_what_the_step_armed():
    # Given a board armed with one sensor, its flags then taken
    net = model()
    board = protect(net)
    board.arm(frozenset([3]))
    board.take_flags()
    # When a confirmation replay runs
    board.confirm_step()
    run(net, data(), mode="autocast")
    ratios = board.take_flags()[1].tolist()
    # Then only that sensor read a ratio (the step's other GEMMs ran plain, as in training)
    assert [r > 0 for r in ratios] == [i == 3 for i in range(6)]
    assert all(math.isfinite(r) for r in ratios)
