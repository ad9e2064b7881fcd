"""Fire drills on the CPU: a real multi-process DDP job (gloo) with a fault on one "GPU".

``python -m sdc_agent.drill`` starts 3 simulated nodes x 2 ranks on this machine, injects a
persistent fault into one rank's forward pass, and prints what the guard caught;
``--parallel fsdp|hsdp`` runs the same drill on a model sharded with FSDP2 (full sharding, or
HSDP with replicas across nodes and shards within a node; :mod:`sdc_agent.drill_fsdp`). The same
launcher runs the project's multi-process tests: :func:`launch` starts ``world`` processes, each
with its own NODE_NAME (``hyperpod-i-...``), and runs a list of jobs (importable functions) in
one process group, returning each job's per-rank result.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import os
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from . import drill_checkpoints

Job = tuple[str, dict[str, Any]]
"""("package.module:function", keyword arguments): the function runs on every rank."""


def node_name(node: int) -> str:
    """A HyperPod-style node name for simulated node ``node``."""
    return f"hyperpod-i-{node:017x}"


# ---------------------------------------------------------------------------- the drill job
class DrillModel(nn.Module):
    """A small MLP with the parts that make replays hard: BatchNorm buffers and dropout."""

    def __init__(self, d_in: int = 16, hidden: int = 32, classes: int = 4) -> None:
        """Layers: net.0 Linear, net.1 BatchNorm1d, net.2 GELU, net.3 Dropout, net.4 Linear,
        net.5 GELU, net.6 Linear."""
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_in, hidden),
            nn.BatchNorm1d(hidden),
            nn.GELU(),
            nn.Dropout(0.1),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits."""
        return self.net(x)


def make_batch(step: int, rank: int, *, seed: int = 0, batch: int = 8, d_in: int = 16) -> tuple:
    """The micro-batch ``rank`` trains on at ``step``: a pure function, so any rank can rebuild it."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    return torch.randn(batch, d_in, generator=g), torch.randint(0, 4, (batch,), generator=g)


def make_step_batch(step: int, rank: int, *, seed: int = 0, grad_accum: int = 1) -> Any:
    """What ``rank`` trains on at ``step``: :func:`make_batch`'s micro-batch, or with
    ``grad_accum`` > 1 a list of that many distinct micro-batches (what ``rebuild_batch``
    returns too)."""
    if grad_accum == 1:
        return make_batch(step, rank, seed=seed)
    return [make_batch(step * grad_accum + i, rank, seed=seed) for i in range(grad_accum)]


def make_loss(autocast_bf16: bool = False) -> Callable[[nn.Module, Any], torch.Tensor]:
    """compute_loss(model, batch) for the drill model (optionally under CPU bf16 autocast)."""

    def compute_loss(model: nn.Module, batch: tuple) -> torch.Tensor:
        x, y = batch
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast_bf16):
            logits = model(x)
        return F.cross_entropy(logits.float(), y)

    return compute_loss


def build(
    schedule: dict[str, Any],
    *,
    seed: int = 0,
    autocast_bf16: bool = False,
    publisher: Any = None,
    state: dict[str, Any] | None = None,
    alarm_dir: str | None = None,
) -> tuple[Any, Any, Any]:
    """(ddp_model, optimizer, guard) for the drill model, identical initial weights on all ranks.

    ``state``: a checkpoint (``{"model", "optimizer", ...}``) to load before the guard is built,
    the same on every rank; ``alarm_dir``: the guard's alarm log (``Guard(alarm_dir=...)``).
    """
    torch.manual_seed(seed)
    module = DrillModel()
    if state is not None:
        module.load_state_dict(state["model"])
    ddp = nn.parallel.DistributedDataParallel(module)
    optimizer, guard = guarded_sgd(
        ddp,
        schedule,
        seed=seed,
        autocast_bf16=autocast_bf16,
        publisher=publisher,
        optimizer_state=None if state is None else state["optimizer"],
        alarm_dir=alarm_dir,
    )
    return ddp, optimizer, guard


def guarded_sgd(
    model: nn.Module,
    schedule: dict[str, Any],
    *,
    seed: int,
    autocast_bf16: bool,
    publisher: Any,
    scaler: Any = None,
    optimizer_state: dict[str, Any] | None = None,
    alarm_dir: str | None = None,
) -> tuple[torch.optim.Optimizer, Any]:
    """(optimizer, guard) for a wrapped drill model (DDP or FSDP2): SGD with momentum and a
    guard that rebuilds any rank's batch from (step, rank, ``seed``).

    ``optimizer_state``: a checkpoint's optimizer state, loaded before the guard is built;
    ``alarm_dir``: where the guard records its alarms and checks a resume (None: nowhere).
    """
    import sdc_agent as sdc

    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state)
    guard = sdc.Guard(
        model,
        optimizer,
        compute_loss=make_loss(autocast_bf16),
        rebuild_batch=lambda step, rank: make_step_batch(
            step, rank, seed=seed, grad_accum=schedule.get("grad_accum", 1)
        ),
        schedule=sdc.Schedule(**schedule),
        publisher=publisher,
        scaler=scaler,
        alarm_dir=alarm_dir,
    )
    return optimizer, guard


def make_fault(spec: dict[str, Any]) -> Any:
    """A fault injector from ``{"kind": "ScaleOutputElement", ...keyword arguments}``."""
    from . import faults

    spec = dict(spec)
    kind = spec.pop("kind")
    if kind not in faults.__all__:
        raise ValueError(f"unknown fault kind {kind!r}; choose from {sorted(faults.__all__)}")
    return getattr(faults, kind)(**spec)


def train_drill(
    *,
    steps: int,
    schedule: dict[str, Any],
    faults: Sequence[dict[str, Any]] = (),
    seed: int = 0,
    autocast_bf16: bool = False,
    start_step: int = 0,
    publisher: dict[str, Any] | None = None,
    parallel: str = "ddp",
    shards: int = 2,
    activation_checkpointing: bool = False,
    run_dir: str | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Train the drill model for ``steps`` steps under the guard; report what happened here.

    ``publisher``: keyword arguments of ``sdc_agent.publish.CloudWatchPublisher`` to publish
    to CloudWatch (or an endpoint such as the local demo's); None publishes nothing.
    ``parallel``: ``ddp`` (the default), or ``fsdp`` / ``hsdp`` (FSDP2, ``shards`` ranks per
    replica under HSDP; ``activation_checkpointing`` applies to the sharded model's blocks).
    ``run_dir`` (DDP only): rank 0 saves each due checkpoint there with the guard's tags
    (:mod:`sdc_agent.drill_checkpoints`), and the guard records its alarms there
    (``alarm_dir``). ``resume``: the restart after a stop: load the checkpoint of ``run_dir``
    that ``sdc.clean_resume_step`` chooses and start after it (``start_step`` must then be 0;
    no clean checkpoint: the initial weights from step 0); the guard refuses a checkpoint inside
    a recorded alarm's window and verifies the loaded weights before the first step. The
    decision is reported under ``"resume"``.
    """
    if run_dir is not None and parallel != "ddp":
        raise ValueError(
            f"run_dir: the drill saves checkpoints with parallel='ddp' only, not {parallel!r}"
        )
    if resume and (run_dir is None or start_step != 0):
        raise ValueError("resume: needs run_dir, and chooses start_step itself (leave it 0)")
    sink = None
    if publisher is not None:
        from .publish import CloudWatchPublisher

        sink = CloudWatchPublisher(**publisher)
    decision: dict[str, Any] | None = None
    state = None
    if resume:
        decision = drill_checkpoints.choose_resume(run_dir)
        state = decision.pop("state")
        start_step = 0 if decision["step"] is None else decision["step"] + 1
        decision["loaded_tags"] = None if state is None else state["sdc"]
    if parallel == "ddp":
        _, optimizer, guard = build(
            schedule,
            seed=seed,
            autocast_bf16=autocast_bf16,
            publisher=sink,
            state=state,
            alarm_dir=run_dir,
        )
    else:
        from .drill_fsdp import build_sharded

        _, optimizer, guard = build_sharded(
            schedule,
            parallel=parallel,
            shards=shards,
            seed=seed,
            autocast_bf16=autocast_bf16,
            activation_checkpointing=activation_checkpointing,
            publisher=sink,
        )
    injected = [make_fault(f).attach(guard) for f in faults]
    updates = []
    # The weight check the guard ran before the first step (Schedule.check_on_start), as it
    # stood at the first update: no periodic check has run by then.
    on_start: list[int | None] = []

    def after_update(*_: Any) -> None:
        if not updates:
            on_start.append(guard.last_weight_check_pass)
        updates.append(guard.current_step)

    optimizer.register_step_post_hook(after_update)
    saves: list[list[Any]] = []

    def save(step: int, tags: dict[str, Any]) -> None:
        saves.append([step, tags])
        if run_dir is not None and dist.get_rank() == 0:
            drill_checkpoints.save_checkpoint(run_dir, step, guard.module, optimizer, tags)

    batches = (
        make_step_batch(s, dist.get_rank(), seed=seed, grad_accum=guard.schedule.grad_accum)
        for s in range(start_step, start_step + steps)
    )
    alarm = guard.train(batches, save_checkpoint=save, start_step=start_step)
    delivered = guard.flush(30.0) if sink is not None else True
    if decision is not None:
        decision["start_step"] = start_step
        decision["weights_verified_on_start"] = bool(on_start) and on_start[0] == start_step
    return {
        "delivered": delivered,
        "rank": dist.get_rank(),
        "alarm": alarm.to_dict() if alarm else None,
        "updates": updates,
        "saves": saves,
        "fired": sum(f.fired for f in injected),
        "last_audit_pass": guard.last_audit_pass,
        "last_weight_check_pass": guard.last_weight_check_pass,
        "resume": decision,
    }


# ---------------------------------------------------------------------------- the launcher
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
    ctx = multiprocessing.get_context(start_method)
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


# ---------------------------------------------------------------------------- the CLI
def _describe(result: dict[str, Any]) -> Iterator[str]:
    alarm = result["alarm"]
    if alarm is None:
        yield f"no alarm: {len(result['updates'])} updates applied, checks passed"
        return
    yield f"ALARM at step {alarm['step']}: check '{alarm['check']}' ({alarm['metric']['name']})"
    yield f"  suspects: {alarm['suspects']}   window: {alarm['suspect_window']}"
    if alarm["mismatched_pairs"]:
        yield f"  mismatched (target, replayer) pairs: {alarm['mismatched_pairs']}"
    if alarm["culprits"]:
        yield f"  culprits (wrong as target and as replayer): {alarm['culprits']}"
    for v in alarm["verdicts"]:
        yield f"  confirmation of {v['pair']} by rank {v['third']}: {v['kind']} -> {v['suspect']}"
    for rank, info in alarm["ranks"].items():
        yield f"  rank {rank}: node {info['node_name']} instance {info['instance_id']} gpu {info['gpu_uuid']}"
    applied = (
        "was applied: its weights were checked after it"
        if alarm["check"] == "weights"
        else "was not applied"
    )
    yield f"  updates applied: {len(result['updates'])} (the failing step {applied})"


def main(argv: list[str] | None = None) -> int:
    """Run one drill and print what the guard caught; exit 0 when the outcome is as expected."""
    parser = argparse.ArgumentParser(
        prog="python -m sdc_agent.drill", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--fault",
        choices=["scale", "nan", "weight", "none"],
        default="scale",
        help="what goes wrong on the faulty rank (none: a clean run, expect no alarm)",
    )
    parser.add_argument("--rank", type=int, default=3, help="the faulty global rank")
    parser.add_argument("--step", type=int, default=7, help="the step the fault starts at")
    parser.add_argument("--steps", type=int, default=20, help="training steps")
    parser.add_argument("--nodes", type=int, default=3, help="simulated nodes (>= 3)")
    parser.add_argument("--ranks-per-node", type=int, default=2, help="processes per node")
    parser.add_argument(
        "--parallel",
        choices=["ddp", "fsdp", "hsdp"],
        default="ddp",
        help="how the model is data-parallel: DDP, FSDP2 full sharding, or HSDP (replicas "
        "across nodes, shards within a node)",
    )
    args = parser.parse_args(argv)
    world = args.nodes * args.ranks_per_node
    sharded = args.parallel != "ddp"
    # The sharded drill model names its layers differently (sdc_agent.drill_fsdp).
    layer, weight = (
        ("blocks.1.norm", "blocks.0.fc.weight") if sharded else ("net.4", "net.0.weight")
    )
    faults = {
        "scale": [
            {
                "kind": "ScaleOutputElement",
                "layer": layer,
                "factor": 1000.0,
                "rank": args.rank,
                "step": args.step,
            }
        ],
        "nan": [
            {
                "kind": "NaNOutputElement",
                "layer": layer,
                "rank": args.rank,
                "step": args.step,
                "persistent": False,
            }
        ],
        "weight": [
            {
                "kind": "FlipWeightBit",
                "param": weight,
                "bit": 27,
                "rank": args.rank,
                "step": args.step,
            }
        ],
        "none": [],
    }[args.fault]
    schedule = {
        "audit_every": 5,
        "check_every": 5,
        "ckpt_every": 10,
        "peer_offset": args.ranks_per_node,
    }
    print(
        f"sdc drill: {args.parallel}, {args.nodes} nodes x {args.ranks_per_node} ranks "
        f"(gloo, CPU), fault: "
        f"{args.fault} on rank {args.rank} from step {args.step}"
    )
    started = time.monotonic()
    results = launch(
        [
            (
                "sdc_agent.drill:train_drill",
                {
                    "steps": args.steps,
                    "schedule": schedule,
                    "faults": faults,
                    "parallel": args.parallel,
                    "shards": args.ranks_per_node,
                },
            )
        ],
        world=world,
        ranks_per_node=args.ranks_per_node,
    )[0]
    errors = [r for r in results if "error" in r]
    if errors:
        print(errors[0]["trace"], file=sys.stderr)
        return 1
    for line in _describe(results[0]):
        print(line)
    named = (results[0]["alarm"] or {}).get("suspects") or []
    # Full sharding keeps one copy of each weight shard and every rank computes with it, so a
    # flipped stored weight is seen by no check (the guard logged so at start).
    unseen = args.fault == "none" or (args.fault == "weight" and args.parallel == "fsdp")
    if unseen and args.fault == "weight":
        print("  (FSDP2 full sharding: no weight redundancy, so check 3 is off; expected no alarm)")
    print(f"({time.monotonic() - started:.1f} s)")
    expected_ok = results[0]["alarm"] is None if unseen else named == [args.rank]
    return 0 if expected_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
