"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest
import torch.distributed as dist


@pytest.fixture
def calls(tmp_path, monkeypatch):
    """A one-rank gloo group, with every all_reduce / all_gather recorded as (name, numel)."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    seen: list[tuple[str, int]] = []
    real_reduce, real_gather = dist.all_reduce, dist.all_gather

    def all_reduce(tensor, *args, **kwargs):
        seen.append(("all_reduce", tensor.numel()))
        return real_reduce(tensor, *args, **kwargs)

    def all_gather(out, tensor, *args, **kwargs):
        seen.append(("all_gather", tensor.numel()))
        return real_gather(out, tensor, *args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(dist, "all_gather", all_gather)
    yield seen
    dist.destroy_process_group()
