"""The fault injectors change exactly what they claim (checked on plain tensors)."""

from __future__ import annotations

import math

import torch

from sdc_agent import faults, fingerprint


def weights() -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, 64)


def test_swap_and_compensating_change_keep_the_plain_sum_but_not_the_fingerprint():
    for fault in (
        faults.SwapWeights("w", i=0, j=7, rank=0),
        faults.CompensatingWeightChange("w", i=2, j=9, delta=4096, rank=0),
    ):
        # Given a weight tensor and its fingerprint
        w = weights()
        before = fingerprint(w)
        # When the fault changes it
        fault.change_(w.view(-1))
        after = fingerprint(w)
        # Then the plain bit-pattern sum is the same but the position-weighted one is not
        assert after[0] == before[0]
        assert after[1] != before[1]
        assert not torch.equal(w, weights())


def test_weight_bit_flip_changes_one_element_by_one_bit():
    w = weights()
    faults.FlipWeightBit("w", index=5, bit=12, rank=0).change_(w.view(-1))
    changed = (w != weights()).nonzero().flatten().tolist()
    assert changed == [5]
    xor = w.view(torch.int32)[5] ^ weights().view(torch.int32)[5]
    assert int(xor) == 1 << 12


def test_sign_bit_flip_of_a_bf16_output_element():
    out = torch.ones(4, dtype=torch.bfloat16)
    faults.FlipOutputBit("layer", index=2, bit=15, rank=0).corrupt_(out)
    assert out.tolist() == [1.0, 1.0, -1.0, 1.0]


def test_output_faults_touch_only_their_target():
    out = torch.ones(2, 3)
    faults.ScaleOutputColumn("l", column=1, factor=1.1, rank=0).corrupt_(out)
    assert torch.allclose(out[:, 1], torch.full((2,), 1.1)) and (out[:, [0, 2]] == 1).all()
    out = torch.ones(2, 3)
    faults.NaNOutputElement("l", index=4, rank=0).corrupt_(out)
    assert math.isnan(out.view(-1)[4]) and torch.isfinite(out).sum() == 5


def test_noise_does_not_consume_the_global_rng():
    # Replays reproduce a rank's batch from the global RNG: a fault must not shift it.
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    faults.OutputNoise("l", relative=0.1, rank=0).corrupt_(torch.ones(8))
    assert torch.equal(torch.rand(3), expected)
