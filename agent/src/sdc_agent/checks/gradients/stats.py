"""Check 1's per-step record: what the gradient taps saw of this rank's local and reduced gradient.

The DDP comm hook (:mod:`.comm_hook`) and the post-accumulate-grad taps of a wrapper without one
(FSDP2, :mod:`.taps`) write into the same :class:`GradStatsState`, so the flag exchange
(:mod:`.exchange`) does not know which of them ran.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.distributed as dist

from ...fingerprint import fingerprints

ReducedTap = Callable[[dist.GradBucket, torch.Tensor], None]
"""``tap(bucket, reduced)``: sees each reduced bucket (DDP) or reduced shard (FSDP2)."""


class LocalOrigin(Protocol):
    """Where a non-finite value started, when a rank's local gradient can be non-finite because
    of what it RECEIVED (a pipeline stage: activations from the stage before, gradients from
    the stage after). Check 1 then names only the rank where the non-finite value began."""

    def flags(self) -> torch.Tensor:
        """This step's flags (float32, on the gradients' device), read with check 1's own."""
        ...

    def started_here(self, gradient_bad: bool, flags: list[float]) -> bool:
        """Whether a non-finite value started on this rank, from the values of :meth:`flags`
        and whether its local gradient was non-finite."""
        ...


@dataclass
class GradStatsState:
    """What check 1's taps recorded this step; one per guarded model (and one per FSDP2 replay)."""

    process_group: dist.ProcessGroup | None
    """Group the gradients are averaged over (None: WORLD), as for torch's own hooks."""
    param_index: dict[int, int]
    """``id(parameter)`` -> row of that parameter in the guard's fingerprint tables."""
    capture_fingerprints: bool = False
    """Set by the guard on audit steps, before the forward pass."""
    local_flags: list[torch.Tensor] = field(default_factory=list)
    """Per bucket (DDP) or tapped parameter (FSDP2) of this step: one float32 element, nonzero when the LOCAL gradient (before the
    all-reduce) held a NaN/Inf."""
    reduced_sums: list[torch.Tensor] = field(default_factory=list)
    """Per bucket of this step: float32 sum of the REDUCED gradient (appended as each bucket's
    all-reduce completes, possibly on a communication thread; list.append is atomic)."""
    local_fingerprints: torch.Tensor | None = None
    """[num_params, 2] int64 fingerprints of the local gradients (audit steps only)."""
    reduced_taps: list[ReducedTap] = field(default_factory=list)
    """Callables that see each reduced bucket (used by fault drills; empty in production)."""
    records_events: bool = False
    """Whether the taps also record :attr:`local_events` (set by the adapter that installs
    them: tensor parallel)."""
    local_events: list[torch.Tensor] | None = None
    """This rank's LOCAL results in the order it computed them ([2] int64 fingerprints: module
    outputs before a collective mixes them, each local gradient as autograd stores it), on steps
    that capture fingerprints when :attr:`records_events`; else None."""
    local_event_keys: list[tuple[int, int] | None] = field(default_factory=list)
    """Per local event: (group, order) for a gradient of one module's parameters, else None."""
    local_origin: LocalOrigin | None = None
    """Says where a non-finite local gradient started (pipeline stages); None: on this rank."""
    stage_of: dist.ProcessGroup | bool | None = False
    """The group whose ranks hold the other stages of this rank's pipeline (None: WORLD), when
    this rank holds one stage of a model (its gradient norm is then one part of the model's);
    False: this rank's gradient is the whole model's."""
    flagged_rows: set[int] = field(default_factory=set)
    """Rows whose local gradient already raised this step's flag (a pipeline's micro-batches
    each back-propagate into the same parameters: one entry per row and step, not per pass)."""
    fingerprinted_rows: set[int] = field(default_factory=set)
    """Rows already fingerprinted since the capture began: a later pass folds into the row."""

    def arm(self, *, capture_fingerprints: bool, device: torch.device) -> None:
        """Reset the per-step statistics before a forward pass."""
        self.local_flags = []
        self.reduced_sums = []
        self.flagged_rows = set()
        self.capture_fingerprints = capture_fingerprints
        self.fingerprinted_rows = set()
        self.local_fingerprints = (
            torch.zeros((len(self.param_index), 2), dtype=torch.int64, device=device)
            if capture_fingerprints
            else None
        )
        self.local_events = [] if capture_fingerprints and self.records_events else None
        self.local_event_keys = []

    def add_local_event(
        self, fingerprint: torch.Tensor, *, group: int | None = None, order: int = 0
    ) -> None:
        """Record one local result ([2] int64) in :attr:`local_events`, if they are recorded.

        ``group``: the result is the gradient of one of a module's parameters (``order``: its
        row). One backward node produces a module's parameter gradients at once, and autograd
        accumulates them in an order that depends on how the node was computed (a protected
        layer's own backward, or ``F.linear``'s, when a sensor does not check at that step),
        so a run of one module's gradients is kept in row order: the same in training and in a
        replay, whichever computed it."""
        events, keys = self.local_events, self.local_event_keys
        if events is None:
            return
        events.append(fingerprint)
        keys.append(None if group is None else (group, order))
        i = len(events) - 1
        while i > 0 and group is not None:
            previous = keys[i - 1]
            if previous is None or previous[0] != group or previous[1] < order:
                break
            events[i - 1], events[i] = events[i], events[i - 1]
            keys[i - 1], keys[i] = keys[i], keys[i - 1]
            i -= 1

    def local_table(self) -> torch.Tensor | None:
        """What check 2 compares of this rank's computation: its local events in order when
        recorded ([events, 2] int64), else the per-parameter local gradient fingerprints
        (None when nothing was captured)."""
        if self.local_events is None:
            return self.local_fingerprints
        if not self.local_events:
            return torch.zeros((0, 2), dtype=torch.int64)
        return torch.stack(self.local_events)

    def restart_fingerprints(self, device: torch.device) -> None:
        """Capture the local gradients' fingerprints from now on into a fresh table (a pipeline
        step audited under accumulation: its own backward passes only)."""
        self.capture_fingerprints = True
        self.fingerprinted_rows = set()
        self.local_fingerprints = torch.zeros(
            (len(self.param_index), 2), dtype=torch.int64, device=device
        )

    def record_local_fingerprint(self, row: int, fingerprint: torch.Tensor) -> None:
        """Write ``fingerprint`` ([2] int64) as ``row``'s, or, when the row was fingerprinted
        already in this capture (a pipeline schedule's micro-batches each reach the
        parameters), fold it in: the row becomes the fingerprint of (previous, new), which
        depends on every pass and on their order, the same in training and in a replay."""
        table = self.local_fingerprints
        if table is None:
            return
        fingerprint = fingerprint.to(table.device)
        if row in self.fingerprinted_rows:
            fingerprint = fingerprints([torch.stack([table[row], fingerprint])])[0]
        else:
            self.fingerprinted_rows.add(row)
        table[row] = fingerprint
