"""The work one steady-state guarded step adds over a plain DDP step, counted, not timed.

Timing the guard on a shared machine measures the neighbours as much as the guard. This script
counts instead, for one training step of the guard's always-on path (check 1 only: no audit, no
weight check, no checkpoint, so every step is such a step) and for the same step of plain DDP:

* ``aten_ops``: aten operators dispatched, on every thread (torch.profiler; the comm hook's
  ``after_reduction`` runs on gloo's thread), and ``aten_ops_main`` on the training thread alone
  (a ``TorchDispatchMode``: operators below autograd, as the kernels see them);
* ``allocations`` / ``allocated_bytes``: tensors the training thread's operators create (an output
  whose storage no input shares);
* ``python_calls`` / ``c_calls``: Python and builtin functions the training thread calls
  (``sys.setprofile``), and ``agent_calls``: those whose code is in ``sdc_agent``;
* ``host_reads``: device-to-host reads (``Tensor.item`` / ``bool(tensor)`` / ``.tolist()``) and
  ``waits`` (``Work.wait``);
* ``collectives``: each ``torch.distributed`` collective the step issues from Python, with its
  operation and payload (plain DDP's own gradient all-reduce is issued by its C++ reducer, the
  guard's by its comm hook: the same payload, listed for the guarded step only).

Every count is a property of the code, not of the machine's load: two runs print the same
numbers. The step is measured after ``--warmup`` steps (DDP rebuilds its buckets after the first;
the guard's steady state settles the previous step's flags in each step), and ``--steps`` steps
are counted to show the counts do not drift. Runs against whatever ``sdc_agent`` is importable,
so the same command measures two versions of the agent::

    PYTHONPATH=agent/src python benchmarks/step_work.py
    PYTHONPATH=/path/to/old/agent/src python benchmarks/step_work.py
    python benchmarks/step_work.py --against /path/to/old/agent/src   # both, side by side

Two processes on gloo, one per simulated node (no audit needs a third); the model and batch of
``benchmarks/overhead.py`` by default.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from results import Recorder
from torch.utils._python_dispatch import TorchDispatchMode

import sdc_agent as sdc

# --against runs this script on other agents, from before the drills moved into
# sdc_agent.drills too: sdc_agent.drill has the launcher in every version.
from sdc_agent.drill import launch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import Mlp, compute_loss, make_batch

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "barrier")
"""The torch.distributed functions counted (every one the guard issues)."""
HOST_READS = {"item", "tolist"}
"""Builtins that copy a tensor's value to the host (``bool(tensor)`` is counted as
``aten::_local_scalar_dense``, which it dispatches)."""


class _OpCounter(TorchDispatchMode):
    """Counts the operators dispatched on this thread and the tensors they allocate."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()
        self.allocations = 0
        self.allocated_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops[str(func.overloadpacket.__name__)] += 1
        inputs = {
            t.untyped_storage().data_ptr()
            for t in torch.utils._pytree.tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor)
        }
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.allocations += 1
                self.allocated_bytes += t.untyped_storage().nbytes()
        return out


class _CallCounter:
    """``sys.setprofile`` on this thread: Python and builtin calls, the agent's, host reads."""

    def __init__(self) -> None:
        self.python = 0
        self.builtin = 0
        self.agent = 0
        self.host_reads = 0
        self.waits = 0
        self.agent_functions: collections.Counter[str] = collections.Counter()
        self.by_file: collections.Counter[str] = collections.Counter()

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            self.python += 1
            code = frame.f_code
            self.by_file[_short(code.co_filename)] += 1
            if f"{os.sep}sdc_agent{os.sep}" in code.co_filename:
                self.agent += 1
                self.agent_functions[f"{Path(code.co_filename).stem}.{code.co_qualname}"] += 1
        elif event == "c_call":
            self.builtin += 1
            name = getattr(arg, "__name__", "")
            if name in HOST_READS:
                self.host_reads += 1
            elif name == "wait":
                self.waits += 1


def _short(filename: str) -> str:
    """``torch/distributed/distributed_c10d.py`` for a file in site-packages or the agent."""
    parts = Path(filename).parts
    for root in ("torch", "sdc_agent"):
        if root in parts:
            return "/".join(parts[len(parts) - parts[::-1].index(root) - 1 :])
    return Path(filename).name


@contextlib.contextmanager
def _collectives(log: list[dict[str, Any]]):
    """Record every collective issued through torch.distributed's Python API."""
    originals = {name: getattr(dist, name) for name in COLLECTIVES}

    def wrap(name: str, fn: Any) -> Any:
        def issued(*args: Any, **kwargs: Any) -> Any:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            payload = sum(t.numel() * t.element_size() for t in tensors)
            caller = sys._getframe(1).f_code
            log.append(
                {
                    "op": name,
                    "reduce": str(kwargs.get("op", "")).rsplit(".", 1)[-1] or None,
                    "bytes": payload,
                    "caller": f"{Path(caller.co_filename).stem}.{caller.co_name}",
                }
            )
            return fn(*args, **kwargs)

        return issued

    for name, fn in originals.items():
        setattr(dist, name, wrap(name, fn))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


def _count_all_threads(run_step: Any) -> dict[str, Any]:
    """Pass 1: the operators of one ``run_step()`` on every thread (torch.profiler), and the
    collectives it issues."""
    issued: list[dict[str, Any]] = []
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=cpu) as prof, _collectives(issued):
        run_step()
    # Only the outermost aten event of each call chain: a composite operator (aten::to ->
    # aten::_to_copy -> aten::copy_) is one operator call.
    top = [
        e
        for e in prof.events()
        if e.name.startswith("aten::")
        and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
    ]
    return {"aten_ops": len(top), "issued": issued}


def _count_main_ops(run_step: Any, ops: _OpCounter) -> None:
    """Pass 2: the training thread's operators below autograd, and their allocations."""
    with ops:
        run_step()


def _count_calls(run_step: Any, calls: _CallCounter) -> None:
    """Pass 3 (apart from pass 2, whose counter runs Python code of its own): calls."""
    sys.setprofile(calls)
    try:
        run_step()
    finally:
        sys.setprofile(None)


def measure(
    *, width: int, depth: int, batch: int, warmup: int, steps: int, schedule: dict[str, Any]
) -> dict[str, Any]:
    """On every rank: counts for ``steps`` steady-state steps of plain DDP and of the guard."""
    rank = dist.get_rank()
    results: dict[str, Any] = {"rank": rank, "plain": [], "guarded": []}

    def make(guarded: bool) -> Any:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(Mlp(width, depth))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        guard = None
        if guarded:
            guard = sdc.Guard(
                model,
                optimizer,
                compute_loss=compute_loss,
                rebuild_batch=lambda step, r: make_batch(step, r, batch),
                schedule=sdc.Schedule(
                    **{"ckpt_every": 0, "check_on_start": False, "peer_offset": 1, **schedule}
                ),
            )

        def step(n: int) -> None:
            micro = make_batch(n, rank, batch)
            if guard is None:
                compute_loss(model, micro).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                return
            with guard.step(n) as guarded_step:
                loss = compute_loss(model, micro)
                loss.backward()
                alarm = guarded_step.check_gradients(loss)
                if alarm is None:
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    alarm = guarded_step.after_update()
            if alarm is not None:
                raise RuntimeError(f"alarm in a fault-free run: {alarm.to_dict()}")

        return step

    for kind in ("plain", "guarded"):
        step = make(kind == "guarded")
        for n in range(1, warmup + 1):
            step(n)
        for n in range(warmup + 1, warmup + 1 + 3 * steps, 3):
            # A step cannot run twice; passes 2 and 3 count the next ones (steady state:
            # consecutive steps do the same work, which the repeated counts show).
            counted = _count_all_threads(functools.partial(step, n))
            ops, calls = _OpCounter(), _CallCounter()
            _count_main_ops(functools.partial(step, n + 1), ops)
            _count_calls(functools.partial(step, n + 2), calls)
            results[kind].append(
                {
                    **counted,
                    "aten_ops_main": sum(ops.ops.values()),
                    "ops_main": dict(ops.ops),
                    "allocations": ops.allocations,
                    "allocated_bytes": ops.allocated_bytes,
                    "python_calls": calls.python,
                    "c_calls": calls.builtin,
                    "agent_calls": calls.agent,
                    "agent_functions": dict(calls.agent_functions),
                    "calls_by_file": dict(calls.by_file),
                    "host_reads": calls.host_reads + ops.ops.get("_local_scalar_dense", 0),
                    "waits": calls.waits,
                }
            )
    results["agent"] = str(Path(sdc.__file__).parent)
    return results


SCALARS = (
    "aten_ops",
    "aten_ops_main",
    "allocations",
    "allocated_bytes",
    "python_calls",
    "c_calls",
    "agent_calls",
    "host_reads",
    "waits",
    "collectives",
    "collective_bytes",
)


def extra_work(rank0: dict[str, Any]) -> dict[str, Any]:
    """The guarded step's counts minus plain DDP's (rank 0, first counted step), and whether
    the counts were the same at every counted step."""
    plain, guarded = rank0["plain"], rank0["guarded"]

    def scalars(row: dict[str, Any]) -> dict[str, int]:
        return {
            **{k: row[k] for k in SCALARS if k in row},
            "collectives": len(row["issued"]),
            "collective_bytes": sum(c["bytes"] for c in row["issued"]),
        }

    def unsteady(rows: list[dict[str, Any]]) -> dict[str, list[int]]:
        """The counts that differed between counted steps (each step's value)."""
        values = [scalars(r) for r in rows]
        return {k: [v[k] for v in values] for k in values[0] if len({v[k] for v in values}) > 1}

    extra = {k: scalars(guarded[0])[k] - scalars(plain[0])[k] for k in SCALARS}
    ops_extra = collections.Counter(guarded[0]["ops_main"])
    ops_extra.subtract(plain[0]["ops_main"])
    calls_extra = collections.Counter(guarded[0]["calls_by_file"])
    calls_extra.subtract(plain[0]["calls_by_file"])
    return {
        "agent": rank0["agent"],
        "extra_calls_by_file": {k: v for k, v in calls_extra.most_common() if v},
        "plain": scalars(plain[0]),
        "guarded": scalars(guarded[0]),
        "extra": extra,
        "extra_ops_main": {k: v for k, v in sorted(ops_extra.items()) if v},
        "collectives": guarded[0]["issued"],
        "agent_functions": guarded[0]["agent_functions"],
        "unsteady": {"plain": unsteady(plain), "guarded": unsteady(guarded)},
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Launch the two processes and summarise rank 0."""
    kwargs = {
        "width": args.width,
        "depth": args.depth,
        "batch": args.batch,
        "warmup": args.warmup,
        "steps": args.steps,
        "schedule": {"audit_every": 0, "check_every": 0},
    }
    [per_rank] = launch(
        [(f"{Path(__file__).stem}:measure", kwargs)],
        world=2,
        ranks_per_node=1,
        timeout_s=args.timeout,
    )
    errors = [r for r in per_rank if "error" in r]
    if errors:
        raise RuntimeError(errors[0]["trace"])
    return extra_work(next(r for r in per_rank if r["rank"] == 0))


def _print(summaries: list[dict[str, Any]]) -> None:
    names = [Path(s["agent"]).parent.parent.parent.name or s["agent"] for s in summaries]
    print("extra work of one steady-state guarded step (check 1) over plain DDP, rank 0 of 2:")
    print(f"{'':18}" + "".join(f"{n[-22:]:>24}" for n in names))
    for key in SCALARS:
        print(f"{key:18}" + "".join(f"{s['extra'][key]:>24,}" for s in summaries))
    for name, s in zip(names, summaries, strict=True):
        print(f"\n{name} ({s['agent']})")
        print(f"  counts that differed between counted steps: {s['unsteady']}")
        print(f"  plain DDP step: {s['plain']}")
        print(f"  guarded step:   {s['guarded']}")
        print(f"  extra aten ops on the training thread: {s['extra_ops_main']}")
        print(f"  extra Python calls by file: {s['extra_calls_by_file']}")
        for c in s["collectives"]:
            reduce = f" {c['reduce']}" if c["reduce"] else ""
            print(f"  collective: {c['op']}{reduce}, {c['bytes']:,} bytes, from {c['caller']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=1024, help="MLP width (overhead.py's)")
    parser.add_argument("--depth", type=int, default=4, help="hidden layers (overhead.py's)")
    parser.add_argument("--batch", type=int, default=128, help="micro-batch size per rank")
    parser.add_argument("--warmup", type=int, default=4, help="steps before counting")
    parser.add_argument("--steps", type=int, default=2, help="steps counted (to show steadiness)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds before giving up")
    parser.add_argument(
        "--against",
        type=Path,
        help="another agent's source directory (holding sdc_agent/): count it too, side by side",
    )
    parser.add_argument("--json", type=Path, help="write the summaries here")
    parser.add_argument("--emit-json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    recorder = Recorder(__file__, argv)
    summaries = []
    if args.against is not None:
        forwarded = [a for a in (argv if argv is not None else sys.argv[1:])]
        i = forwarded.index("--against")
        forwarded = forwarded[:i] + forwarded[i + 2 :]
        forwarded = [a for a in forwarded if not a.startswith("--against=")]
        env = {**os.environ, "PYTHONPATH": str(args.against)}
        out = subprocess.run(
            [sys.executable, __file__, *forwarded, "--emit-json"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        summaries.append(json.loads(out.splitlines()[-1]))
    summaries.append(run(args))
    if args.emit_json:
        print(json.dumps(summaries[-1]))
        return 0
    _print(summaries)
    if args.json:
        recorder.write(args.json, {"args": vars(args), "summaries": summaries})
    return 0


if __name__ == "__main__":
    sys.exit(main())
