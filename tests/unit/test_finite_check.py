"""Check 1's finiteness test (sdc_agent.checks.gradients.finiteness): every NaN/Inf seen, every
finite value passed, nothing changed."""

from __future__ import annotations

import pytest
import torch

from sdc_agent.checks.gradients.finiteness import mark_non_finite, new_flag

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
FLOATS = [torch.float32, torch.bfloat16, torch.float16, torch.float64]
SHAPES = [(64, 32), (64,), (7, 3, 5), (1,)]  # weights, biases, odd sizes, one element
BAD = [float("nan"), float("inf"), float("-inf")]


def gradients(dtype: torch.dtype, device: str) -> list[torch.Tensor]:
    """A model's worth of small, finite gradients."""
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g).mul_(1e-3).to(device=device, dtype=dtype) for s in SHAPES]


def raw_bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes, to compare bit for bit (as values -0.0 == 0.0)."""
    return tensor.detach().cpu().contiguous().view(torch.uint8).clone()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bad", BAD)
def test_one_nonfinite_element_anywhere_in_any_parameter_raises_the_flag(device, dtype, bad):
    for victim in range(len(SHAPES)):
        for where in ("first", "middle", "last"):
            # Given a model's finite gradients with one element of one of them made NaN/+-Inf
            grads = gradients(dtype, device)
            flat = grads[victim].view(-1)
            index = {"first": 0, "middle": flat.numel() // 2, "last": -1}[where]
            flat[index] = bad
            before = [t.clone() for t in grads]
            # When they are checked one parameter at a time into one flag, as the taps do
            flag = new_flag(device)
            for grad in grads:
                mark_non_finite([grad], flag)
            # Then the flag is raised; every finite value kept its bits and the bad one stayed
            # what it was (a NaN's payload may be made canonical in bf16/fp16: still a NaN)
            assert flag.item() != 0, (victim, where)
            others = [i for i in range(len(grads)) if i != victim]
            assert all(torch.equal(raw_bits(grads[i]), raw_bits(before[i])) for i in others)
            assert flat[index].isnan().item() if bad != bad else flat[index].item() == bad
            keep = torch.ones(flat.numel(), dtype=torch.bool, device=device)
            keep[index] = False
            assert torch.equal(raw_bits(flat[keep]), raw_bits(before[victim].view(-1)[keep]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS)
def test_the_largest_finite_values_and_subnormals_pass_unchanged(device, dtype):
    # Given gradients full of the dtype's extremes: +-max (whose squares, and whose float32
    # sums, overflow), the smallest subnormal, signed zeros
    info = torch.finfo(dtype)
    extremes = torch.tensor(
        [info.max, -info.max, info.tiny, info.smallest_normal / 4, 0.0, -0.0], dtype=torch.float64
    ).to(dtype)
    grads = [
        extremes.repeat(1000).to(device),
        torch.full((4096,), info.max, dtype=dtype).to(device),
    ]
    before = [raw_bits(t) for t in grads]
    # When they are checked
    flag = new_flag(device)
    mark_non_finite(grads, flag)
    # Then the flag stays down and every bit is as it was
    assert flag.item() == 0
    assert all(torch.equal(raw_bits(t), b) for t, b in zip(grads, before, strict=True))


@pytest.mark.parametrize("device", DEVICES)
def test_a_raised_flag_stays_raised_through_later_clean_gradients(device):
    # Given a flag raised by one parameter's NaN
    flag = new_flag(device)
    mark_non_finite([torch.tensor([1.0, float("nan")], device=device)], flag)
    # When later parameters are clean (or empty)
    mark_non_finite([torch.ones(8, device=device), torch.empty(0, device=device)], flag)
    # Then it is still raised
    assert flag.item() != 0


def test_a_dtype_without_the_fused_kernel_gets_the_same_answer():
    # Given complex gradients (no fused kernel on the CPU), one with an Inf imaginary part
    clean = torch.randn(16, dtype=torch.complex64)
    bad = clean.clone()
    bad[3] = complex(0.0, float("inf"))
    # When each is checked, then only the non-finite one raises its flag
    flags = [new_flag("cpu"), new_flag("cpu")]
    mark_non_finite([clean], flags[0])
    mark_non_finite([bad], flags[1])
    assert flags[0].item() == 0 and flags[1].item() != 0


def test_bad_input_is_refused_naming_the_argument():
    # Given a flag of the wrong kind, or a tensor whose finiteness means nothing
    with pytest.raises(ValueError, match="flag"):
        mark_non_finite([torch.ones(2)], torch.zeros(2))
    with pytest.raises(ValueError, match="flag"):
        mark_non_finite([torch.ones(2)], torch.zeros(1, dtype=torch.float64))
    with pytest.raises(ValueError, match="tensors"):
        mark_non_finite([torch.ones(2, dtype=torch.int64)], new_flag("cpu"))
