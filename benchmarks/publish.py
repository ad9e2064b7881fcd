"""Does publishing slow the training step? Step times with each kind of CloudWatch endpoint.

    python benchmarks/publish.py [--steps 400]

A small CPU step loop (forward, backward, optimizer) publishes like the guard does: the rank map
once, liveness after every step, an alarm every 100 steps. It runs with the NullPublisher (the
baseline) and with a CloudWatchPublisher whose endpoint is a moto server (reachable), a closed
loopback port (refused at once) and a socket that never answers (each call waits out the read
timeout). Printed per case: median and p99 step time, the slowest publish call, and the time
the exit-path flush took. No AWS account is used.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from results import Recorder

from sdc_agent.alarm import Alarm, RankInfo
from sdc_agent.publish import CloudWatchPublisher, RetryPolicy
from sdc_agent.publisher import NullPublisher

RANKS = {
    r: RankInfo(r, f"hyperpod-i-{r // 8:017x}", f"i-{r // 8:017x}", f"GPU-{r}", r % 8)
    for r in range(64)
}


def step_loop(publisher: Any, steps: int) -> tuple[list[float], float]:
    """(step seconds, slowest publish call in seconds)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 256)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)
    step_times, slowest = [], 0.0
    publisher.publish_rank_map(RANKS)
    for step in range(steps):
        started = time.perf_counter()
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        before = time.perf_counter()
        publisher.publish_liveness(step, 1, 0)
        if step % 100 == 99:
            alarm = Alarm(
                step=step, check="compute", nonfinite=[3], suspects=[3], ranks={"3": RANKS[3]}
            )
            publisher.publish_alarm(alarm)
        slowest = max(slowest, time.perf_counter() - before)
        step_times.append(time.perf_counter() - started)
    return step_times, slowest


@contextmanager
def endpoint(kind: str) -> Iterator[str | None]:
    """The AWS endpoint URL for one case (None: the NullPublisher baseline)."""
    if kind == "null":
        yield None
    elif kind == "moto":
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()
    elif kind == "closed":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    else:
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen(128)
            yield f"http://127.0.0.1:{server.getsockname()[1]}"


def run_case(kind: str, steps: int) -> dict[str, float]:
    """Measure one case."""
    with endpoint(kind) as url, tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as spool:
        if url is None:
            publisher: Any = NullPublisher()
        else:
            os.environ["AWS_ENDPOINT_URL"] = url
            publisher = CloudWatchPublisher(
                cluster_name="bench",
                job_name=f"bench-{kind}",
                spool_dir=spool,
                read_timeout=0.5,
                connect_timeout=0.5,
                retry=RetryPolicy(attempts=3, base_delay=0.1, max_delay=0.5),
            )
        step_loop(publisher, 20)  # warm-up (allocator, first backward)
        times, slowest = step_loop(publisher, steps)
        flush_started = time.perf_counter()
        delivered = publisher.flush(30)
        flush = time.perf_counter() - flush_started
        if hasattr(publisher, "close"):
            publisher.close(1)
    times.sort()
    return {
        "median_ms": statistics.median(times) * 1e3,
        "p99_ms": times[int(0.99 * (len(times) - 1))] * 1e3,
        "slowest_publish_ms": slowest * 1e3,
        "flush_s": flush,
        "delivered": float(delivered),
    }


def main(argv: list[str] | None = None) -> None:
    """Run every case and print a table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=400, help="measured steps per case")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    recorder = Recorder(__file__, argv)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    torch.set_num_threads(1)
    # The unreachable cases log every spooled alarm; the table is what this prints.
    logging.getLogger("sdc_agent").setLevel(logging.CRITICAL)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto server's access log
    print(
        f"{'endpoint':<10}{'median ms':>11}{'p99 ms':>9}{'max publish ms':>16}{'flush s':>9}  delivered"
    )
    cases = {}
    for kind in ("null", "moto", "closed", "silent"):
        r = cases[kind] = run_case(kind, args.steps)
        print(
            f"{kind:<10}{r['median_ms']:>11.3f}{r['p99_ms']:>9.3f}{r['slowest_publish_ms']:>16.3f}"
            f"{r['flush_s']:>9.2f}  {bool(r['delivered'])}"
        )
    if args.json:
        recorder.write(args.json, {"args": vars(args), "cases": cases})


if __name__ == "__main__":
    main()
