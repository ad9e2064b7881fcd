"""Fixtures shared by the unit tests."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import torch.distributed as dist


def free_port() -> int:
    """A TCP port nobody listens on now (for a process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def one_process_group(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A 1-process gloo group for the test (the guard's collectives run in it), on a simulated
    HyperPod node."""
    if dist.is_initialized():
        pytest.fail("a process group is already initialised in this test process")
    monkeypatch.setenv("NODE_NAME", "hyperpod-i-00000000000000000")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


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
