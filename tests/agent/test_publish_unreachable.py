"""AWS out of reach: training never waits, the alarm is spooled, and a later publisher sends it.

Two ways of being unreachable: a closed loopback port (connection refused at once) and a
loopback server that accepts connections and answers none until the test releases it. That a
publish call never waits on the network is shown by events, not by timing: the calls return
while the sender is provably held inside a network call that only the test can end.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
import torch
from moto import mock_aws

from sdc_agent.alarm import Alarm
from sdc_agent.publish import CloudWatchPublisher, PublishSettings, RetryPolicy, Spool
from tests.agent.test_publish_cloudwatch import (  # noqa: F401  (aws_env is an autouse fixture)
    NODE1,
    RANKS,
    REGION,
    aws_env,
    metric_sum,
    stream_messages,
)

FAST_RETRY = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05)


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


class HoldingEndpoint:
    """A loopback HTTP endpoint that accepts connections and answers none until :meth:`release`;
    then it closes the held connections and every later one at once (AWS still unreachable)."""

    def __init__(self) -> None:
        self._server = socket.socket()
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self._server.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self.holding = threading.Event()
        """Set once a client is connected and waiting for an answer that has not come."""
        self.released = threading.Event()
        self._held: list[socket.socket] = []
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._server.accept()
            except (TimeoutError, OSError):
                continue
            if self.released.is_set():
                conn.close()
            else:
                self._held.append(conn)
                self.holding.set()

    def release(self) -> None:
        """End every held request (the connection closes) and refuse the later ones."""
        self.released.set()
        for conn in self._held:
            conn.close()

    def close(self) -> None:
        self.release()
        self._stopped.set()
        self._thread.join(5)
        self._server.close()


@pytest.fixture
def holding_endpoint() -> Iterator[HoldingEndpoint]:
    endpoint = HoldingEndpoint()
    yield endpoint
    endpoint.close()


def run_to_end(work: Any, seconds: float = 120.0) -> Any:
    """Run ``work()`` in a thread; fail (instead of hanging) when it has not returned after
    ``seconds`` (a generous bound: only a call that waits for the test's release can reach it)."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(work()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert result, f"still running after {seconds} s: a publish call waited on the network"
    return result[0]


def nonfinite_alarm(step: int = 7) -> Alarm:
    return Alarm(
        step=step,
        check="compute",
        nonfinite=[3],
        suspects=[3],
        suspect_window=(step - 1, step),
        ranks={"3": RANKS[3]},
    )


def train_steps(
    publisher: CloudWatchPublisher,
    steps: int,
    alarm_at: int,
    after_first_step: threading.Event | None = None,
) -> int:
    """A small step loop that publishes like the guard does; returns the steps it ran.

    ``after_first_step``: wait for this event after step 0's publishes (generous deadline), so
    that every later publish call runs while the sender is in whatever state the event marks."""
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    publisher_calls = [lambda s: publisher.publish_rank_map(RANKS)]
    for step in range(steps):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        calls = [*publisher_calls, lambda s: publisher.publish_liveness(s, 1, 0)]
        if step == alarm_at:
            calls.append(lambda s: publisher.publish_alarm(nonfinite_alarm(s)))
        for call in calls:
            call(step)
        publisher_calls = []
        if step == 0 and after_first_step is not None:
            assert after_first_step.wait(60), "the sender never reached the endpoint"
    return steps


def spooled(spool_dir: Any) -> list[dict[str, Any]]:
    """The records in job ml/llama's spool now (one a drainer claims meanwhile is not counted)."""
    spool = Spool.for_job(
        PublishSettings(cluster_name="ml", job_name="llama", spool_dir=str(spool_dir))
    )
    records = []
    for path in spool.records():
        try:
            records.append(spool.read(path).to_record())
        except FileNotFoundError:
            continue
    return records


@pytest.mark.parametrize("endpoint_kind", ["closed_port", "holding"])
def test_unreachable_aws_never_slows_steps_and_the_alarm_is_spooled_then_sent_later(
    endpoint_kind, tmp_path, monkeypatch, request
):
    # Given AWS_ENDPOINT_URL pointing at a dead endpoint: a closed port, or one that holds every
    # request unanswered (a read timeout far longer than the test: only its release ends one)
    holding = request.getfixturevalue("holding_endpoint") if endpoint_kind == "holding" else None
    monkeypatch.setenv("AWS_ENDPOINT_URL", holding.url if holding else closed_port())
    publisher = CloudWatchPublisher(
        cluster_name="ml",
        job_name="llama",
        spool_dir=str(tmp_path),
        connect_timeout=0.3,
        read_timeout=300,
        retry=FAST_RETRY,
    )
    # When 30 training steps publish the rank map, liveness and (at step 7) an alarm, steps 1-29
    # (the alarm's included) while the sender is held inside a call to the endpoint
    started = time.perf_counter()
    ran = run_to_end(
        lambda: train_steps(
            publisher, steps=30, alarm_at=7, after_first_step=holding.holding if holding else None
        )
    )
    loop_seconds = time.perf_counter() - started
    # Then every publish call returned without waiting on the network: the loop ended while
    # the endpoint still held the sender's request
    assert ran == 30
    if holding is not None:
        assert holding.holding.is_set() and not holding.released.is_set()
        holding.release()  # AWS stays unreachable: every later connection is closed at once
    # And the exit-path flush reports that not everything got through
    assert publisher.flush(10) is False
    flush_seconds = time.perf_counter() - started - loop_seconds
    # And the rank map and the alarm are in the spool, whole
    records = spooled(tmp_path)
    kinds = sorted(r["kind"] for r in records)
    assert kinds == ["alarm", "rankmap"]
    (alarm_record,) = [r for r in records if r["kind"] == "alarm"]
    report = json.loads(alarm_record["message"])
    assert (report["step"], report["nonfinite"], report["cluster"]) == (7, [3], "ml")
    assert alarm_record["metrics"][0]["MetricName"] == "sdc_nonfinite_grad"
    # (closing waits for its sender thread, so no attempt of it overlaps the next publisher)
    publisher.close(5)
    print(f"{endpoint_kind}: loop {loop_seconds:.3f}s, flush {flush_seconds:.3f}s")

    # When a later publisher of the job starts (its restarted pod, AWS reachable again)
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    with mock_aws():
        cloudwatch = boto3.client("cloudwatch", region_name=REGION)
        logs = boto3.client("logs", region_name=REGION)
        later = CloudWatchPublisher(
            cluster_name="ml",
            job_name="llama",
            spool_dir=str(tmp_path),
            cloudwatch_client=cloudwatch,
            logs_client=logs,
        )
        # Then it sends the spool without being called (as on a rank other than DP rank 0)
        deadline = time.monotonic() + 10
        while spooled(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert later.flush(10) is True
        # And the report arrives intact in the original job's stream, with its metrics
        messages = stream_messages(logs, "/sdc/ml", "llama")
        assert [m["schema"] for m in messages].count("sdc.alarm/v1") == 1
        (delivered,) = [m for m in messages if m["schema"] == "sdc.alarm/v1"]
        assert delivered == report
        node = {"ClusterName": "ml", "JobName": "llama", "NodeName": NODE1}
        assert metric_sum(cloudwatch, "sdc_nonfinite_grad", {"ClusterName": "ml"}) == (1.0, 1.0)
        assert metric_sum(cloudwatch, "sdc_nonfinite_grad", node) == (1.0, 1.0)
        # And the spool is empty
        assert spooled(tmp_path) == []
        later.close(1)


def test_a_full_queue_spools_from_the_caller_and_loses_nothing(
    tmp_path, monkeypatch, holding_endpoint
):
    # Given a queue of one and a sender held on an endpoint that answers nothing
    monkeypatch.setenv("AWS_ENDPOINT_URL", holding_endpoint.url)
    publisher = CloudWatchPublisher(
        cluster_name="ml",
        job_name="llama",
        spool_dir=str(tmp_path),
        queue_size=1,
        read_timeout=300,
        retry=RetryPolicy(attempts=1),
    )
    publisher.publish_alarm(nonfinite_alarm(1))
    assert holding_endpoint.holding.wait(60), "the sender never reached the endpoint"

    # When four more alarms are published at once (the queue is full: the sender is held)
    def publish_rest() -> bool:
        for step in range(2, 6):
            publisher.publish_alarm(nonfinite_alarm(step))
        return True

    # Then the calls return while the sender is still held (they spool from the caller)
    assert run_to_end(publish_rest)
    assert not holding_endpoint.released.is_set()
    # And the exit path gives up waiting after 0.1 s
    assert publisher.flush(0.1) is False
    holding_endpoint.release()
    publisher.close(10)
    # Then every alarm is in the spool (one may be there twice: never zero times)
    steps = {json.loads(r["message"])["step"] for r in spooled(tmp_path)}
    assert steps == {1, 2, 3, 4, 5}


def test_when_the_spool_cannot_take_it_the_whole_report_is_logged(tmp_path, monkeypatch, caplog):
    # Given an unreachable endpoint and a spool directory that cannot exist
    monkeypatch.setenv("AWS_ENDPOINT_URL", closed_port())
    blocker = tmp_path / "file"
    blocker.write_text("")
    publisher = CloudWatchPublisher(
        cluster_name="ml", job_name="llama", spool_dir=str(blocker / "spool"), retry=FAST_RETRY
    )
    alarm = nonfinite_alarm(42)
    # When the alarm cannot be sent
    publisher.publish_alarm(alarm)
    assert publisher.flush(10) is False
    # Then an error log line holds the whole report, so the alarm is not lost silently
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    (line,) = [e for e in errors if "could not deliver or spool" in e]
    record = json.loads(line.split("follows: ", 1)[1])
    report = json.loads(record["message"])
    report.pop("time")
    assert report == {**alarm.to_dict(), "cluster": "ml", "job": "llama"}
    publisher.close(0.5)
