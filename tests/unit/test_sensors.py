"""Protected linear layers: the numerics of nn.Linear, and checks that catch a wrong GEMM."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from sdc_agent.sensors import SensorConfig, find_board, protect
from sdc_agent.sensors.maths.abft import forward_ratio
from sdc_agent.sensors.ops.linear import ProtectedLinear
from sdc_agent.sensors.ops.norm import ProtectedLayerNorm
from sdc_agent.sensors.runtime.board import GEMMS, SensorBoard


def model(bias: bool = True) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(33, 47, bias=bias), nn.Tanh(), nn.Linear(47, 5, bias=bias))


def run(net: nn.Module, x: torch.Tensor, autocast: bool = False):
    """Forward and backward; the output and every gradient (input's included)."""
    net.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = net(x)
    y.float().square().sum().backward()
    return [y.detach(), x.grad] + [p.grad.clone() for p in net.parameters()]


def flip_bit_(t: torch.Tensor, index: int, bit: int) -> None:
    t.view(-1)[index : index + 1].view(torch.int32).bitwise_xor_(1 << bit)


@pytest.mark.parametrize("shape", [(7, 33), (3, 5, 33), (64, 33)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("checked", [True, False])
def test_fp32_protected_layers_are_bit_identical_to_nn_linear(shape, bias, checked):
    # Given a model and a protected copy of it, checking every GEMM or none
    plain = model(bias)
    guarded = copy.deepcopy(plain)
    board = protect(guarded)
    x = torch.randn(*shape)
    board.arm(frozenset(range(len(board))) if checked else frozenset())
    # When both run forward and backward on the same input
    expected, got = run(plain, x), run(guarded, x)
    # Then the output and every gradient are the same bits
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


def test_bf16_autocast_path_matches_nn_linear_to_rounding_and_reproduces_exactly():
    # Given a model under bf16 autocast, plain and protected
    plain = model()
    guarded = copy.deepcopy(plain)
    protect(guarded).arm(frozenset(range(6)))
    x = torch.randn(4, 9, 33)
    # When both run (the protected one twice: training, then a replay)
    expected, first, again = run(plain, x, True), run(guarded, x, True), run(guarded, x, True)
    # Then the output dtype is autocast's, the values agree with nn.Linear to bf16 rounding,
    # and the protected path reproduces itself bit for bit (what replays rely on)
    assert first[0].dtype == torch.bfloat16
    for a, b in zip(expected, first, strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=2**-7, atol=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


def test_protect_keeps_parameters_and_state_dict_keys():
    net = model()
    params = list(net.parameters())
    keys = list(net.state_dict())
    board = protect(net)
    assert list(net.parameters()) == params and all(
        a is b for a, b in zip(net.parameters(), params, strict=True)
    )
    assert list(net.state_dict()) == keys
    assert isinstance(net[0], ProtectedLinear) and isinstance(net[0], nn.Linear)
    assert find_board(net) is board
    assert [s.to_dict() for s in board.sensors[:3]] == [
        {"layer": "0", "gemm": g, "kind": "linear"} for g in GEMMS
    ]


def test_protect_refuses_a_model_twice_or_without_linear_layers():
    net = model()
    protect(net)
    with pytest.raises(ValueError, match="already"):
        protect(net)
    with pytest.raises(ValueError, match=r"no nn\.Linear layer"):
        protect(nn.Sequential(nn.Tanh()))


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"warmup_checks": -1}, "warmup_checks"),
        ({"warmup_checks": 2.0}, "warmup_checks"),
        ({"margin": 0.0}, "margin"),
        ({"min_threshold": math.inf}, "min_threshold"),
        ({"margin": True}, "margin"),
        ({"initial_threshold": math.nan}, "initial_threshold"),
        ({"initial_threshold": 2.0, "min_threshold": 3.0}, "initial_threshold"),
    ],
)
def test_sensor_config_names_the_bad_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SensorConfig(**kwargs)


def test_no_observation_window_keeps_the_first_check_threshold_for_good():
    # Given warmup_checks=0 (valid: no observation window)
    layer = ProtectedLinear(16, 16, name="fc", board=SensorBoard(SensorConfig(warmup_checks=0)))
    board = layer.sensor_board
    # When healthy checks run
    for _ in range(5):
        board.arm(frozenset(range(3)))
        run(layer, torch.randn(8, 16))
        assert not board.take_flags()[0].any()
    # Then nothing is learned and the first-check threshold stays in force
    assert not board.learning
    assert board.thresholds() == [board.config.initial_threshold] * 3


def warmed_layer(warmup: int = 20) -> tuple[ProtectedLinear, torch.Tensor]:
    """A 64 -> 256 protected layer whose three sensors observed ``warmup`` healthy checks and
    then agreed on their thresholds (alone: one process)."""
    torch.manual_seed(1)
    layer = ProtectedLinear(64, 256, board=None, name="fc")
    board = layer.sensor_board
    for _ in range(warmup):
        board.arm(frozenset(range(3)))
        run(layer, torch.randn(32, 64))
        flags, _ = board.take_flags()
        assert not flags.any()  # healthy data stays under the first-check threshold
    assert board.agree_alone() == []  # nobody outlying
    assert all(t < board.config.initial_threshold for t in board.thresholds())
    return layer, torch.randn(32, 64)


def test_one_bit_flip_of_one_fp32_element_is_caught_in_99_percent_of_200_trials():
    # Given a warmed-up protected layer and 200 random single bit flips (bits 20-30) of one
    # element of one of its GEMMs' fp32 results
    layer, _ = warmed_layer()
    board = layer.sensor_board
    gen = torch.Generator().manual_seed(7)
    caught = 0
    for trial in range(200):
        gemm = GEMMS[trial % 3]
        bit = int(torch.randint(20, 31, (1,), generator=gen))

        def corrupt(name, result, gemm=gemm, bit=bit):
            if name == gemm:
                flip_bit_(result, int(torch.randint(result.numel(), (1,), generator=gen)), bit)

        layer.gemm_taps[:] = [corrupt]
        board.arm(frozenset(range(3)))
        # When the layer runs forward and backward
        run(layer, torch.randn(32, 64, generator=gen))
        flags, _ = board.take_flags()
        caught += int(flags[GEMMS.index(gemm)])
    # Then the sensor of the corrupted GEMM flags at least 99% of them
    assert caught >= 198, caught


def test_healthy_held_out_trials_raise_no_flag_after_warm_up():
    layer, _ = warmed_layer()
    board = layer.sensor_board
    for _ in range(200):
        board.arm(frozenset(range(3)))
        run(layer, torch.randn(32, 64) * 10 ** float(torch.empty(()).uniform_(-3, 3)))
        flags, ratios = board.take_flags()
        assert not flags.any(), ratios


def test_a_nan_in_a_checksum_is_a_flag_from_the_first_check_and_teaches_nothing():
    # Given a protected layer whose forward result gets a NaN (the sensors once observed their
    # first 20 checks without flagging: a GPU faulty from the start taught itself its fault)
    layer = ProtectedLinear(8, 8, name="fc", board=None)
    layer.gemm_taps.append(
        lambda name, r: r.view(-1)[0].fill_(math.nan) if name == "forward" else None
    )
    board = layer.sensor_board
    seen = []
    for _ in range(board.config.warmup_checks + 1):
        board.arm(frozenset([0]))
        with torch.no_grad():
            layer(torch.randn(4, 8))
        seen.append(int(board.take_flags()[0][0]))
    # Then every check flags, from the very first
    assert seen == [1] * (board.config.warmup_checks + 1)
    # And nothing was learned from them: the sensor keeps its first-check threshold
    board.agree_alone()
    assert board.thresholds()[0] == board.config.initial_threshold


def test_only_armed_sensors_check_and_flags_wait_for_take():
    # Given a warmed layer whose forward result is scaled x1.1 in one element
    layer, x = warmed_layer()
    board = layer.sensor_board
    layer.gemm_taps.append(lambda name, r: r.view(-1)[3].mul_(1.1) if name == "forward" else None)
    # When only the weight-gradient sensor is armed, nothing flags
    board.arm(frozenset([2]))
    run(layer, x)
    assert not board.take_flags()[0].any()
    # When the forward sensor is armed, it flags, and the flag stays until taken
    board.arm(frozenset([0]))
    run(layer, x)
    run(layer, x)
    flags, ratios = board.take_flags()
    assert flags.tolist() == [1, 0, 0] and float(ratios[0]) > board.config.min_threshold


def test_forward_ratio_is_small_for_an_exact_product_and_large_for_a_wrong_one():
    x, w = torch.randn(16, 32), torch.randn(64, 32)
    y = x @ w.t()
    assert float(forward_ratio(y, x, w, None)) < 2.0
    y[3, 5] *= 1.1
    assert float(forward_ratio(y, x, w, None)) > 10.0


# ---------------------------------------------------------------- layer norms
def norm_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(33, 48), nn.LayerNorm(48), nn.Linear(48, 5))


@pytest.mark.parametrize("autocast", [False, True])
def test_protected_layer_norms_keep_nn_layer_norms_values(autocast):
    # Given a model with a LayerNorm, plain and protected, every sensor checking
    plain = norm_model()
    guarded = copy.deepcopy(plain)
    board = protect(guarded)
    board.arm(frozenset(range(len(board))))
    x = torch.randn(6, 7, 33)
    # When both run (fp32, or bf16 autocast where layer_norm runs in fp32)
    expected, got = run(plain, x, autocast), run(guarded, x, autocast)
    # Then the norm is protected and the norm's values are nn.LayerNorm's, bit for bit in fp32
    assert isinstance(guarded[1], ProtectedLayerNorm)
    assert [s.kind for s in board.sensors] == ["linear"] * 3 + ["layer_norm"] * 2 + ["linear"] * 3
    for a, b in zip(expected, got, strict=True):
        if autocast:
            torch.testing.assert_close(a.float(), b.float(), rtol=2**-7, atol=1e-6)
        else:
            assert torch.equal(a, b)


def test_a_layer_norm_output_fault_is_caught_and_healthy_rows_are_not():
    # Given a protected LayerNorm of 256 features, its threshold agreed after 20 healthy checks
    torch.manual_seed(3)
    norm = ProtectedLayerNorm(256, name="ln")
    board = norm.sensor_board
    for _ in range(board.config.warmup_checks):
        board.arm(frozenset([0]))
        norm(torch.randn(32, 256))
        assert not board.take_flags()[0].any()
    board.agree_alone()
    # Then 200 healthy batches raise no flag ...
    for _ in range(200):
        board.arm(frozenset([0]))
        norm(torch.randn(32, 256) * 5 + 2)
        assert not board.take_flags()[0].any()
    # ... and x1.1 on one random output element is caught in at least 99% of 200 trials
    gen = torch.Generator().manual_seed(4)

    def scale(name, y):
        y.view(-1)[int(torch.randint(y.numel(), (1,), generator=gen))] *= 1.1

    norm.gemm_taps.append(scale)
    caught = 0
    for _ in range(200):
        board.arm(frozenset([0]))
        norm(torch.randn(32, 256, generator=gen))
        caught += int(board.take_flags()[0][0])
    assert caught >= 198, caught
