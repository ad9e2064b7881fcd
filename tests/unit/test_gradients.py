"""The comm hook's local check: divide by the world size and flag NaN/Inf, on both paths."""

from __future__ import annotations

import math

import pytest
import torch

from sdc_agent.checks.gradients import comm_hook


@pytest.fixture(params=["fused", "fallback"])
def path(request, monkeypatch):
    """Run each test on torch's fused kernel and on the two-pass fallback."""
    if request.param == "fallback":
        monkeypatch.setattr(comm_hook, "_fused_supported", lambda buffer: False)
    elif not comm_hook._fused_supported(torch.ones(1)):
        pytest.fail("torch's fused non-finite check is missing on the CPU of the pinned torch")
    return request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("world", [1, 3, 8])
def test_finite_buckets_are_divided_like_ddp_and_not_flagged(path, dtype, world):
    buffer = torch.randn(10_000, generator=torch.Generator().manual_seed(world)).to(dtype)
    expected = buffer * (1.0 / world)  # DDP without a hook multiplies by the reciprocal too
    found = comm_hook.divide_and_check(buffer, world)
    assert found.dtype == torch.float32 and found.shape == (1,)
    assert found.item() == 0.0
    assert torch.equal(buffer, expected)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_non_finite_element_anywhere_is_flagged(path, bad, dtype):
    for index in (0, 4_321, 9_999):
        buffer = torch.randn(10_000).to(dtype)
        buffer[index] = bad
        assert comm_hook.divide_and_check(buffer, 3).item() != 0.0


def test_huge_but_finite_gradients_are_not_flagged(path):
    # A squared norm would overflow here (|g| > 1.8e19) and blame a rank for finite values.
    buffer = torch.full((1000,), 1e30)
    assert comm_hook.divide_and_check(buffer, 2).item() == 0.0
