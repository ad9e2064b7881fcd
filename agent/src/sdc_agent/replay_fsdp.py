"""Check 2 on an FSDP2 model: collective replays through the sharded module, gradient sync off.

Under DDP a replay runs on the bare module, alone. Under FSDP2 the parameters are sharded, so a
forward needs the other ranks' shards (all-gathers): every rank replays AT THE SAME TIME, each its
peer's micro-batch (:class:`CollectiveReplayer`), and every confirmation is a round in which every
rank replays the disputed micro-batch and only the third GPU and the target keep their result
(:class:`CollectiveRingAudit`). The attribution is :mod:`sdc_agent.attribution`'s, unchanged.

What is compared, and why a weight-gradient fault shows: each rank's LOCAL, pre-reduction gradient
of the replayed micro-batch, per parameter, as FSDP2's unsharded parameter accumulates it. With
gradient sync off (``set_requires_gradient_sync(False)``) FSDP2 runs no reduce-scatter: the
replay's gradient stays on the unsharded parameters (``unsharded_param.grad``; with a reduce
dtype other than the parameters', converted into a private accumulation buffer after the hook
ran). Check 1's local tap (:mod:`sdc_agent.gradients_fsdp`) fingerprints it right after autograd
accumulated it, before any reduction: in the audited training step (sync on) and in the replay
(sync off) the tap sees the same tensor in the same layout, so the two fingerprints are equal bit
for bit when both GPUs computed right. A fault that touches only the backward pass, even only a
weight gradient (the loss is then exact), changes that rank's local gradient of that parameter,
so its fingerprint differs from the replayer's: it is caught as under DDP. A reduced or sharded
gradient would not do: it mixes every rank's contribution (the faulty rank's is averaged away by
the reduce-scatter, and every rank holds a different shard).

A replay restores what it changed, so training continues bit-identically: the replay's unsharded
gradients are dropped, the sharded (reduced) gradients of the audited step, the buffers and the
RNG are put back, and gradient sync is turned back on. A replay that raises on some ranks only
would leave the others waiting in FSDP2's collectives, so ``rebuild_batch`` runs first and every
rank agrees that every batch was rebuilt before any forward starts; ``compute_loss`` must not
raise on one rank alone.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from .accumulation import MicroBatchIsolation
from .attribution import FAILED_ROW, ROW_WIDTH, Outcome, confirmation_jobs
from .audit import RingAudit
from .gradients import FlagTable, GradStatsState
from .replay import (
    ComputeLoss,
    Replayer,
    accumulated_at_start_error,
    deterministic_kernels,
    micro_batch_loss,
    outcome_of,
    scaled_for_backward,
    seed_all,
)

if TYPE_CHECKING:
    from .parallel_fsdp import FSDP2Adapter

logger = logging.getLogger("sdc_agent")


class CollectiveReplayer(Replayer):
    """Replays a micro-batch through the sharded module (every rank at once), sync off."""

    def __init__(
        self,
        adapter: FSDP2Adapter,
        compute_loss: ComputeLoss,
        step_state: GradStatsState,
        *,
        grad_accum: int = 1,
        scaler: Any | None = None,
        divide_loss: bool = True,
    ) -> None:
        """``step_state``: check 1's statistics, whose row order the replay's fingerprints
        follow; ``grad_accum``, ``scaler`` and ``divide_loss`` as
        :class:`~sdc_agent.replay.Replayer`'s."""
        super().__init__(
            adapter.module,
            adapter.params,
            compute_loss,
            grad_accum=grad_accum,
            scaler=scaler,
            divide_loss=divide_loss,
        )
        self.adapter = adapter
        self._param_index = step_state.param_index

    def micro_batch_isolation(self) -> MicroBatchIsolation:
        """Isolation of the audited micro-batch on the UNSHARDED parameters, where this rank's
        local gradient accumulates (sync off) and where the replay's is fingerprinted; run from
        check 1's local taps, first, so that the synchronising micro-batch's tap and FSDP2's
        post-backward see the accumulated sum again."""
        isolation = MicroBatchIsolation([None] * len(self.params), register_hooks=False)
        self.adapter.gradient_taps().isolate_with(isolation)
        return isolation

    def note_gradients_at_start(self, step: int) -> None:
        """Refuse a step that starts with accumulated gradients (sharded, or unsharded left by
        a backward without sync): one micro-batch's replay cannot reproduce them."""
        grads = [p.grad for p in self.params if p.grad is not None]
        local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
        nonzero = int(torch.stack([torch.count_nonzero(g) for g in local]).sum()) if local else 0
        leftover = [
            p for p in self.adapter.gradient_taps().unsharded_parameters() if p.grad is not None
        ]
        if nonzero or leftover:
            raise accumulated_at_start_error(step)
        # The local gradient a replay compares always starts as None under FSDP2 (it is freed
        # after each reduce-scatter), whatever the sharded gradients start as.
        self.zero_grads_at_start = None

    def replay(self, batch: Any, *, seed: int, deterministic: bool) -> Outcome:
        """Recompute ``batch`` with RNG ``seed`` (collective: every rank calls it at once)."""
        adapter = self.adapter
        with self.state_set_aside():
            record = GradStatsState(process_group=None, param_index=self._param_index)
            record.arm(capture_fingerprints=deterministic, device=adapter.param_device)
            try:
                adapter.set_gradient_sync(False)
                with adapter.gradient_taps().recording_into(record):
                    seed_all(seed)
                    with deterministic_kernels(deterministic):
                        loss = micro_batch_loss(
                            self.compute_loss(self.module, batch), self.loss_divisor
                        )
                        scaled_for_backward(loss, self.scaler).backward()
                flags = record.local_flags
                finite = not bool(torch.cat(flags).any()) if flags else True
                return outcome_of(
                    loss, record.local_fingerprints if deterministic else None, finite
                )
            finally:
                adapter.set_gradient_sync(True)
                adapter.discard_unsynced_gradients()


class CollectiveRingAudit(RingAudit):
    """The ring audit with collective replays: every rank runs every replay round at once."""

    def scaler_skips_everywhere(self, table: FlagTable) -> bool:
        """Whether every rank's ``scaler.step`` will skip ``table``'s step: when SOME rank's
        shard of the reduced gradient is non-finite. ``GradScaler.unscale_`` max-reduces
        ``found_inf`` over the mesh's shard dimension, and HSDP's replicas of a shard hold the
        same reduced values (:mod:`sdc_agent.parallel_fsdp`); the flags here are those shards'
        (or, with clipping, the global norm's)."""
        return any(table.reduced)

    def _replay_row(
        self, step: int, target_dp: int, deterministic: bool, whole_step: bool = False
    ) -> list[int]:
        """Every rank replays one rank's micro-batch(es) (its own target's) at the same time; a
        batch that cannot be rebuilt on any rank makes every rank send FAILED_ROW before any
        forward. ``whole_step``: every micro-batch of the step, as RingAudit's."""
        a = self.adapter
        target = a.global_rank(target_dp)
        micros: list[Any] = []
        failed = 0
        try:
            micros = self._micro_batches(step, target)
        except Exception:
            logger.exception(
                "sdc_agent: rebuilding rank %d's batch of step %d failed on rank %d",
                target,
                step,
                a.rank,
            )
            failed = 1
        flag = torch.tensor([failed], dtype=torch.int64, device=a.collective_device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=a.dp_group)  # nobody starts alone
        if int(flag.item()):
            return list(FAILED_ROW)
        try:
            # Every rank replays the same number of micro-batches (grad_accum is the job's), so
            # FSDP2's all-gathers pair up.
            outcome = self._replay_micro_batches(step, target, micros, deterministic, whole_step)
        except Exception:
            logger.exception(
                "sdc_agent: replaying rank %d's batch of step %d failed on rank %d",
                target,
                step,
                a.rank,
            )
            return list(FAILED_ROW)
        return outcome.to_row()

    def _confirm(
        self, step: int, targets: list[int], deterministic: bool, whole_step: bool = False
    ) -> list[tuple[Outcome, Outcome] | None]:
        """One round per disputed target: every rank replays the target's batch; the third GPU's
        result fills column 0 and the target's own column 1 (collective: the rounds, then one
        all-reduce)."""
        a = self.adapter
        jobs = confirmation_jobs(targets, a.world, self.peer_offset, a.dp_rank)
        table = torch.zeros((len(targets), 2, ROW_WIDTH), dtype=torch.int64)
        for slot, target_dp in enumerate(targets):
            row = torch.tensor(self._replay_row(step, target_dp, deterministic, whole_step))
            for job_slot, column, _ in jobs:
                if job_slot == slot:
                    table[slot, column] = row
        return self._confirmations_of(table)
