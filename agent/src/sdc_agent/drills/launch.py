"""The launcher of multi-process drills: ``world`` CPU processes (gloo), one simulated node per
``ranks_per_node`` of them, each with its own NODE_NAME (``hyperpod-i-...``).

:func:`launch` runs a list of jobs (importable functions, ``"package.module:function"``) in one
process group on every rank and returns each job's per-rank result. The drill CLI
(``python -m sdc_agent.drill``) runs :func:`sdc_agent.drills.job.train_drill` with it; the
project's multi-process tests and benchmarks run their own jobs with it.
"""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

Job = tuple[str, dict[str, Any]]
"""("package.module:function", keyword arguments): the function runs on every rank."""


def node_name(node: int) -> str:
    """A HyperPod-style node name for simulated node ``node``."""
    return f"hyperpod-i-{node:017x}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _resolve(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _worker(
    rank: int,
    world: int,
    port: int,
    ranks_per_node: int,
    jobs: list[Job],
    out: str,
    timeout_s: float,
    node: str,
    environment: dict[str, str] | None,
) -> None:
    if environment is not None:
        # A forkserver child inherits the server's environment, as it was when the server
        # started: put back the launcher's, as of this launch.
        os.environ.clear()
        os.environ.update(environment)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank % ranks_per_node),
        NODE_NAME=node,
        # A PyTorchJob names its pods <job>-worker-<n>; the publisher reads the job from it.
        POD_NAME=f"{os.environ.get('SDC_JOB_NAME', 'sdc-drill')}-worker-{rank}",
    )
    # Bitwise replays need the same intra-op thread count on every rank: a different count
    # changes how the CPU kernels split their sums.
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s)
    )
    results = []
    for path, kwargs in jobs:
        try:
            results.append(_resolve(path)(**kwargs))
        except Exception as err:  # reported to the parent, which fails the run
            results.append(
                {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()}
            )
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    # gloo's destructors can deadlock at interpreter exit: leave at once.
    os._exit(0)


def launch(
    jobs: list[Job],
    *,
    world: int = 6,
    ranks_per_node: int = 2,
    timeout_s: float = 240.0,
    node_names: Sequence[str] | None = None,
    start_method: str = "spawn",
) -> list[list[dict[str, Any]]]:
    """Run ``jobs`` on ``world`` CPU processes (gloo); returns results[job][rank].

    Every process gets NODE_NAME of node ``rank // ranks_per_node``: :func:`node_name` of it,
    or ``node_names[node]`` (a job restarted on a replaced node runs on a new name). Raises
    TimeoutError (after killing the processes) when the run takes longer than ``timeout_s``, and
    RuntimeError when a process dies without a result.

    ``start_method``: ``spawn`` starts each process from scratch (each imports torch: seconds
    of CPU apiece); ``forkserver`` forks them from a server that imported torch and this
    package once, which makes a second launch in the same program almost free (the demo's
    restart). Each process gets the launcher's environment as of this call either way.
    """
    if start_method not in ("spawn", "forkserver"):
        raise ValueError(f"start_method: 'spawn' or 'forkserver', got {start_method!r}")
    nodes = -(-world // ranks_per_node)
    names = list(node_names) if node_names is not None else [node_name(n) for n in range(nodes)]
    if len(names) != nodes:
        raise ValueError(
            f"node_names: {world} ranks of {ranks_per_node} per node need {nodes} names, "
            f"got {len(names)}"
        )
    ctx = (
        multiprocessing.get_context("spawn")
        if start_method == "spawn"
        else multiprocessing.get_context("forkserver")
    )
    environment = None
    if start_method == "forkserver":
        # Only takes effect when the server starts (the first forkserver launch).
        ctx.set_forkserver_preload(["torch", "torch.distributed", __name__])
        environment = dict(os.environ)
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="sdc-drill-") as out:
        procs = [
            ctx.Process(
                target=_worker,
                args=(
                    rank,
                    world,
                    port,
                    ranks_per_node,
                    jobs,
                    out,
                    timeout_s,
                    names[rank // ranks_per_node],
                    environment,
                ),
                daemon=True,
            )
            for rank in range(world)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        alive = [p for p in procs if p.is_alive()]
        for p in alive:
            p.kill()
        if alive:
            raise TimeoutError(f"drill did not finish within {timeout_s:.0f} s (ranks hung)")
        per_rank = []
        for rank in range(world):
            path = Path(out, f"rank{rank}.json")
            if not path.exists():
                raise RuntimeError(
                    f"rank {rank} exited with code {procs[rank].exitcode} and no result"
                )
            per_rank.append(json.loads(path.read_text()))
    return [[per_rank[r][j] for r in range(world)] for j in range(len(jobs))]
