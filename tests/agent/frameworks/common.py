"""What every framework's jobs share: the launcher, a small model, seeded data, the faults, and
the per-rank record of what was applied and saved.

Every job runs on 6 gloo processes = 3 simulated nodes x 2 ranks (NODE_NAME per rank), with
``peer_offset=2``: rank R=3 (node 1) is replayed by rank 1 (node 0) and its disputes are settled
by rank 5 (node 2). Models are built from code or configs and data is synthetic: nothing comes
from a hub.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import sdc_agent as sdc

# The one line to change when the launcher moves (it runs `module:function` jobs on every rank).
from sdc_agent.drills.launch import launch  # noqa: F401  (re-exported for the test modules)
from tests.agent.scenarios import CountingPublisher

R = 3
"""The faulty rank: node 1, replayed by rank 1 (node 0), confirmed by rank 5 (node 2)."""
WORLD, RANKS_PER_NODE = 6, 2
SCHEDULE = {"audit_every": 5, "check_every": 5, "peer_offset": 2}
"""Audits and weight checks every 5 steps (checkpoint cadences come from the frameworks)."""


def quiet_environment() -> None:
    """One intra-op thread per rank whatever the framework sets (Accelerate sets 2 when
    OMP_NUM_THREADS is unset), no hub, no telemetry: bitwise replays need the same thread
    count on every rank."""
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"
    os.environ["WANDB_DISABLED"] = "true"
    # Lightning computes its global rank from NODE_RANK and the local rank.
    os.environ["NODE_RANK"] = str(dist.get_rank() // RANKS_PER_NODE)
    torch.set_num_threads(1)


class MLP(nn.Module):
    """A small classifier with dropout (replays must reproduce the RNG): ``net.2`` is the layer
    the tests' forward fault hits."""

    def __init__(self, d_in: int = 16, hidden: int = 32, classes: int = 4) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_in, hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.Dropout(0.1),
            nn.GELU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def micro_batch(index: int, rank: int, *, batch: int = 8, d_in: int = 16) -> tuple:
    """Global ``rank``'s micro-batch number ``index`` (a pure function: any rank rebuilds it)."""
    g = torch.Generator().manual_seed(index * 1009 + rank)
    return torch.randn(batch, d_in, generator=g), torch.randint(0, 4, (batch,), generator=g)


def step_micro_batches(step: int, rank: int, accumulation: int) -> list[tuple]:
    """The micro-batches ``rank`` trains on at ``step``."""
    return [micro_batch(step * accumulation + i, rank) for i in range(accumulation)]


def classification_loss(model: nn.Module, batch: tuple) -> torch.Tensor:
    """compute_loss(model, batch) of the MLP."""
    x, y = batch
    return F.cross_entropy(model(x), y)


def fault(layer: str | nn.Module, *, step: int = 7, **kw: Any) -> sdc.faults.Fault:
    """A persistent x1000 on one output element of ``layer`` on rank R from ``step``."""
    return sdc.faults.ScaleOutputElement(layer, factor=1000.0, rank=R, step=step, **kw)


def weight_flip(param: str, *, step: int = 6) -> sdc.faults.Fault:
    """One fp32 bit of rank 0's copy of ``param`` flipped after step ``step``'s update."""
    return sdc.faults.FlipWeightBit(param, index=3, bit=12, rank=0, step=step)


def attach(guard: sdc.Guard, faults: Iterable[str], *, forward: Any, weight: str) -> None:
    """Attach the named faults: "forward" (:func:`fault` on the layer ``forward``), "weight"
    (:func:`weight_flip` of the parameter ``weight``, named as the guard names it)."""
    if "forward" in faults:
        fault(forward).attach(guard)
    if "weight" in faults:
        weight_flip(weight).attach(guard)


def digest(tensors: Iterable[torch.Tensor]) -> str:
    """A digest of this rank's local tensors (shards under FSDP2), bit for bit."""
    h = hashlib.sha256()
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        h.update(local.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class UpdateRecord:
    """What this rank's torch optimizer applied: the step counter read at each update, and
    the weights' digest after it (so the final weights can be traced to the last update)."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
        self.params = params
        self.steps: list[int] = []
        self.digests: list[str] = []
        self._current = lambda: len(self.steps)
        optimizer.register_step_post_hook(self._after)

    def counting(self, current_step: Any) -> UpdateRecord:
        """Read the step being applied from ``current_step()`` (the framework's counter)."""
        self._current = current_step
        return self

    def _after(self, *_: Any) -> None:
        self.steps.append(int(self._current()))
        self.digests.append(digest(self.params))

    def summary(self) -> dict[str, Any]:
        """The record, and whether the weights are still what the last update left."""
        final = digest(self.params)
        return {
            "updates": self.steps,
            "weights_as_last_update_left": bool(self.digests) and final == self.digests[-1],
        }


def counts(publisher: CountingPublisher) -> dict[str, Any]:
    """What the guard published from this rank (only DP rank 0 publishes)."""
    return {
        "audit_passes": publisher.audit_passes,
        "weight_check_passes": publisher.weight_check_passes,
        "alarms_published": len(publisher.alarms),
    }


def alarm_dict(alarm: sdc.Alarm | None) -> dict[str, Any] | None:
    return alarm.to_dict() if alarm is not None else None


# ---------------------------------------------------------------------------- publishing
def use_cloudwatch(endpoint: str, spool_root: str, job: str) -> None:
    """Point this rank's CloudWatchPublisher() at the test's moto server, as the environment
    of a HyperPod pod would point it at CloudWatch (cluster "integrations", job ``job``)."""
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        SDC_CLUSTER_NAME="integrations",
        SDC_JOB_NAME=job,
        SDC_SPOOL_DIR=os.path.join(spool_root, job, f"rank{dist.get_rank()}"),
    )


def sink_for(publish: dict[str, str] | None, counting: CountingPublisher) -> Any:
    """The publisher of a job: CloudWatch (moto) when ``publish`` names the server, else the
    counting stand-in."""
    if publish is None:
        return counting
    from sdc_agent.publish import CloudWatchPublisher

    use_cloudwatch(**publish)
    return CloudWatchPublisher()


# ---------------------------------------------------------------------------- docs examples
DOCS = Path(__file__).resolve().parents[3] / "docs" / "integrations.md"


def docs_example(name: str) -> str:
    """The Python block that follows ``<!-- example: NAME`` in docs/integrations.md."""
    text = DOCS.read_text()
    marker = f"<!-- example: {name}"
    start = text.index(marker)
    block = text.index("```python\n", start) + len("```python\n")
    return text[block : text.index("\n```", block)]


def run_docs_example(name: str, namespace: dict[str, Any]) -> dict[str, Any]:
    """Run docs/integrations.md's example ``name`` with ``namespace`` as what the reader's
    script defined before it; returns the namespace after it ran."""
    code = compile(docs_example(name), f"docs/integrations.md#{name}", "exec")
    exec(code, namespace)
    return namespace


def report(
    *,
    alarm: sdc.Alarm | None,
    record: UpdateRecord,
    optimizers: Iterable[torch.optim.Optimizer],
    framework_step: int | None,
    counting: CountingPublisher,
    sink: Any,
    **extra: Any,
) -> dict[str, Any]:
    """What every framework's training job returns, so that one set of expectations reads
    them all: the alarm, what this rank's optimizer applied (its own record, AdamW's per
    parameter counters, the framework's step counter), whether the weights are still what the
    last update left, whether the publisher delivered, what it counted."""
    state = [s for optimizer in optimizers for s in optimizer.state.values()]
    return {
        "rank": dist.get_rank(),
        "alarm": alarm_dict(alarm),
        "framework_step": framework_step,
        "adamw_steps": sorted({int(s["step"]) for s in state if "step" in s}),
        "delivered": sink.flush(30.0),
        **record.summary(),
        **counts(counting),
        **extra,
    }
