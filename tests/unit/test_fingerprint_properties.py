"""The detection guarantee, as properties over random tensors and random corruptions.

For elements of at most 32 bits and tensors under 2**32 elements, the fingerprint changes when
one element changes, when two elements change by +d and -d, and when two different elements
swap places. Each property runs on both computation paths (tiny tuning: row/column kernel;
8-bit and 64-bit elements: generic kernel) and on the default tuning.
"""

from __future__ import annotations

import contextlib
import sys
from collections import OrderedDict
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sdc_agent import fingerprint
from sdc_agent._fingerprint_plan import CPU_TUNING, Tuning

FP = sys.modules["sdc_agent.fingerprint"]

# dtype -> (signed integer view, width in bits)
DTYPES = {
    torch.float32: (torch.int32, 32),
    torch.bfloat16: (torch.int16, 16),
    torch.float16: (torch.int16, 16),
    torch.int32: (torch.int32, 32),
    torch.int8: (torch.int8, 8),
    torch.float64: (torch.int64, 64),
}
TUNINGS = {
    "tiny": Tuning(lanes_per_row=4, rows_per_chunk=3, min_fast_lanes=8, generic_batch=16),
    "default": CPU_TUNING,
}


PLANS: dict[str, OrderedDict] = {name: OrderedDict() for name in TUNINGS}


@contextlib.contextmanager
def using(tuning_name: str) -> Iterator[None]:
    """Fingerprint with the named CPU tuning and a private plan cache, restored afterwards.

    (A context manager rather than a fixture: hypothesis runs many inputs per fixture call.)
    """
    saved = FP.CPU_TUNING, FP._PLANS
    FP.CPU_TUNING, FP._PLANS = TUNINGS[tuning_name], PLANS[tuning_name]
    try:
        yield
    finally:
        FP.CPU_TUNING, FP._PLANS = saved


def fingerprint_with(tuning_name: str, tensor: torch.Tensor) -> torch.Tensor:
    with using(tuning_name):
        return fingerprint(tensor)


@st.composite
def tensors(draw, tuning_name: str, min_size: int = 1):
    """A random tensor (random bit patterns) of a parameter dtype, as (tensor, its int view)."""
    dtype = draw(st.sampled_from(sorted(DTYPES, key=str)))
    int_dtype, bits = DTYPES[dtype]
    # The tiny tuning has every boundary within 200 elements; the default one needs tensors
    # past its small-tensor threshold (32K lanes, 64K 16-bit elements) to use its fast path.
    size = draw(
        st.integers(min_size, 200)
        if tuning_name == "tiny"
        else st.one_of(st.integers(min_size, 200), st.integers(65_600, 66_000))
    )
    seed = draw(st.integers(0, 2**31))
    g = torch.Generator().manual_seed(seed)
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1)
    if bits == 64:
        values = torch.randint(-(2**62), 2**62, (size,), generator=g, dtype=torch.int64)
    else:
        values = torch.randint(low, high, (size,), generator=g, dtype=torch.int64)
    ints = values.to(int_dtype)
    return ints.view(dtype), ints, (low, high)


@pytest.mark.parametrize("tuning", sorted(TUNINGS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_changing_one_element_changes_the_fingerprint(tuning, data):
    # Given a tensor and one element's new (different) bit pattern
    tensor, ints, (low, high) = data.draw(tensors(tuning))
    i = data.draw(st.integers(0, ints.numel() - 1))
    old = int(ints[i])
    new = data.draw(st.integers(low, high - 1).filter(lambda v: v != old))
    before = fingerprint_with(tuning, tensor)
    # When that element is changed in place
    ints[i] = new
    # Then the fingerprint differs
    assert not torch.equal(fingerprint_with(tuning, tensor), before)


@pytest.mark.parametrize("tuning", sorted(TUNINGS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_compensating_changes_of_two_elements_change_the_fingerprint(tuning, data):
    # Given a tensor, two positions and a change d that keeps both elements in range
    tensor, ints, (low, high) = data.draw(tensors(tuning, min_size=2))
    i, j = data.draw(
        st.lists(st.integers(0, ints.numel() - 1), min_size=2, max_size=2, unique=True)
    )
    a, b = int(ints[i]), int(ints[j])
    d_min, d_max = max(low - a, b - (high - 1)), min(high - 1 - a, b - low)
    d = data.draw(st.integers(d_min, d_max).filter(lambda v: v != 0))
    before = fingerprint_with(tuning, tensor)
    # When one element gains d and the other loses d (same plain sum)
    ints[i], ints[j] = a + d, b - d
    after = fingerprint_with(tuning, tensor)
    # Then the plain sum is unchanged but the fingerprint is not
    assert int(after[0]) == int(before[0])
    assert not torch.equal(after, before)


@pytest.mark.parametrize("tuning", sorted(TUNINGS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_swapping_two_different_elements_changes_the_fingerprint(tuning, data):
    # Given a tensor with two different elements
    tensor, ints, _ = data.draw(tensors(tuning, min_size=2))
    i, j = data.draw(
        st.lists(st.integers(0, ints.numel() - 1), min_size=2, max_size=2, unique=True)
    )
    if int(ints[i]) == int(ints[j]):
        ints[j] = ints[i] ^ 1
    before = fingerprint_with(tuning, tensor)
    # When they swap places
    ints[i], ints[j] = ints[j].clone(), ints[i].clone()
    # Then the fingerprint differs
    assert not torch.equal(fingerprint_with(tuning, tensor), before)
