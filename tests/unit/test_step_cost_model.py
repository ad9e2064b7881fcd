"""The GPU cost model's arithmetic (benchmarks/costmodel): shape scaling from a slice to the full
model, the per-operator roofline, the plain step's time, and the amortisation of periodic checks.
Pure logic: nothing is recorded here (tests/unit/test_step_sync_pin.py runs the recorder)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from costmodel import project  # noqa: E402
from costmodel.recorder import Scaling  # noqa: E402

SCALING = Scaling(tokens=24, full_sequence=8192, full_batch=2, vocab=1000, full_vocab=128256)


def test_a_token_dimension_scales_to_the_micro_batch_and_attention_squares_the_sequence() -> None:
    # Given a slice of 24 tokens standing for 2 x 8K, vocabulary 1,000 for 128,256
    # Then an activation [1, 24, 4096] is (2 x 8192 / 24) times larger
    assert SCALING.factor((1, 24, 4096)) == pytest.approx(2 * 8192 / 24)
    # And the logits [24, 1000] scale by tokens and vocabulary
    assert SCALING.factor((24, 1000)) == pytest.approx(2 * 8192 / 24 * 128256 / 1000)
    # And attention scores [1, 8, 24, 24] by the batch times the squared sequence ratio
    assert SCALING.factor((1, 8, 24, 24)) == pytest.approx(2 * (8192 / 24) ** 2)
    # And the labels shifted by one (23 tokens) are still token dimensions; a weight is not
    assert SCALING.factor((23,)) == pytest.approx(2 * 8192 / 24)
    assert SCALING.factor((4096, 4096)) == 1.0
    # And FLOP formulas see the full shapes: one sequence per batch row under attention
    assert SCALING.full_shape((24, 4096)) == torch.Size([16384, 4096])
    assert SCALING.full_shape((1, 8, 24, 128), attention=True) == torch.Size([2, 8, 8192, 128])


def test_scaling_refuses_what_it_could_not_tell_apart() -> None:
    with pytest.raises(ValueError, match="must differ"):
        Scaling(tokens=64, full_sequence=8192, vocab=64, full_vocab=1000)
    with pytest.raises(ValueError, match="full_sequence"):
        Scaling(tokens=64)


def test_an_operator_takes_its_roofline_and_at_least_one_launch() -> None:
    # Given 4.8 GB moved: memory-bound at 80% of each GPU's bandwidth
    times = project.roofline(4.8e9, 0.0, False, False)
    assert times["H100"] == pytest.approx(4.8e9 / (3.35e12 * 0.8))
    assert times["H200"] == pytest.approx(4.8e9 / (4.8e12 * 0.8))
    # And a bf16 GEMM of 1 PFLOP at 70% of 989 TF/s; an fp32 one at the fp32 rate
    assert project.roofline(0.0, 1e15, True, False)["H100"] == pytest.approx(1e15 / 692.3e12)
    assert project.roofline(0.0, 1e15, True, True)["H100"] == pytest.approx(1e15 / 46.9e12)
    # And a tiny kernel costs a launch
    assert project.roofline(8.0, 0.0, False, False)["H200"] == project.LAUNCH_S


def test_the_plain_steps_match_the_first_principles_estimates() -> None:
    # The review of main @ 11d463f estimated ~9.0 s (a) and ~4.7 s (b) per H100 step at 40% MFU
    jobs = project.JOBS_BY_NAME
    assert jobs["llama3-8b-fsdp"].parameters == pytest.approx(8.03e9, rel=0.01)
    assert jobs["llama3-70b-tp8-fsdp"].parameters == pytest.approx(70.6e9, rel=0.01)
    assert jobs["blog-953m-ddp"].parameters == pytest.approx(953e6, rel=0.01)
    assert jobs["llama3-8b-fsdp"].step_s() == pytest.approx(9.0, rel=0.03)
    assert jobs["llama3-70b-tp8-fsdp"].step_s() == pytest.approx(4.7, rel=0.03)
    # And one rank of (b) holds an eighth of the heads, the FFN and the vocabulary
    assert jobs["llama3-70b-tp8-fsdp"].slice_shape() == {
        "hidden": 8192,
        "heads": 8,
        "kv_heads": 1,
        "head_dim": 128,
        "ffn": 3584,
    }
    assert jobs["llama3-70b-tp8-fsdp"].local_vocab == 16032


def _phase(launches: float) -> dict:
    return {
        "launches": launches,
        "aten_calls": launches,
        "bytes": 0,
        "flops": 0,
        "full_bytes": 0.0,
        "full_flops": 0.0,
        "modelled_s": {"H100": launches * 1e-5, "H200": launches * 1e-5},
        "syncs": 0,
        "sync_list": [],
        "waits": [],
        "collectives": [],
    }


def _recording(micro: float, step: float, peak: float = 0.0) -> dict:
    return {"phases": {"micro": _phase(micro), "step": _phase(step)}, "peak_full_bytes": peak}


def test_periodic_checks_are_amortised_over_their_period() -> None:
    # Given recordings: plain 10 launches per micro-batch, check 1 adds 2 and 3 (per phase);
    # in the three-process run a common step, the first weight check launched (+40) and judged
    # (+20), the first audit (+900, its preflight), then a weight check launched (+10), judged
    # (+20), and an audit step (+500)
    job = project.JOBS_BY_NAME["blog-953m-ddp"]
    recordings = {
        "plain": [_recording(10, 5)],
        "checks": [_recording(12, 8)],
        "sensors_idle": [_recording(12, 8)],
        "sensors_all": [_recording(112, 8)],
        "periodic": [
            _recording(12, 8),
            _recording(12, 48),
            _recording(12, 28),
            _recording(12, 908, peak=9.0),
            _recording(12, 18),
            _recording(12, 28),
            _recording(12, 508, peak=7.0),
        ],
    }
    # When each configuration's addition is combined
    checks, _ = project.added(recordings, "checks", job, period=50)
    weights, _ = project.added(recordings, "weights", job, period=50)
    audit, audit_peak = project.added(recordings, "audit", job, period=50)
    sensors, _ = project.added(recordings, "sensors", job, period=50)
    # Then check 1's is the difference, the others' their steady share of the period on top
    # (the first weight check and the first audit pay once what a process builds once)
    assert (checks["micro"]["launches"], checks["step"]["launches"]) == (2, 3)
    assert weights["step"]["launches"] == pytest.approx(3 + (10 + 20) / 10)
    assert audit["step"]["launches"] == pytest.approx(3 + 500 / 100)
    assert sensors["micro"]["launches"] == pytest.approx(2 + 100 / 50)
    # And the audit's extra peak is the largest audit step's over its common step (the first
    # one's: an out-of-memory there stops the job; not amortised)
    assert audit_peak == pytest.approx(9.0)
    # And a run that recorded the wrong number of periodic steps is refused, naming them
    with pytest.raises(ValueError, match="first_audit"):
        project.added({**recordings, "periodic": recordings["periodic"][:4]}, "audit", job, 50)


def _depth(audit_peak: float) -> dict:
    periodic = [_recording(12, 8)] * 3 + [_recording(12, 908, peak=audit_peak)]
    periodic += [_recording(12, 18), _recording(12, 28), _recording(12, 508, peak=audit_peak)]
    return {
        "plain": [_recording(10, 5)],
        "checks": [_recording(12, 8)],
        "sensors_idle": [_recording(12, 8)],
        "sensors_all": [_recording(112, 8, peak=3.0)],
        "periodic": periodic,
    }


def test_an_extra_peak_grows_with_the_layers_but_never_shrinks_with_them() -> None:
    # Given an audit whose extra peak is 10 at 1 layer and 7 at 2 (a replay holding one layer's
    # gradient at a time: the 1-layer run's other terms weigh more), and sensors whose peak is
    # 3 at both depths
    job = project.JOBS_BY_NAME["llama3-70b-tp8-fsdp"]
    by_layers = {1: _depth(10.0), 2: _depth(7.0)}
    # When it is projected onto the job's 80 layers
    rows = project.project(by_layers, job, period=50)["configurations"]
    # Then the audit's peak is the 2-layer run's, not 7 - 79 x 3 (a negative peak)
    assert rows["audit"]["extra_peak_bytes"] == pytest.approx(7.0)
    # And a peak that grows by 2 per layer grows so over the 80 layers
    by_layers = {1: _depth(5.0), 2: _depth(7.0)}
    rows = project.project(by_layers, job, period=50)["configurations"]
    assert rows["audit"]["extra_peak_bytes"] == pytest.approx(5.0 + 79 * 2.0)
