"""What each sensor family's check moves, measured by the dispatch-level recorder, against what
the sensor plan registers for it (``sdc_agent.sensors.runtime.plan``).

For each family a small probe model (the op at ``width`` features on ``rows`` rows, fp32, after
an ``nn.Linear`` that gives the board its rows) is protected with :func:`sdc_agent.protect`;
then, for each of the family's sensors, one forward and backward runs under
:class:`~costmodel.recorder.StepRecorder` with only that sensor armed and one with none armed.
The difference is what the check adds: bytes read and written (as fp32 elements, the plan's
unit), kernel launches and FLOPs. The plan registers ``rows x per-row + fixed`` elements per
check (``SensorBoard.costs`` / ``fixed_costs``, before its calibration); ``measured /
registered`` is the family's coefficient, which ``plan.CALIBRATION`` holds and
``tests/unit/test_sensor_calibration.py`` keeps within 25% of this measurement at another
width.

The counts are exact for what ran on the CPU (eager torch operators: on a GPU the Triton paths
fuse some of them into one launch, so a GPU moves the same bytes or fewer; its launches are
fewer). Nothing here times anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .recorder import StepRecorder, install

WIDTH = 1024
"""The width the published table is measured at (the test measures at another)."""
ROWS = 256
"""Rows (tokens) of the probe batch."""


class _Add(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) + self.b(x)


class _Mul(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) * self.b(x)


class _Residual(nn.Module):
    def __init__(self, d: int, features: int | None) -> None:
        from sdc_agent.sensors import ResidualAdd

        super().__init__()
        self.a = nn.Linear(d, d)
        self.add = ResidualAdd(features) if features else ResidualAdd()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.add(x, self.a(x))


class _CrossEntropy(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.head = nn.Linear(d, d)
        self.register_buffer("labels", torch.arange(ROWS) % d, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(x), self.labels[: x.shape[0]])


class _Embedding(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.vocab = 2 * d
        self.embed = nn.Embedding(self.vocab, d)
        self.head = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = (x[:, 0].abs() * 1e4).long() % self.vocab
        return self.head(self.embed(ids))


@dataclass(frozen=True)
class Probe:
    """One family's probe: its sensor kind and a model of ``width`` features."""

    family: str
    kind: str
    build: Callable[[int], nn.Module]


PROBES: tuple[Probe, ...] = (
    Probe("linear", "linear", lambda d: nn.Sequential(nn.Linear(d, d))),
    Probe("layer_norm", "layer_norm", lambda d: nn.Sequential(nn.Linear(d, d), nn.LayerNorm(d))),
    Probe("rms_norm", "rms_norm", lambda d: nn.Sequential(nn.Linear(d, d), nn.RMSNorm(d))),
    Probe("activation (SiLU)", "activation", lambda d: nn.Sequential(nn.Linear(d, d), nn.SiLU())),
    Probe("mul", "mul", _Mul),
    Probe("add", "add", _Add),
    Probe("residual_add", "residual_add", lambda d: _Residual(d, d)),
    Probe("residual_add (no features)", "residual_add", lambda d: _Residual(d, None)),
    Probe("softmax", "softmax", lambda d: nn.Sequential(nn.Linear(d, d), nn.Softmax(-1))),
    Probe(
        "log_softmax", "log_softmax", lambda d: nn.Sequential(nn.Linear(d, d), nn.LogSoftmax(-1))
    ),
    Probe("cross_entropy", "cross_entropy", _CrossEntropy),
    Probe("embedding", "embedding", _Embedding),
)
"""Every family the table calibrates (checked attention and recompute comparisons are not: see
``docs/performance/sensors.md``)."""


def _step(model: nn.Module, x: torch.Tensor) -> None:
    out = model(x)
    (out if out.dim() == 0 else out.float().square().mean()).backward()


def _recorded(model: nn.Module, x: torch.Tensor) -> dict[str, float]:
    model.zero_grad(set_to_none=False)
    recorder = StepRecorder()
    with recorder:
        _step(model, x)
    phase = recorder.summary()["phases"]["step"]
    return {"bytes": phase["bytes"], "launches": phase["launches"], "flops": phase["flops"]}


def measure(probe: Probe, *, width: int = WIDTH, rows: int = ROWS) -> list[dict[str, Any]]:
    """Per sensor of ``probe``'s family: what its check moved (fp32 elements), launched and
    computed over a step with none armed, and what the plan registers for it. Installs the
    recorder's wrappers (:func:`~costmodel.recorder.install`) for the rest of the process."""
    from sdc_agent.sensors import protect

    install()
    torch.manual_seed(0)
    model = probe.build(width)
    board = protect(model)
    x = torch.randn(rows, width, requires_grad=True)  # the first layer's dgrad runs too
    _step(model, x)  # discovery: sites register, the board learns its rows
    indices = [i for i, s in enumerate(board.sensors) if s.kind == probe.kind]
    if not indices:
        raise RuntimeError(f"probe {probe.family}: no {probe.kind} sensor was registered")
    board.arm(frozenset(indices))
    _step(model, x)  # allocate the board's slots, warm every checked path
    board.disarm()
    base = _recorded(model, x)
    out = []
    for index in indices:
        board.arm(frozenset([index]))
        armed = _recorded(model, x)
        board.disarm()
        check, _op = board.costs[index]
        registered = rows * check + board.fixed_costs[index]
        moved = (armed["bytes"] - base["bytes"]) / 4
        out.append(
            {
                "family": probe.family,
                "kind": probe.kind,
                "op": board.sensors[index].gemm,
                "width": width,
                "rows": rows,
                "registered_elements": registered,
                "moved_elements": moved,
                "ratio": moved / registered if registered else float("inf"),
                "launches": armed["launches"] - base["launches"],
                "flops": armed["flops"] - base["flops"],
            }
        )
    return out


def measure_all(*, width: int = WIDTH, rows: int = ROWS) -> list[dict[str, Any]]:
    """:func:`measure` for every probe, in :data:`PROBES` order."""
    return [row for probe in PROBES for row in measure(probe, width=width, rows=rows)]
