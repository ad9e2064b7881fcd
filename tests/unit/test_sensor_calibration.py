"""The sensor plan's cost coefficients against the dispatch-level recorder: every family's
``plan.CALIBRATION`` entry stays within 25% of what the recorder counts its check moving, at a
width and batch other than the table's (``benchmarks/costmodel/calibration.py``), so a change
to a check that moves more (or less) fails here, not in a benchmark."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from sdc_agent.sensors import ResidualAdd, protect
from sdc_agent.sensors.runtime.plan import CALIBRATION, calibration, check_bytes, sensor_costs

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from costmodel import calibration as measured  # noqa: E402
from costmodel import recorder  # noqa: E402

TOLERANCE = 0.25
WIDTH, ROWS = 384, 128  # not the table's 1024 x 256


@pytest.fixture(scope="module")
def checks() -> list[dict]:
    try:
        yield measured.measure_all(width=WIDTH, rows=ROWS)
    finally:
        recorder.uninstall()


def test_every_calibrated_family_is_measured_and_every_measured_one_is_calibrated(checks):
    # Given what the recorder measured, family by family
    seen = {(c["kind"], c["op"]) for c in checks}
    # Then the plan's table names exactly those sensors (none left at the hand-written count)
    assert seen == set(CALIBRATION)


def test_each_coefficient_is_within_25_percent_of_the_recorder_at_another_width(checks):
    # Given each family's check measured at 384 features and 128 rows (the table: 1024 x 256)
    off = {
        (c["family"], c["op"]): (round(c["ratio"], 2), calibration(c["kind"], c["op"]))
        for c in checks
        if abs(calibration(c["kind"], c["op"]) / c["ratio"] - 1) > TOLERANCE
    }
    # Then the plan prices every one within 25% of what it moves
    assert not off, f"(measured, table) off by more than {TOLERANCE:.0%}: {off}"


def test_the_non_gemm_checks_cost_the_plan_more_than_they_register(checks):
    # Then the norms' gradients, activations, products, (log-)softmax and the loss move
    # 2.5-6x what their hand-written counts say; the linear checks about what they say
    ratios = {(c["family"], c["op"]): c["ratio"] for c in checks}
    assert all(0.9 < ratios[("linear", op)] < 1.5 for op in ("forward", "dgrad", "wgrad"))
    assert all(ratios[k] > 2.4 for k in [("activation (SiLU)", "forward"), ("softmax", "dgrad")])


def test_softmax_and_a_featureless_residual_add_are_priced_per_row_once_they_run():
    # Given a softmax over rows of 256 and a ResidualAdd given no features, protected
    model = nn.Sequential(nn.Linear(256, 256), nn.Softmax(-1))
    board = protect(model)
    residual = nn.Module()
    residual.lin, residual.add = nn.Linear(256, 256), ResidualAdd()
    other = protect(residual)
    before = [board.costs[-1], other.costs[-1]]
    # When they first run
    x = torch.randn(8, 256)
    model(x).sum().backward()
    residual.add(x, residual.lin(x)).sum().backward()
    # Then their registered cost is per row of 256 elements, not per element
    assert board.costs[-1] == (before[0][0] * 256, before[0][1] * 256)
    assert other.costs[-1] == (6 * 256, 256)


def test_the_embedding_weight_gradient_counts_its_vocabulary_pass_once_per_check():
    # Given an embedding of 4096 x 64 before a linear layer, protected, run once
    model = nn.Sequential(nn.Embedding(4096, 64), nn.Linear(64, 64))
    board = protect(model)
    model(torch.randint(0, 4096, (32,))).sum().backward()
    [wgrad] = [
        i for i, s in enumerate(board.sensors) if s.kind == "embedding" and s.gemm == "wgrad"
    ]
    # Then its fixed cost is the vocabulary x width pass, amortised over the batch by the plan
    assert board.fixed_costs[wgrad] == 4096 * 64
    assert check_bytes(board, wgrad, 32) == pytest.approx(
        4 * calibration("embedding", "wgrad") * (32 * board.costs[wgrad][0] + 4096 * 64)
    )
    small, large = (sensor_costs(board, rows=r, device_type="cpu")[wgrad] for r in (32, 4096))
    assert small > large
