"""Check 1's per-step agreement: a fixed-size reduction every step, per-rank detail only on demand."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from sdc_agent.gradients import FlagExchange


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


def test_a_clean_step_costs_one_reduction_of_three_integers(calls):
    # Given a rank whose local and reduced gradients were finite
    flags = torch.tensor([0, 0], dtype=torch.int64)
    # When its step's flags are exchanged and read at the agreement point
    exchange = FlagExchange(7, flags, None, 1)
    summary, table = exchange.summary(), exchange.table()
    # Then one all-reduce of 3 int64 ran (its size does not depend on the world), and no gather
    assert calls == [("all_reduce", 3)]
    assert summary.clean and not summary.unanimous
    assert table.clean and table.step == 7 and table.nonfinite == []


def test_a_flagged_step_gathers_who_only_when_the_table_is_read(calls):
    # Given a rank whose local gradient held a NaN (so its reduced one did too)
    exchange = FlagExchange(3, torch.tensor([1, 1], dtype=torch.int64), None, 1)
    # When the summary is read, then nothing but the reduction has run
    summary = exchange.summary()
    assert calls == [("all_reduce", 3)]
    assert not summary.clean and summary.unanimous and summary.any_local
    # When the table is read, then one gather of the two flags names the rank
    table = exchange.table()
    assert calls == [("all_reduce", 3), ("all_gather", 2)]
    assert table.nonfinite == [0] and table.unanimous and not table.clean
    # And reading it again issues no further collective
    exchange.table()
    assert len(calls) == 2
