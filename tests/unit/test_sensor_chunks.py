"""Element-wise checks work in blocks: their fp32 temporaries stay within a few blocks whatever
the tensor, their ratio is the same bits as the whole tensor's, and a wrong element is caught
in any block."""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F

from sdc_agent.sensors.ops.elementwise import (
    activation_dgrad_ratio,
    activation_ratio,
    add_ratio,
    embedding_wgrad_ratio,
    mul_ratio,
)
from tests.unit.live_bytes import LiveBytes

ROWS, WIDTH = 256, 4096
"""A [256, 4096] bf16 activation: 1M elements, 4 MB per full-size fp32 temporary."""
CHUNK = 1 << 14
"""16K elements: 64 KB per fp32 temporary of a block."""
FULL = ROWS * WIDTH * 4


def tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(ROWS, WIDTH, generator=g).bfloat16()
    dy = torch.randn(ROWS, WIDTH, generator=g).bfloat16()
    b = torch.randn(WIDTH, generator=g).bfloat16()  # broadcast over the rows
    return {"x": x, "dy": dy, "b": b}


def checks(t: dict[str, torch.Tensor]) -> dict[str, tuple]:
    """Each check and its arguments (healthy results of bf16 ops)."""
    x, dy, b = t["x"], t["dy"], t["b"]
    dx = torch.ops.aten.silu_backward(dy, x)
    ids = torch.randint(0, 512, (ROWS,), generator=torch.Generator().manual_seed(1))
    dw = torch.ops.aten.embedding_backward(dy, ids, 512, -1, False, False)
    return {
        "silu": (activation_ratio, (F.silu(x), x, "silu")),
        "gelu_tanh": (activation_ratio, (F.gelu(x, approximate="tanh"), x, "gelu", "tanh")),
        "silu_dgrad": (activation_dgrad_ratio, (dx, dy, x, "silu")),
        "add": (add_ratio, (x + b, x, b)),
        "mul": (mul_ratio, (x * b, x, b)),
        "embedding_wgrad": (embedding_wgrad_ratio, (dw, dy, ids, -1)),
    }


@pytest.mark.parametrize("name", list(checks(tensors())))
def test_a_chunked_check_holds_a_few_blocks_and_reads_the_whole_tensors_ratio(name):
    # Given a check of a 1M-element bf16 result
    check, args = checks(tensors())[name]
    whole = check(*args, chunk=ROWS * WIDTH)
    # When it runs in blocks of 16K elements, its allocations measured
    with LiveBytes() as memory:
        chunked = check(*args, chunk=CHUNK)
    # Then its temporaries at their peak are a few blocks' (below one full-size fp32 tensor)
    assert memory.peak < 16 * CHUNK * 4 < FULL, memory.peak
    # And the ratio is the whole tensor's (element-wise checks: the same bits) and healthy
    if name == "embedding_wgrad":
        assert float(chunked) == pytest.approx(float(whole), rel=0.05, abs=0.05)
    else:
        assert torch.equal(chunked, whole)
    assert float(chunked) < 12.0
    # And the unchunked check holds full-size fp32 temporaries (what the blocks avoid)
    with LiveBytes() as unchunked:
        check(*args, chunk=ROWS * WIDTH)
    assert unchunked.peak >= FULL


@pytest.mark.parametrize("name", ["silu", "silu_dgrad", "add", "mul"])
@pytest.mark.parametrize("where", [0, ROWS * WIDTH // 2 + 17, ROWS * WIDTH - 1])
def test_a_wrong_element_is_caught_in_any_block(name, where):
    # Given a check whose result has one element scaled x1.1 (first, middle, last block)
    check, (result, *rest) = checks(tensors())[name]
    wrong = result.clone()
    wrong.view(-1)[where] *= 1.1
    # When it runs in blocks
    ratio = float(check(wrong, *rest, chunk=CHUNK))
    # Then the ratio is far above the first-check threshold
    assert ratio > 12.0, ratio


def test_a_nan_in_any_block_reads_infinite():
    # Given an activation output with a NaN in its last block
    check, (y, x, fn) = checks(tensors())["silu"]
    y = y.clone()
    y.view(-1)[-1] = math.nan
    # When it is checked in blocks, then the ratio is +Inf
    assert float(check(y, x, fn, chunk=CHUNK)) == math.inf


def test_blocks_cut_a_row_larger_than_a_block_and_cover_every_element():
    # Given one row of 40K elements (larger than a 16K block) scaled wrong at its very end
    x = torch.randn(2, 40_000, generator=torch.Generator().manual_seed(3)).bfloat16()
    y = F.silu(x)
    y[1, -1] *= 1.1
    # When it is checked in blocks, then the element is found
    assert float(activation_ratio(y, x, "silu", chunk=CHUNK)) > 12.0
    # And a bad chunk size is refused with a clear error
    with pytest.raises(ValueError, match="chunk"):
        activation_ratio(y, x, "silu", chunk=0)


# ---------------------------------------------------------------- row checks (norms, softmax, adds, loss)
@functools.lru_cache(maxsize=1)
def row_checks() -> dict[str, tuple]:
    """Each row check and its arguments, on healthy results of bf16 ops over [256, 4096]."""
    from sdc_agent.sensors.ops.loss import nll_grad_ratio
    from sdc_agent.sensors.ops.norm import layer_norm_dgrad_ratio, layer_norm_output_ratio
    from sdc_agent.sensors.ops.residual import residual_ratio
    from sdc_agent.sensors.ops.rmsnorm import (
        rms_norm_dgrad_ratio,
        rms_norm_ratio,
        rms_norm_wgrad_ratio,
    )
    from sdc_agent.sensors.ops.softmax import (
        log_softmax_dgrad_ratio,
        log_softmax_ratio,
        softmax_dgrad_ratio,
        softmax_ratio,
    )

    t = tensors()
    x, dy, b = t["x"], t["dy"], t["b"]
    weight = torch.randn(WIDTH, generator=torch.Generator().manual_seed(5)).bfloat16()
    y, mean, rstd = torch.native_layer_norm(x, [WIDTH], weight, b, 1e-5)
    dx, _, _ = torch.ops.aten.native_layer_norm_backward(
        dy, x, [WIDTH], mean, rstd, weight, b, [True, False, False]
    )
    p = torch.softmax(x, 1)
    logp = torch.log_softmax(x, 1)
    target = torch.randint(0, WIDTH, (ROWS,), generator=torch.Generator().manual_seed(6))
    grad = torch.tensor(1.0, dtype=torch.bfloat16)
    total = torch.tensor(float(ROWS), dtype=torch.bfloat16)
    g = torch.ops.aten.nll_loss_backward(grad, logp, target, None, 1, -100, total)
    rms = x.float() * torch.rsqrt(x.float().square().mean(1, keepdim=True) + 1e-6)
    return {
        "layer_norm": (layer_norm_output_ratio, (y, x, mean, rstd, weight, b)),
        "layer_norm_dgrad": (layer_norm_dgrad_ratio, (dx, dy, x, mean, rstd, weight)),
        "rms_norm": (rms_norm_ratio, ((rms * weight.float()).bfloat16(), x, weight, 1e-6)),
        "rms_norm_dgrad": (
            rms_norm_dgrad_ratio,
            (
                torch.func.vjp(
                    lambda v: v * torch.rsqrt(v.square().mean(1, keepdim=True) + 1e-6), x.float()
                )[1](dy.float() * weight.float())[0].bfloat16(),
                dy,
                x,
                weight,
                1e-6,
            ),
        ),
        "rms_norm_wgrad": (
            rms_norm_wgrad_ratio,
            ((dy.float() * rms).sum(0).bfloat16(), dy, x, 1e-6),
        ),
        "softmax": (softmax_ratio, (p, x, 1)),
        "log_softmax": (log_softmax_ratio, (logp, x, 1)),
        "softmax_dgrad": (
            softmax_dgrad_ratio,
            (torch._softmax_backward_data(dy, p, 1, p.dtype), dy, p, 1),
        ),
        "log_softmax_dgrad": (
            log_softmax_dgrad_ratio,
            (torch._log_softmax_backward_data(dy, logp, 1, logp.dtype), dy, logp, 1),
        ),
        "residual": (residual_ratio, (x + b, x, b)),
        "nll_grad": (nll_grad_ratio, (g, target, None, -100, "mean", grad, total)),
    }


ROW_CHECKS = [
    "layer_norm",
    "layer_norm_dgrad",
    "rms_norm",
    "rms_norm_dgrad",
    "rms_norm_wgrad",
    "softmax",
    "log_softmax",
    "softmax_dgrad",
    "log_softmax_dgrad",
    "residual",
    "nll_grad",
]
ACROSS_ROWS = {"rms_norm_wgrad"}
"""Checks that sum over the rows (a weight gradient): the blocks' sums add up to within rounding
of the whole tensor's, not to its bits."""


@pytest.mark.parametrize("name", ROW_CHECKS)
def test_a_row_check_in_blocks_holds_a_few_blocks_and_reads_the_whole_tensors_ratio(name):
    # Given a row check of a [256, 4096] bf16 result
    check, args = row_checks()[name]
    whole = check(*args, chunk=ROWS * WIDTH)
    # When it runs in blocks of 4 rows (16K elements), its allocations measured
    with LiveBytes() as memory:
        chunked = check(*args, chunk=CHUNK)
    # Then its temporaries at their peak are a few blocks' (below one full-size fp32 tensor)
    assert memory.peak < 24 * CHUNK * 4 < FULL, memory.peak
    # And the ratio is the whole tensor's (the same bits for per-row checks) and healthy
    if name in ACROSS_ROWS:
        assert float(chunked) == pytest.approx(float(whole), rel=0.05, abs=0.05)
    else:
        assert torch.equal(chunked, whole), (float(chunked), float(whole))
    assert float(chunked) < 12.0, float(chunked)


@pytest.mark.parametrize("name", ["layer_norm", "softmax", "residual", "rms_norm"])
def test_a_flipped_exponent_in_the_last_block_of_a_row_check_is_caught(name):
    # Given a row check whose result has one element's exponent bit flipped in its last row
    check, (result, *rest) = row_checks()[name]
    wrong = result.clone()
    wrong.view(torch.int16).view(-1)[-5] ^= 1 << 14  # the top exponent bit: x 2^128
    # When it runs in blocks, then the ratio is far above the first-check threshold
    assert float(check(wrong, *rest, chunk=CHUNK)) > 12.0
