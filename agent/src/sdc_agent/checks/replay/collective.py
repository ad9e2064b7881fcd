"""Check 2's replays on a sharded model (FSDP2): collective, through the sharded module, sync off.

Under DDP a replay runs on the bare module, alone (:class:`~.replayer.Replayer`). Under FSDP2 the
parameters are sharded, so a forward needs the other ranks' shards (all-gathers): every rank
replays AT THE SAME TIME, each its peer's micro-batch (:class:`CollectiveReplayer`), and the audit
runs its replays in lockstep (:class:`~.audit.CollectiveRingAudit`). The attribution is
:mod:`.attribution`'s, unchanged.

What is compared, and why a weight-gradient fault shows: each rank's LOCAL, pre-reduction gradient
of the replayed micro-batch, per parameter, as FSDP2's unsharded parameter accumulates it. With
gradient sync off (``set_requires_gradient_sync(False)``) FSDP2 runs no reduce-scatter: the
replay's gradient stays on the unsharded parameters (``unsharded_param.grad``; with a reduce
dtype other than the parameters', converted into a private accumulation buffer after the hook
ran). Check 1's local tap (:mod:`sdc_agent.checks.gradients.taps`) fingerprints it right after autograd
accumulated it, before any reduction: in the audited training step (sync on) and in the replay
(sync off) the tap sees the same tensor in the same layout, so the two fingerprints are equal bit
for bit when both GPUs computed right. A fault that touches only the backward pass, even only a
weight gradient (the loss is then exact), changes that rank's local gradient of that parameter,
so its fingerprint differs from the replayer's: it is caught as under DDP. A reduced or sharded
gradient would not do: it mixes every rank's contribution (the faulty rank's is averaged away by
the reduce-scatter, and every rank holds a different shard).

Memory: with sync off nothing reduce-scatters a replay's gradient, so kept on the unsharded
parameters the whole model's unsharded gradient would be held at once (for an 8B model 16 GB in
bf16, 32 GB with an fp32 reduce dtype, which FSDP2 would convert it into). So each one is dropped
the moment it is fingerprinted: a post-accumulate-grad hook on each unsharded parameter, added
for the replay after check 1's tap (a tensor's hooks run in the order they were registered), sets
``unsharded_param.grad`` to None once the tap took its fingerprint and its non-finite flag. FSDP2
then finds no gradient to convert or keep, and the replay holds about one parameter's gradient
at a time, plus the fingerprints. The fingerprints are those of the very tensors autograd stored,
taken before the drop, so the outcome is what it was when the gradients were kept. A parameter
autograd reaches twice in one backward (its gradient accumulated twice, as a reentrant
checkpoint can do) would then be fingerprinted from its second part alone: the replay raises
instead (a failed replay, never a false mismatch).

A replay restores what it changed, so training continues bit-identically: the replay's unsharded
gradients are dropped (as they are produced, above; whatever is left at the end), the sharded
(reduced) gradients of the audited step, the buffers and the RNG are put back, and gradient sync
is turned back on. A replay that raises on some ranks only
would leave the others waiting in FSDP2's collectives, so ``rebuild_batch`` runs first and every
rank agrees that every batch was rebuilt before any forward starts; ``compute_loss`` must not
raise on one rank alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from ..gradients.stats import GradStatsState
from ..gradients.taps import ShardedGradientTaps
from .accumulation import MicroBatchIsolation
from .attribution import Outcome
from .environment import deterministic_kernels, seed_all
from .replayer import (
    ComputeLoss,
    Replayer,
    accumulated_at_start_error,
    micro_batch_loss,
    outcome_of,
    scaled_for_backward,
)


class ShardedModel(Protocol):
    """What a collective replay needs from its parallelism adapter
    (:class:`sdc_agent.parallel.fsdp.FSDP2Adapter` is one): the sharded module, check 1's taps
    on its unsharded parameters, and a switch for the gradient reduction."""

    module: nn.Module
    """The sharded root module replays run through."""
    params: list[nn.Parameter]
    """The trainable (sharded) parameters, in the order of every fingerprint table."""
    param_device: torch.device
    """Where the parameters' shards (and so the gradients) live."""

    def gradient_taps(self) -> ShardedGradientTaps:
        """Check 1's taps, which see each rank's local gradient on the unsharded parameters."""
        ...

    def set_gradient_sync(self, enabled: bool) -> None:
        """Turn the gradient reduction of later backward passes on or off."""
        ...

    def discard_unsynced_gradients(self) -> None:
        """Drop the local gradients a backward with sync off left behind."""
        ...


class CollectiveReplayer(Replayer):
    """Replays a micro-batch through the sharded module (every rank at once), sync off."""

    def __init__(
        self,
        adapter: ShardedModel,
        compute_loss: ComputeLoss,
        step_state: GradStatsState,
        *,
        grad_accum: int = 1,
        scaler: Any | None = None,
        divide_loss: bool = True,
    ) -> None:
        """``step_state``: check 1's statistics, whose row order the replay's fingerprints
        follow; ``grad_accum``, ``scaler`` and ``divide_loss`` as
        :class:`~.replayer.Replayer`'s."""
        super().__init__(
            adapter.module,
            adapter.params,
            compute_loss,
            grad_accum=grad_accum,
            scaler=scaler,
            divide_loss=divide_loss,
        )
        self.adapter = adapter
        self._step_state = step_state

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
            step_state = self._step_state
            record = GradStatsState(
                process_group=None,
                param_index=step_state.param_index,
                # With accumulation the audited step's own gradient is isolated per parameter
                # (accumulation.py) and its local results are not recorded: compare the same.
                records_events=step_state.records_events and self.grad_accum == 1,
            )
            record.arm(capture_fingerprints=deterministic, device=adapter.param_device)
            taps = adapter.gradient_taps()
            try:
                adapter.set_gradient_sync(False)
                with taps.recording_into(record), _dropped_once_tapped(taps.unsharded_parameters()):
                    seed_all(seed)
                    with deterministic_kernels(deterministic):
                        loss = micro_batch_loss(
                            self.compute_loss(self.module, batch), self.loss_divisor
                        )
                        scaled_for_backward(loss, self.scaler).backward()
                flags = record.local_flags
                finite = not bool(torch.cat(flags).any()) if flags else True
                self.last_table = record.local_table() if deterministic else None
                return outcome_of(loss, self.last_table, finite)
            finally:
                adapter.set_gradient_sync(True)
                adapter.discard_unsynced_gradients()


@contextlib.contextmanager
def _dropped_once_tapped(params: Sequence[nn.Parameter]) -> Iterator[None]:
    """Inside the block, drop each of ``params``' gradients (FSDP2's unsharded parameters) the
    moment autograd stored it and the hooks registered before this one (check 1's tap: its
    fingerprint and non-finite flag) saw it, so a replay never holds the unsharded gradients of
    the whole model (module docstring). A parameter whose gradient arrives a second time in the
    block raises: its first part is gone, so its fingerprint could not be the accumulated one."""
    seen: set[int] = set()

    def drop(param: torch.Tensor) -> None:
        if id(param) in seen:
            raise RuntimeError(
                "sdc_agent: an FSDP2 replay's backward accumulated a parameter's gradient twice "
                f"(shape {tuple(param.shape)}; a reentrant activation checkpoint around a shared "
                "weight?): the replay drops each gradient once fingerprinted and cannot compare "
                "the accumulated one; use torch.utils.checkpoint(..., use_reentrant=False)"
            )
        seen.add(id(param))
        param.grad = None

    handles = [p.register_post_accumulate_grad_hook(drop) for p in params]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
