"""Recompute one micro-batch on the bare module and reduce the result to comparable bits.

A replay runs ``compute_loss(module, batch)`` and its backward on the unwrapped module: DDP's
autograd hooks ignore a backward they did not prepare, so no collective runs. Before it, the
parameters' gradients are set aside, the module's buffers set to what they were when the step's
forward began, and the RNG seeded for the batch's owner; afterwards all three are put back, so the
training step continues exactly as if no replay had happened.
"""

from __future__ import annotations

import contextlib
import hashlib
import struct
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from ...fingerprint import bit_patterns, fingerprints
from ..gradients.finiteness import mark_non_finite, new_flag
from .accumulation import MicroBatchIsolation
from .attribution import Outcome
from .environment import RngState, deterministic_kernels, seed_all

ComputeLoss = Callable[[nn.Module, Any], torch.Tensor]


def loss_bits(loss: torch.Tensor) -> int:
    """The raw bit pattern of a scalar loss in its own dtype, as a Python int (sign-extended)."""
    return int(bit_patterns(loss.detach().reshape(-1)[:1].contiguous()).item())


def table_words(table: torch.Tensor) -> tuple[int, int]:
    """Two signed 64-bit words of a hash of a fingerprint table (compact enough to gather)."""
    raw = table.detach().to("cpu", torch.int64).contiguous().reshape(-1).view(torch.uint8)
    digest = hashlib.blake2b(bytes(raw.tolist()), digest_size=16).digest()
    low, high = struct.unpack("<qq", digest)
    return low, high


def outcome_of(loss: torch.Tensor, grad_table: torch.Tensor | None, grads_finite: bool) -> Outcome:
    """Reduce a computation (loss, gradient fingerprint table) to an :class:`Outcome`."""
    loss_finite = bool(torch.isfinite(loss.detach()).all())
    words = table_words(grad_table) if grad_table is not None else (0, 0)
    return Outcome(
        loss_bits=loss_bits(loss), grad_digest=words, finite=loss_finite and grads_finite
    )


def combine_outcomes(outcomes: list[Outcome]) -> Outcome:
    """One outcome for several computations (a step's micro-batches, replayed one by one):
    finite when all are, and equal to another combination exactly when every part is."""
    if len(outcomes) == 1:
        return outcomes[0]
    parts = [(o.loss_bits, *o.grad_digest, int(o.finite)) for o in outcomes]
    digest = hashlib.blake2b(struct.pack(f"<{4 * len(parts)}q", *sum(parts, ())), digest_size=24)
    loss, low, high = struct.unpack("<qqq", digest.digest())
    return Outcome(loss_bits=loss, grad_digest=(low, high), finite=all(o.finite for o in outcomes))


def micro_batch_loss(loss: torch.Tensor, grad_accum: int) -> torch.Tensor:
    """One micro-batch's share of the step's loss: ``loss / grad_accum`` (``loss`` itself
    without accumulation: no extra operation, so a plain step is unchanged). Training and
    replays both call it, so both run the same operation on the same value."""
    return loss / grad_accum if grad_accum > 1 else loss


def scaled_for_backward(loss: torch.Tensor, scaler: Any | None) -> torch.Tensor:
    """``loss`` times the GradScaler's current scale (``scaler.scale``), or as is without one."""
    return scaler.scale(loss) if scaler is not None else loss


def accumulated_at_start_error(step: int, detail: str = "") -> RuntimeError:
    """The refusal of an audit step whose gradients start accumulated (``detail``, if any,
    follows "already accumulated"): one micro-batch's replay cannot reproduce them."""
    return RuntimeError(
        f"sdc_agent: audit step {step} starts with gradients already accumulated{detail}: the "
        "replay audit recomputes one micro-batch per rank and step, so gradient accumulation "
        "outside the guard (no_sync micro-steps before guard.step) cannot be audited. Zero the "
        "gradients before each step (optimizer.zero_grad(set_to_none=True)) and accumulate "
        "inside the step with Schedule(grad_accum=N) and GuardedStep.micro_batches, or disable "
        "audits with Schedule(audit_every=0)"
    )


class Replayer:
    """Runs replays of any rank's micro-batch on the bare module of a DDP model."""

    def __init__(
        self,
        module: nn.Module,
        params: list[nn.Parameter],
        compute_loss: ComputeLoss,
        *,
        grad_accum: int = 1,
        scaler: Any | None = None,
        divide_loss: bool = True,
    ) -> None:
        """``params`` is the ordered list whose gradients are fingerprinted (the guard's table);
        ``grad_accum``, ``scaler`` and ``divide_loss`` say how training back-propagated each
        micro-batch's loss (:func:`micro_batch_loss`, :func:`scaled_for_backward`; with
        ``divide_loss`` False, ``compute_loss`` already returns the micro-batch's share)."""
        self.module = module
        self.params = params
        self.compute_loss = compute_loss
        self.grad_accum = grad_accum
        self.scaler = scaler
        self.loss_divisor = grad_accum if divide_loss else 1
        """What each micro-batch's loss is divided by before its backward (1: as is)."""
        self.forward_buffers: list[torch.Tensor] | None = None
        """Buffers as they were when this step's training forward began (None: use current)."""
        self.last_table: torch.Tensor | None = None
        """The table the last replay's outcome digested (its local gradient fingerprints, or
        local events in order), None without deterministic kernels; check 2 gathers it when
        ranks that compute together disagree (:meth:`~.audit.RingAudit.audit`)."""
        self.zero_grads_at_start: list[bool] | None = None
        """Per parameter: the step began with a zero gradient tensor (``zero_grad(set_to_none=
        False)``) rather than None. A replay starts the same way: 0 + (-0.0) is +0.0, so the
        bits of the accumulated gradient depend on it. None: every gradient started as None."""

    def note_gradients_at_start(self, step: int) -> None:
        """Record how the step's gradients start; refuse gradients accumulated from earlier
        micro-batches, which a replay of one micro-batch cannot reproduce."""
        grads = [p.grad for p in self.params]
        present = [g for g in grads if g is not None]
        if not present:
            self.zero_grads_at_start = None
            return
        nonzero = int(torch.stack([torch.count_nonzero(g) for g in present]).sum())  # one sync
        if nonzero:
            raise accumulated_at_start_error(step, f" ({nonzero} non-zero elements)")
        self.zero_grads_at_start = [g is not None for g in grads]

    def micro_batch_isolation(self) -> MicroBatchIsolation:
        """What isolates the audited micro-batch's local gradient in training (accumulation):
        hooks on the tensors whose gradient a replay fingerprints, here the parameters."""
        return MicroBatchIsolation(self.params)

    def snapshot_buffers(self) -> None:
        """Remember the module's buffers as they are now (called just before the training forward)."""
        self.forward_buffers = [b.detach().clone() for b in self.module.buffers()]

    @contextlib.contextmanager
    def state_set_aside(self) -> Iterator[None]:
        """Set the gradients, buffers and RNG aside for a replay and put them back after it.

        Inside, the buffers hold what they held when the step's forward began (when
        :meth:`snapshot_buffers` ran); on exit the parameters' gradients, the buffers and the RNG
        are what they were on entry, so training continues as if no replay had happened."""
        saved_grads = [p.grad for p in self.params]
        buffers = list(self.module.buffers())
        saved_buffers = [b.detach().clone() for b in buffers]
        saved_rng = RngState.capture()
        try:
            if self.forward_buffers is not None:
                with torch.no_grad():
                    for buf, value in zip(buffers, self.forward_buffers, strict=True):
                        buf.copy_(value)
            yield
        finally:
            for p, g in zip(self.params, saved_grads, strict=True):
                p.grad = g
            with torch.no_grad():
                for buf, value in zip(buffers, saved_buffers, strict=True):
                    buf.copy_(value)
            saved_rng.restore()

    def replay(self, batch: Any, *, seed: int, deterministic: bool) -> Outcome:
        """Recompute ``batch`` with RNG ``seed``; restore grads, buffers and RNG afterwards.

        With accumulation the outcome is the micro-batch's own: its ``loss / grad_accum`` and
        the gradient of that alone (from no gradient), as :mod:`.accumulation`
        isolates it in training."""
        with self.state_set_aside():
            for p in self.params:
                p.grad = None
            produced = ProducedGradients(
                self.params, fingerprint=deterministic, zero_start=self.zero_grads_at_start
            )
            seed_all(seed)
            with deterministic_kernels(deterministic), produced:
                loss = micro_batch_loss(self.compute_loss(self.module, batch), self.loss_divisor)
                scaled_for_backward(loss, self.scaler).backward()
            self.last_table, finite = produced.finish()
            return outcome_of(loss, self.last_table, finite)


class ProducedGradients:
    """Reduces a replay's gradients to what its outcome compares AS AUTOGRAD PRODUCES THEM, and
    drops each one then, so a replay never holds the gradients of the whole model (issue 31,
    bounded memory): while active (``with``), a post-accumulate hook on each parameter takes
    that gradient's fingerprint row (``fingerprint``: deterministic replays) and raises the
    replay's non-finite flag, then sets ``param.grad`` to None. :meth:`finish` covers the
    parameters whose gradient never arrived (unused in the forward) and returns the table and
    the finiteness, exactly ``fingerprints(grads)`` and ``all_finite(grads)`` of the gradients
    a full backward leaves (``fingerprints``' row i is ``fingerprint(tensors[i])``; the flag is
    element by element).

    ``zero_start`` (per parameter, :attr:`Replayer.zero_grads_at_start`): the step began with a
    zero gradient tensor, so training's gradient is ``0 + g`` (autograd adds into it, and
    ``+0.0 + -0.0`` is ``+0.0``). The replay does not allocate those zeros for the whole model:
    it starts from None and adds ``+0.0`` to each gradient in place as it arrives, the same
    bits (IEEE addition commutes); a parameter whose gradient never arrives would have kept its
    zeros, whose fingerprint is ``fingerprint(None)``'s (0, 0) and which are finite.

    A parameter whose gradient is accumulated twice in one backward (a reentrant activation
    checkpoint around a shared weight) raises: its first part is gone, so its fingerprint could
    not be the accumulated one (as the FSDP2 replay, :mod:`.collective`)."""

    def __init__(
        self,
        params: list[nn.Parameter],
        *,
        fingerprint: bool,
        zero_start: list[bool] | None = None,
    ) -> None:
        """``params``: the fingerprint table's parameters, in its row order; ``zero_start``:
        see the class docstring (None: every gradient started as None)."""
        if zero_start is not None and len(zero_start) != len(params):
            raise ValueError(f"zero_start: {len(zero_start)} entries for {len(params)} parameters")
        self.params = params
        self.fingerprint = fingerprint
        self.zero_start = zero_start
        self.rows: list[torch.Tensor | None] = [None] * len(params)
        self.seen = [False] * len(params)
        self.flag: torch.Tensor | None = None
        self._handles: list[Any] = []

    def _take(self, index: int, grad: torch.Tensor) -> None:
        if self.fingerprint:
            self.rows[index] = fingerprints([grad])[0]
        if self.flag is None:
            self.flag = new_flag(grad.device)
        mark_non_finite([grad], self.flag)

    def _hook(self, index: int) -> Callable[[torch.Tensor], None]:
        def produced(param: torch.Tensor) -> None:
            if self.seen[index]:
                raise RuntimeError(
                    "sdc_agent: a replay's backward accumulated a parameter's gradient twice "
                    f"(shape {tuple(param.shape)}; a reentrant activation checkpoint around a "
                    "shared weight?): the replay drops each gradient once fingerprinted and "
                    "cannot compare the accumulated one; use "
                    "torch.utils.checkpoint(..., use_reentrant=False)"
                )
            self.seen[index] = True
            if param.grad is not None:
                if self.zero_start is not None and self.zero_start[index]:
                    param.grad.add_(0.0)  # 0 + g, as into training's zero tensor
                self._take(index, param.grad)
            param.grad = None

        return produced

    def __enter__(self) -> ProducedGradients:
        self._handles = [
            p.register_post_accumulate_grad_hook(self._hook(i)) for i, p in enumerate(self.params)
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def finish(self) -> tuple[torch.Tensor | None, bool]:
        """(the fingerprint table, None unless ``fingerprint``; whether every gradient was
        finite). One sync: the flag's read."""
        for index, param in enumerate(self.params):
            if not self.seen[index] and param.grad is not None:
                self._take(index, param.grad)
        table = None
        if self.fingerprint:
            present = [r for r in self.rows if r is not None]
            if present:
                zero = torch.zeros(2, dtype=torch.int64, device=present[0].device)
                table = torch.stack([zero if r is None else r for r in self.rows])
            else:
                table = torch.zeros((len(self.rows), 2), dtype=torch.int64)
        return table, self.flag is None or not bool(self.flag)
