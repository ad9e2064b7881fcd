"""The fused Triton checksum kernel (the GPU path of the sensors), run in Triton's CPU
interpreter: it reads what the torch path reads, catches what it catches, and is chosen by
SDC_SENSOR_BACKEND. Triton is a development requirement (requirements-dev.txt) for this file."""

from __future__ import annotations

import math
import platform
import warnings

import pytest
import torch

from sdc_agent.sensors import SensorConfig
from sdc_agent.sensors.maths import _triton_checksum as kernel
from sdc_agent.sensors.maths import abft
from sdc_agent.sensors.ops.linear import ProtectedLinear
from sdc_agent.sensors.runtime.board import GEMMS, SensorBoard

if not kernel.AVAILABLE:
    if platform.system() == "Linux":  # a missing dev requirement is a failure, not a skip
        raise ImportError(
            "tests/unit/test_sensor_triton.py needs Triton (pip install -r requirements-dev.txt)"
        )
    pytest.skip("Triton publishes Linux wheels only", allow_module_level=True)


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    """Every test here runs the kernel on CPU tensors in Triton's interpreter."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with warnings.catch_warnings():
        # The interpreter evaluates with numpy, which warns on the inf/inf of a NaN case.
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def both(result, left, right, bias=None):
    scale = abft._bound_scale(left.shape[1], result.shape[1])
    by_torch = float(abft._ratio_torch(result, left, right, bias, scale))
    by_kernel = float(kernel.row_checksum_ratio(result, left, right, bias, scale))
    return by_torch, by_kernel


@pytest.mark.parametrize(
    ("rows", "inner", "width", "bias"),
    [(1, 1, 1, False), (5, 3, 200, True), (33, 129, 31, True), (70, 257, 300, False)],
)
def test_the_kernel_reads_a_fault_of_known_size_as_the_torch_path_does(rows, inner, width, bias):
    # Given an exact integer product (every row's checksum difference is 0) with one element
    # off by a known amount in one row
    g = torch.Generator().manual_seed(rows + inner)
    left = torch.randint(-3, 4, (rows, inner), generator=g).float()
    right = torch.randint(-3, 4, (inner, width), generator=g).float()
    b = torch.randint(-3, 4, (width,), generator=g).float() if bias else None
    result = left @ right + (b if b is not None else 0.0)
    result[rows // 2, width - 1] += 2.0
    # When both paths compute the ratio
    by_torch, by_kernel = both(result, left, right, b)
    # Then they agree to rounding, far above any threshold
    assert by_torch > 100.0
    assert by_kernel == pytest.approx(by_torch, rel=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("transposed", [False, True])
def test_healthy_products_stay_below_the_threshold_floor_in_any_dtype_and_layout(dtype, transposed):
    # Given healthy GEMM results of 16-bit or fp32 operands, contiguous or transposed views
    # (the weight-gradient check reads dYᵀ)
    g = torch.Generator().manual_seed(3)
    for _ in range(5):
        left = torch.randn(40, 96, generator=g).to(dtype)
        right = torch.randn(96, 72, generator=g).to(dtype)
        if transposed:
            left = left.t().contiguous().t()
            right = right.t().contiguous().t()
        result = left.float() @ right.float()
        # When both paths read them
        by_torch, by_kernel = both(result, left, right)
        # Then neither comes near the floor of every threshold
        assert by_torch < 3.0 and by_kernel < 3.0, (by_torch, by_kernel)


def test_a_nan_or_inf_anywhere_reads_as_inf_and_an_empty_product_as_zero():
    left, right = torch.randn(9, 20), torch.randn(20, 11)
    result = left @ right
    nan = result.clone()
    nan[4, 2] = math.nan
    assert both(nan, left, right) == (math.inf, math.inf)
    inf = left.clone()
    inf[8, 19] = math.inf
    assert both(result, inf, right) == (math.inf, math.inf)
    empty = torch.zeros(0, 11)
    assert both(empty, torch.zeros(0, 20), right) == (0.0, 0.0)


def test_the_self_check_trusts_the_kernel_and_rejects_a_wrong_one(monkeypatch):
    # Given the kernel as shipped, the self-check passes
    assert abft.kernel_agrees(torch.device("cpu"))
    # When the kernel reads rows twice too small (a wrong bound), the self-check rejects it
    real = kernel.row_checksum_ratio
    monkeypatch.setattr(
        kernel, "row_checksum_ratio", lambda r, a, b, bias, scale: real(r, a, b, bias, scale * 2)
    )
    assert not abft.kernel_agrees(torch.device("cpu"))
    # And a kernel that cannot run is not trusted (auto mode then falls back to torch)
    monkeypatch.setattr(kernel, "row_checksum_ratio", lambda *a: 1 / 0)
    assert abft._self_check(torch.device("cpu")) is False


def test_sdc_sensor_backend_chooses_the_path_and_names_a_bad_choice(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.delenv("SDC_SENSOR_BACKEND", raising=False)
    assert abft.sensor_backend(cpu) == "torch"  # auto: the kernel serves GPUs only
    monkeypatch.setenv("SDC_SENSOR_BACKEND", "triton")
    assert abft.sensor_backend(cpu) == "triton"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        abft.sensor_backend(cpu)
    monkeypatch.setenv("SDC_SENSOR_BACKEND", "cuda-fast")
    with pytest.raises(ValueError, match="SDC_SENSOR_BACKEND must be one of auto, torch, triton"):
        abft.sensor_backend(cpu)


def test_a_protected_layer_on_the_kernel_catches_a_one_element_fault_in_each_gemm(monkeypatch):
    # Given a protected layer whose checks run on the kernel, warmed up on healthy batches
    monkeypatch.setenv("SDC_SENSOR_BACKEND", "triton")
    torch.manual_seed(0)
    # (a short warm-up: the interpreter runs each kernel in Python)
    layer = ProtectedLinear(48, 80, name="fc", board=SensorBoard(SensorConfig(warmup_checks=4)))
    board = layer.sensor_board

    def step(x):
        board.arm(frozenset(range(3)))
        x = x.clone().requires_grad_()
        layer(x).square().sum().backward()
        return board.take_flags()

    for _ in range(board.config.warmup_checks):
        step(torch.randn(24, 48))
    board.agree_alone()
    # When healthy batches run, nothing flags
    for _ in range(2):
        flags, ratios = step(torch.randn(24, 48))
        assert not flags.any(), ratios
    # When one element of one GEMM's fp32 result is scaled x1.1, that GEMM's sensor flags
    for gemm in GEMMS:
        layer.gemm_taps[:] = [
            lambda name, r, gemm=gemm: r.view(-1)[5].mul_(1.1) if name == gemm else None
        ]
        flags, _ = step(torch.randn(24, 48))
        assert flags.tolist() == [int(g == gemm) for g in GEMMS], gemm
