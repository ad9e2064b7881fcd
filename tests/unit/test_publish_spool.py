"""The local spool: alarms that could not be sent are kept, re-sent in order, never lost."""

from __future__ import annotations

import json
import threading
import time

from sdc_agent.publish.events import Delivery
from sdc_agent.publish.spool import CLAIMED, STALE_CLAIM_SECONDS, DeliveryFailed, Spool


def delivery(n: int) -> Delivery:
    return Delivery(
        kind="alarm",
        log_group="/sdc/c",
        log_stream="j",
        namespace="SDC",
        message=json.dumps({"n": n}),
        metrics=({"MetricName": "sdc_nonfinite_grad", "Value": float(n)},),
    )


def test_spooled_records_come_back_in_order_and_are_removed_once_sent(tmp_path):
    # Given three deliveries spooled one after another
    spool = Spool(tmp_path, max_bytes=1 << 20)
    for n in range(3):
        assert spool.put(delivery(n))
    # Each record is one JSON line in its own .jsonl file
    lines = [p.read_text() for p in spool.records()]
    assert all(line.endswith("\n") and line.count("\n") == 1 for line in lines)
    # When the spool is drained
    sent: list[Delivery] = []
    assert spool.drain(sent.append) == (3, 0)
    # Then every record was sent intact, oldest first, and nothing is left
    assert sent == [delivery(0), delivery(1), delivery(2)]
    assert list(tmp_path.iterdir()) == []


def test_a_transient_failure_stops_the_drain_and_keeps_what_is_left(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    for n in range(3):
        spool.put(delivery(n))
    calls: list[int] = []

    def send(d: Delivery) -> None:
        calls.append(json.loads(d.message)["n"])
        if len(calls) == 2:
            # the report went through, the metrics did not
            raise DeliveryFailed(d.without_message(), "timeout", transient=True)

    # When the second send fails half-way
    assert spool.drain(send) == (1, 2)
    # Then the third was not tried, and the second keeps only its unsent part, in its place
    assert calls == [0, 1]
    left = [spool.read(p) for p in spool.records()]
    assert left == [delivery(1).without_message(), delivery(2)]


def test_a_refused_record_does_not_hold_back_the_others(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    for n in range(3):
        spool.put(delivery(n))
    sent = []

    def send(d: Delivery) -> None:
        if json.loads(d.message)["n"] == 0:
            raise DeliveryFailed(d, "AccessDenied", transient=False)
        sent.append(d)

    assert spool.drain(send) == (2, 1)
    assert sent == [delivery(1), delivery(2)]
    assert [spool.read(p) for p in spool.records()] == [delivery(0)]


def test_a_full_spool_refuses_instead_of_growing(tmp_path):
    one = len(json.dumps(delivery(0).to_record(), separators=(",", ":"))) + 1
    spool = Spool(tmp_path, max_bytes=one * 2)
    assert spool.put(delivery(0)) and spool.put(delivery(1))
    assert not spool.put(delivery(2))
    assert len(spool.records()) == 2


def test_an_unwritable_spool_refuses_without_raising(tmp_path, caplog):
    # Given a spool directory that cannot be created (a file is in the way; true even for root)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    # When a delivery is spooled; Then put says no, logs why, and raises nothing
    assert not Spool(blocker / "spool", max_bytes=1 << 20).put(delivery(0))
    assert "cannot write to spool" in caplog.text


def test_an_unreadable_record_is_kept_aside_and_logged_whole(tmp_path, caplog):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    spool.put(delivery(0))
    (tmp_path / "sdc-00000000T000000000000Z-1-deadbeef.jsonl").write_text('{"half a rec')
    sent = []
    assert spool.drain(sent.append) == (1, 0)
    assert sent == [delivery(0)]
    bad = list(tmp_path.glob("*.bad"))
    assert len(bad) == 1 and bad[0].read_text() == '{"half a rec'
    assert '{"half a rec' in caplog.text


def test_a_record_claimed_by_a_dead_drainer_is_reclaimed(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    spool.put(delivery(0))
    (path,) = spool.records()
    stale = int(time.time() - STALE_CLAIM_SECONDS - 5)
    path.rename(path.with_name(f"{path.name}.{stale}{CLAIMED}"))
    fresh_claim = tmp_path / f"sdc-x.jsonl.{int(time.time())}{CLAIMED}"
    fresh_claim.write_text("{}")
    sent = []
    assert spool.drain(sent.append) == (1, 0)
    assert sent == [delivery(0)]
    assert fresh_claim.exists()  # a live drainer's claim is left alone


def test_two_drainers_never_send_the_same_record(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 24)
    for n in range(200):
        spool.put(delivery(n))
    sent: list[int] = []
    lock = threading.Lock()

    def send(d: Delivery) -> None:
        with lock:
            sent.append(json.loads(d.message)["n"])

    threads = [
        threading.Thread(target=Spool(tmp_path, 1 << 24).drain, args=(send,)) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(sent) == list(range(200))
