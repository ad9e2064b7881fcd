"""Jobs of the Llama sensor tests, run on every rank (importable: the launcher spawns them).

A Hugging Face Llama built from a config (tests/support/llama.py), ``sdc.protect(model)``
before DDP, the loss computed by the model itself (``labels=``), as a user of transformers
trains it.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import sdc_agent as sdc
from sdc_agent.drills.job import make_fault
from sdc_agent.sensors import SensorConfig
from tests.agent.sensor_scenarios import SensorCountingPublisher, sensed_outcome
from tests.support.llama import causal_lm_loss, llama, tokens


def llama_run(
    *,
    steps: int,
    faults: list[dict[str, Any]] = (),
    bf16: bool = False,
    attention: str = "checked",
    checkpointing: bool = False,
    audit_every: int = 50,
    budget: float = math.inf,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train the protected Llama under the guard for ``steps`` steps; report the alarm, the
    steps applied, the sensor counts and the coverage here (the same keys as
    :func:`tests.agent.sensor_scenarios.sensed_run`, plus the wall time)."""
    module = llama()
    if checkpointing:
        module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    sdc.protect(module, attention=attention, config=SensorConfig(**(config or {})))
    ddp = nn.parallel.DistributedDataParallel(module)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    publisher = SensorCountingPublisher()

    def compute_loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        return causal_lm_loss(model, ids, bf16=bf16)

    guard = sdc.Guard(
        ddp,
        optimizer,
        compute_loss=compute_loss,
        rebuild_batch=tokens,
        schedule=sdc.Schedule(
            audit_every=audit_every, check_every=0, peer_offset=2, sensor_budget=budget
        ),
        publisher=publisher,
    )
    injected = [make_fault(f).attach(guard) for f in faults]
    updates: list[int] = []
    optimizer.register_step_post_hook(lambda *_: updates.append(guard.current_step))
    started = time.monotonic()
    alarm = guard.train(tokens(s, dist.get_rank()) for s in range(steps))
    seconds = time.monotonic() - started
    return {**sensed_outcome(guard, alarm, updates, injected, publisher), "seconds": seconds}
