"""Check 1's per-step agreement: a fixed-size reduction every step, per-rank detail only on demand."""

from __future__ import annotations

import pytest
import torch

from sdc_agent.checks.gradients.exchange import FlagExchange


def test_a_clean_step_costs_one_reduction_of_four_integers(calls):
    # Given a rank whose local and reduced gradients were finite
    flags = torch.tensor([0, 0], dtype=torch.int64)
    # When its step's flags are exchanged and read at the agreement point
    exchange = FlagExchange(7, flags, None, 1)
    summary, table = exchange.summary(), exchange.table()
    # Then one all-reduce of 4 int64 ran (its size does not depend on the world), and no gather
    assert calls == [("all_reduce", 4)]
    assert summary.clean and not summary.unanimous
    assert table.clean and table.step == 7 and table.nonfinite == []


def test_a_flagged_step_gathers_who_only_when_the_table_is_read(calls):
    # Given a rank whose local gradient held a NaN (so its reduced one did too)
    exchange = FlagExchange(3, torch.tensor([1, 1], dtype=torch.int64), None, 1)
    # When the summary is read, then nothing but the reduction has run
    summary = exchange.summary()
    assert calls == [("all_reduce", 4)]
    assert not summary.clean and summary.unanimous and summary.any_local
    # When the table is read, then one gather of the three flags names the rank
    table = exchange.table()
    assert calls == [("all_reduce", 4), ("all_gather", 3)]
    assert table.nonfinite == [0] and table.unanimous and not table.clean
    # And reading it again issues no further collective
    exchange.table()
    assert len(calls) == 2


def test_a_sensor_flag_travels_in_the_same_reduction_and_names_its_rank(calls):
    # Given a rank whose gradients were finite but whose online GEMM sensor flagged
    exchange = FlagExchange(5, torch.tensor([0, 0, 1], dtype=torch.int64), None, 1)
    # When the summary and the table are read
    summary, table = exchange.summary(), exchange.table()
    # Then the one reduction carried it, and the table names the rank as a sensor candidate
    assert calls == [("all_reduce", 4), ("all_gather", 3)]
    assert summary.any_sensor and not summary.clean and not summary.any_local
    assert table.sensor_flagged == [0] and table.nonfinite == [] and not table.clean


def test_flags_read_to_the_host_launch_the_same_reduction_and_gather(calls):
    # Given the guard's per-step path: a rank's flags already read to the host (one read)
    clean = FlagExchange(8, (False, False, False), None, 1, device=torch.device("cpu"))
    # When a clean step's summary is read, then one reduction of 4 int64 ran and no gather
    assert clean.summary().clean and calls == [("all_reduce", 4)]
    # Given a rank whose reduced gradient was non-finite (its local one was finite)
    flagged = FlagExchange(9, (False, True, False), None, 1, device=torch.device("cpu"))
    # When its table is read, then the gather of this rank's three flags names it
    table = flagged.table()
    assert calls == [("all_reduce", 4), ("all_reduce", 4), ("all_gather", 3)]
    assert table.reduced == (True,) and table.nonfinite == [] and table.unanimous


def test_flags_read_to_the_host_are_reduced_without_a_host_to_device_copy(calls, monkeypatch):
    # Given the per-step path's flags read to the host, every combination of them
    made = []
    real_tensor = torch.tensor

    def tensor(*args, **kwargs):
        made.append(args[0])
        return real_tensor(*args, **kwargs)

    monkeypatch.setattr(torch, "tensor", tensor)
    for local in (False, True):
        for reduced in (False, True):
            for sensor in (False, True):
                # When each is exchanged
                exchange = FlagExchange(
                    1, (local, reduced, sensor), None, 1, device=torch.device("cpu")
                )
                # Then the reduction is this rank's flags and `clean`, as before
                clean = not (local or reduced or sensor)
                assert exchange.reduced_for_reading().tolist() == [
                    int(local),
                    int(reduced),
                    int(sensor),
                    int(clean),
                ]
    # And no step made a tensor from host values: one table of the eight rows was made once
    # per device (a host-to-device copy from pageable memory blocks the host on a GPU)
    assert len(made) <= 1
    assert calls == [("all_reduce", 4)] * 8


def test_an_exchange_settled_from_values_read_elsewhere_reads_nothing_again(calls):
    # Given an exchange in flight whose reduction the caller reads with its own values
    exchange = FlagExchange(2, (True, True, False), None, 1, device=torch.device("cpu"))
    values = exchange.reduced_for_reading().tolist()
    # When it is settled from them
    summary = exchange.settle_from(values)
    # Then its summary is that one, with no second wait or read (the same object)
    assert exchange.settled and exchange.summary() is summary
    assert summary.any_local and summary.unanimous
    # And a wrong number of values is refused by name
    with pytest.raises(ValueError, match="4 values"):
        FlagExchange(3, (False, False, False), None, 1).settle_from([0, 0])
