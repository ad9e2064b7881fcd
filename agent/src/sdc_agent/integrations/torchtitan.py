"""torchtitan's parts in the guard's loop: ``pip install "./agent[torchtitan]"`` (from a clone).

torchtitan's ``Trainer`` cannot run here, and could not be hooked if it did: it picks its device
at import time (``torchtitan.tools.utils.device_type`` falls back to ``"cuda"`` when no
accelerator is visible) and calls ``torch.cuda.set_device`` in ``__init__``, so it never starts
on a CPU with gloo; and its ``train_step`` is one method with no hook between the backward, the
gradient clipping and ``optimizers.step()``. So :class:`TitanGuard` runs torchtitan's own parts
in the guard's loop, the way ``Trainer.train_step`` runs them: the model built from its config
and sharded with its FSDP2 functions (``apply_fsdp_to_decoder``, which ``parallelize_llama``
calls), its optimizer and lr-scheduler containers, its loss (a micro-batch's summed loss over
the step's global token count, so ``Guard(divide_loss=False)``), its ``clip_grad_norm_`` and its
DCP ``CheckpointManager``, whose checkpoints carry the guard's tags as one more ``Stateful``::

    guard = TitanGuard([model], optimizers, lr_schedulers=lr_schedulers, loss_fn=loss_fn,
                       checkpointer=checkpointer, max_norm=1.0, rebuild_batch=rebuild_batch,
                       schedule=sdc.Schedule(...), alarm_dir=CKPT_DIR)
    alarm = guard.train(batches, start_step=guard.resume())
    if alarm:
        sdc.exit_on_alarm(alarm)

Each item of ``batches`` (and each ``rebuild_batch(step, rank)``) is the step's list of
``Schedule.grad_accum`` micro-batches, each ``(input_dict, labels)`` as torchtitan's dataloaders
yield them. Data parallelism only (the replays recompute whole-model micro-batches on data-parallel ranks): one model part only (no pipeline stages),
and no tensor parallelism (its token count and batches are per data-parallel rank here, while
``sdc.Guard`` itself checks TP composed with FSDP2 / HSDP); context parallelism is not
supported either.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.stateful import Stateful

try:
    from torchtitan.components.loss import IGNORE_INDEX
    from torchtitan.distributed import utils as titan_dist
    from torchtitan.models.common.attention import FlexAttention, VarlenAttention
except ImportError as err:  # pragma: no cover - exercised without the extra only
    raise ImportError(
        "sdc_agent.integrations.torchtitan needs torchtitan: pip install torchtitan (or './agent[torchtitan]' from a clone)"
    ) from err

from .. import Alarm, Guard, Publisher, Schedule, clean_resume_step
from .hooks import RebuildBatch

__all__ = ["TAGS_STATE", "CheckpointTags", "TitanGuard"]

TAGS_STATE = "sdc"
"""The key of the guard's tags among the CheckpointManager's states."""

TitanLoss = Callable[..., Any]
"""torchtitan's loss: ``loss_fn(pred, labels, global_valid_tokens)`` -> ``(loss, metrics)``."""


class CheckpointTags(Stateful):
    """The guard's checkpoint tags as a DCP ``Stateful``: saved with torchtitan's checkpoint,
    restored when it is loaded."""

    def __init__(self) -> None:
        self.tags: dict[str, Any] | None = None
        """The tags of the checkpoint saved last, or loaded last."""

    def state_dict(self) -> dict[str, Any]:
        """The tags as JSON (DCP stores it as an object)."""
        return {"tags": json.dumps(self.tags, sort_keys=True)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the tags a checkpoint carried."""
        self.tags = json.loads(state_dict["tags"])


class TitanGuard:
    """torchtitan's training step under the guard (see the module docstring).

    ``model_parts``: torchtitan's list of model parts, here one model (no pipeline stages),
    sharded with ``fully_shard`` (its ``apply_fsdp_to_decoder``; full sharding or HSDP).
    ``optimizers`` / ``lr_schedulers``: its containers. ``loss_fn``: its loss (for example
    ``CrossEntropyLoss.Config().build()``). ``checkpointer``: its ``CheckpointManager`` (or
    None); its interval decides when checkpoints are saved, each one verified and tagged first.
    ``max_norm``: torchtitan's ``training.max_norm`` (None: no clipping). Construction is
    collective (as :class:`sdc_agent.Guard`'s).
    """

    def __init__(
        self,
        model_parts: list[nn.Module],
        optimizers: torch.optim.Optimizer,
        *,
        loss_fn: TitanLoss,
        rebuild_batch: RebuildBatch,
        lr_schedulers: Any = None,
        checkpointer: Any = None,
        max_norm: float | None = None,
        schedule: Schedule | None = None,
        publisher: Publisher | None = None,
        alarm_dir: str | os.PathLike | None = None,
        allow_unsafe_resume: bool = False,
    ) -> None:
        """Check the parts and build the guard (collective)."""
        if len(model_parts) != 1:
            raise ValueError(
                f"TitanGuard: {len(model_parts)} model parts (pipeline parallelism) are not "
                "supported: a replay recomputes a whole model's micro-batch on one rank"
            )
        if max_norm is not None and not max_norm > 0:
            raise ValueError(
                f"TitanGuard: max_norm must be a positive number or None, got {max_norm!r}"
            )
        self.model = model_parts[0]
        self.optimizers = optimizers
        self.lr_schedulers = lr_schedulers
        self.loss_fn = loss_fn
        self.max_norm = max_norm
        self.checkpointer = checkpointer
        self.alarm_dir = alarm_dir
        self.tags = CheckpointTags()
        """The tags the checkpointer saves with each checkpoint (key :data:`TAGS_STATE`)."""
        if checkpointer is not None and getattr(checkpointer, "enable", False):
            checkpointer.states[TAGS_STATE] = self.tags
        self._global_valid_tokens: torch.Tensor | None = None  # the current step's
        self.guard = Guard(
            self.model,
            optimizers,
            compute_loss=self.micro_batch_loss,
            rebuild_batch=rebuild_batch,
            schedule=schedule,
            publisher=publisher,
            alarm_dir=alarm_dir,
            allow_unsafe_resume=allow_unsafe_resume,
            divide_loss=False,  # torchtitan divides by the step's global token count
        )
        """The guard (``sdc_agent.Guard``) this loop drives."""
        # Every rank waits for each step's flags and judges a flagged step with the others
        # before the clip: under FSDP2 a NaN in one shard flags only the ranks that see it,
        # and the clip (an all-reduce of the sharded norm), the optimizer step and the LR
        # scheduler must then be skipped by every rank, or the clip hangs and the shards and
        # schedules diverge. The cost: the flags' reduction is waited for in this step rather
        # than during the next step's forward.
        self.guard._run.decides_every_step = True

    # ------------------------------------------------------------------ the step
    def micro_batch_loss(self, model: nn.Module, micro: Any) -> torch.Tensor:
        """One micro-batch's share of the step's loss, as ``Trainer.train_step`` computes it:
        the forward with the input dict's extra keys (and attention masks built from
        ``positions`` for flex/varlen attention), then ``loss_fn(pred, labels,
        global_valid_tokens)``. Training and replays call it alike."""
        input_dict, labels = micro
        inputs = input_dict["input"]
        extra = {k: v for k, v in input_dict.items() if k != "input"}
        positions = extra.get("positions")
        if positions is not None and _masked_attention(model):
            extra["attention_masks"] = model.get_attention_masks(positions=positions)  # type: ignore[operator]  # torchtitan's method; nn.Module types it Tensor | Module
        pred = model(inputs, **extra)
        out = self.loss_fn(pred, labels, self._global_valid_tokens)
        return out[0] if isinstance(out, tuple) else out

    def train(self, batches: Iterable[Any], *, start_step: int = 0) -> Alarm | None:
        """Train on ``batches`` from ``start_step`` (torchtitan's step ``start_step + 1``) until
        they end or a check fails; returns the Alarm (the same on every rank; that step was not
        applied) or None. Refuses a ``start_step`` whose checkpoint a recorded alarm covers
        (:class:`sdc_agent.UnsafeResumeError`), and compares the weights before the first step."""
        g = self.guard
        g.check_resume(start_step)
        g.optimizer.zero_grad(set_to_none=True)
        if g.schedule.check_on_start and (alarm := g.check_weights(start_step)):
            return alarm
        params = [p for p in self.model.parameters() if p.requires_grad]
        for step, micros in zip(itertools.count(start_step), batches):
            micros = list(micros)
            self._global_valid_tokens = self._count_tokens(micros)
            with g.step(step) as guarded:
                for micro in guarded.micro_batches(micros):
                    guarded.backward(self.micro_batch_loss(self.model, micro))
                if alarm := guarded.check_gradients():
                    return alarm
                # decides_every_step: update_allowed is the same on every rank, so every rank
                # enters the clip's collective, or none does.
                if guarded.update_allowed:
                    if self.max_norm is not None:
                        titan_dist.clip_grad_norm_(params, self.max_norm, foreach=True)
                    self.optimizers.step()
                    if self.lr_schedulers is not None:
                        self.lr_schedulers.step()
                self.optimizers.zero_grad(set_to_none=True)
                if alarm := guarded.after_update():
                    return alarm
                if self._saves_at(step + 1):
                    if alarm := guarded.verify_weights():
                        return alarm  # nothing written
                    self.tags.tags = guarded.checkpoint_tags()
                    self.checkpointer.save(curr_step=step + 1)
        return g.finish()

    # ------------------------------------------------------------------ resume
    def resume(self) -> int:
        """Load the newest checkpoint of the checkpointer's folder that no alarm recorded in
        the guard's ``alarm_dir`` covers (collective; DP rank 0 decides), and return the step
        to train from (0 when none is clean: the initial weights)."""
        checkpointer = self.checkpointer
        if checkpointer is None or not getattr(checkpointer, "enable", False):
            return 0
        decision: list[Any] = [None]
        if dist.get_rank() == 0:
            titan_steps = _checkpoint_steps(checkpointer.folder)
            if not titan_steps:
                clean = None  # a first start: nothing saved yet
            elif self.alarm_dir is None:
                clean = titan_steps[-1] - 1  # no alarm log: the newest, as torchtitan would
            else:
                clean = clean_resume_step([s - 1 for s in titan_steps], self.alarm_dir)
            decision[0] = None if clean is None else clean + 1
        # On NCCL the pickled object travels as a device tensor: name the device, rather than
        # rely on the job having called torch.cuda.set_device.
        device = self.collective_device
        with _on(device):
            dist.broadcast_object_list(decision, src=0, device=device)
        titan_step = decision[0]
        if titan_step is None:
            return 0
        checkpointer.load(step=titan_step)
        return titan_step  # the guard step after the checkpoint's (titan step N = guard N - 1)

    # ------------------------------------------------------------------ internals
    @property
    def collective_device(self) -> torch.device:
        """The device this loop's collectives use: the guard's (CUDA under NCCL, whose
        process groups refuse CPU tensors; the CPU under gloo)."""
        return self.guard._run.parallel.collective_device

    def _count_tokens(self, micros: list[Any]) -> torch.Tensor:
        """The step's labelled tokens over every rank (torchtitan's ``global_valid_tokens``)."""
        device = self.collective_device
        # Counted where the labels are and summed on the collective device: no host read per
        # micro-batch, and NCCL gets a device tensor.
        total = torch.zeros((), dtype=torch.int64, device=device)
        for _, labels in micros:
            total += (labels != IGNORE_INDEX).sum().to(device)
        dist.all_reduce(total)
        return total

    def _saves_at(self, titan_step: int) -> bool:
        """Whether torchtitan's checkpointer saves after ``titan_step`` (its own rule)."""
        c = self.checkpointer
        if c is None or not getattr(c, "enable", False) or getattr(c, "load_only", False):
            return False
        first = titan_step == 1 and getattr(c, "enable_first_step_checkpoint", False)
        return first or titan_step % c.interval == 0


def _on(device: torch.device) -> Any:
    """Make ``device`` current for a collective that allocates on the current CUDA device
    (a no-op context off CUDA)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _masked_attention(model: nn.Module) -> bool:
    """Whether the model's attention takes masks built from positions (flex, varlen)."""
    first = getattr(getattr(model, "config", None), "first_attention", None)
    inner = getattr(first, "inner_attention", None)
    return isinstance(inner, (FlexAttention.Config, VarlenAttention.Config))


_STEP_DIR = re.compile(r"^step-(\d+)$")


def _checkpoint_steps(folder: str) -> list[int]:
    """torchtitan's checkpoint steps in ``folder`` (directories ``step-N``)."""
    if not os.path.isdir(folder):
        return []
    return sorted(int(m.group(1)) for name in os.listdir(folder) if (m := _STEP_DIR.match(name)))
