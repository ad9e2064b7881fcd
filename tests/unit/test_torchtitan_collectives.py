"""TitanGuard's own collectives without processes: each one gets its tensors on the guard's
collective device (CUDA under NCCL, whose process groups refuse CPU tensors).

A fake ``torch.distributed`` records the device of every tensor it is handed; the collective
device is the meta device, so a tensor left on the CPU (the NCCL failure at step 0) shows. The
6-process run, with a NaN in one FSDP2 shard, is tests/agent/test_integration_torchtitan.py.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from sdc_agent.integrations import torchtitan as tt

DEVICE = torch.device("meta")
"""Neither the CPU nor CUDA: a tensor that is not moved to the collective device shows."""


class RecordingDist:
    """The collectives TitanGuard calls, recording the device of each tensor they get."""

    def __init__(self) -> None:
        self.devices: list[tuple[str, torch.device]] = []

    def get_rank(self) -> int:
        return 0

    def all_reduce(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        self.devices.append(("all_reduce", tensor.device))

    def broadcast_object_list(
        self, objects: list[Any], src: int = 0, group: Any = None, device: Any = None
    ) -> None:
        # torch serialises the objects into a tensor on ``device`` (the current CUDA device
        # when None): record the device it would use.
        self.devices.append(("broadcast_object_list", torch.device(device or "cpu")))


def titan_guard(checkpointer: Any = None) -> tt.TitanGuard:
    """A TitanGuard whose guard is a stand-in naming the collective device only."""
    titan = tt.TitanGuard.__new__(tt.TitanGuard)
    titan.guard = SimpleNamespace(
        _run=SimpleNamespace(parallel=SimpleNamespace(collective_device=DEVICE))
    )
    titan.checkpointer = checkpointer
    titan.alarm_dir = None
    return titan


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> RecordingDist:
    fake = RecordingDist()
    monkeypatch.setattr(tt, "dist", fake)
    return fake


def test_the_token_count_is_reduced_on_the_collective_device(recording):
    # Given a step of two micro-batches whose labels are on the CPU (as dataloaders yield them)
    labels = torch.tensor([[1, 2, tt.IGNORE_INDEX], [3, tt.IGNORE_INDEX, tt.IGNORE_INDEX]])
    micros = [({"input": labels}, labels), ({"input": labels}, labels)]
    # When TitanGuard counts the step's global tokens
    total = titan_guard()._count_tokens(micros)
    # Then the one all-reduce got a tensor on the collective device, and the count lives there
    assert recording.devices == [("all_reduce", DEVICE)]
    assert total.device == DEVICE and total.dtype == torch.int64


def test_the_count_is_the_labelled_tokens_of_every_micro_batch(monkeypatch):
    # Given a real (single-process) reduction and the CPU as the collective device
    monkeypatch.setattr(tt.dist, "all_reduce", lambda tensor: None)
    titan = titan_guard()
    titan.guard._run.parallel.collective_device = torch.device("cpu")
    labels = torch.tensor([[1, 2, tt.IGNORE_INDEX], [3, tt.IGNORE_INDEX, tt.IGNORE_INDEX]])
    # When it counts two micro-batches of 3 labelled tokens each
    total = titan._count_tokens([({}, labels), ({}, labels)])
    # Then the count is 6
    assert int(total) == 6


def test_resume_broadcasts_its_decision_on_the_collective_device(recording, tmp_path: Path):
    # Given a checkpointer whose folder holds torchtitan's step-5
    (tmp_path / "step-5").mkdir()
    loaded: list[int] = []
    checkpointer = SimpleNamespace(
        enable=True, folder=str(tmp_path), load=lambda step: loaded.append(step)
    )
    # When TitanGuard.resume decides (rank 0) and broadcasts the step to load
    step = titan_guard(checkpointer).resume()
    # Then the broadcast named the collective device (not the current CUDA device by default)
    assert recording.devices == [("broadcast_object_list", DEVICE)]
    assert (step, loaded) == (5, [5])
