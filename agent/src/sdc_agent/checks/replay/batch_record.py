"""The batch travels with its audit: what each micro-batch's forward was fed, as a digest.

A replay only proves something about a GPU when it recomputes the very micro-batch the target
trained on. An ordinary mistake in the user's ``rebuild_batch`` (off by one step, an unseeded
loader, a resume that did not shift it, a data bug on one rank) makes the replay compute another
batch, and its result then differs from the target's for reasons that have nothing to do with
hardware. So each rank records what its module's forward received while it trained a
micro-batch that may be replayed (audit and seeded steps), and every replay records what the
same forward received from the rebuilt batch; the audit compares the two digests before it
compares any result (:mod:`.setup`). A mismatch is the job's set-up, never a GPU.

What is recorded is the root module's forward inputs (positional and keyword), through a
forward pre-hook: the one place every training loop (``Guard.train``, a loop of your own, the
framework integrations) and every replay pass through. Tensors are fingerprinted on their device
(:func:`sdc_agent.fingerprint.fingerprints`: raw bits, the same on any device), together with
their dtype and shape; other leaves (ints, strings, flags) by their text. The device tables are
read back only when a digest is asked for, which happens on audit steps. Labels that a
``compute_loss`` takes from the batch without passing them to the model are not part of the
digest (a mismatch there still shows as a mismatched loss).

The same hooks say whether a replay's ``compute_loss`` ran the training wrapper (DDP) instead of
the bare module it was given: the replay would then run DDP's gradient hooks, and its result would
not be a replay of the target's computation.
"""

from __future__ import annotations

import contextlib
import hashlib
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from ...fingerprint import fingerprints

_MASK63 = (1 << 63) - 1


@dataclass
class ForwardInputs:
    """What the root module's forward calls of one computation received, not yet read back."""

    tables: list[torch.Tensor] = field(default_factory=list)
    """One fingerprint table per forward call ([tensors, 2] int64, on the tensors' device)."""
    text: list[str] = field(default_factory=list)
    """Per forward call: the dtypes and shapes of its tensors and the text of its other leaves."""

    def add(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Record one forward call's inputs (queues device work only)."""
        leaves, spec = tree_flatten((args, kwargs))
        tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        parts = [str(spec)]
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                parts.append(f"T{leaf.dtype}{tuple(leaf.shape)}")
            elif leaf is None or isinstance(leaf, (bool, int, float, str, bytes)):
                parts.append(repr(leaf))
            else:
                parts.append(type(leaf).__name__)  # an object (a cache, a config): its kind only
        self.text.append("|".join(parts))
        with torch.no_grad():
            self.tables.append(fingerprints(tensors))

    def digest(self) -> int:
        """A non-zero 63-bit digest of everything recorded (reads the tables back: a sync);
        0 when no forward ran."""
        if not self.text:
            return 0
        h = hashlib.blake2b(digest_size=8)
        for text, table in zip(self.text, self.tables, strict=True):
            h.update(text.encode())
            h.update(table.detach().to("cpu", torch.int64).contiguous().numpy().tobytes())
        return combine_digests([struct.unpack("<q", h.digest())[0]])


def _plain(batch: Any) -> Any:
    """``batch`` with mappings that torch's pytree does not open (a Hugging Face
    ``BatchEncoding`` is a ``UserDict``) turned into dicts, so their tensors are fingerprinted."""
    if isinstance(batch, Mapping):
        return {key: _plain(value) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
        return type(batch)(_plain(value) for value in batch)
    return batch


def batch_digest(batch: Any) -> int:
    """A non-zero digest of a whole micro-batch as ``compute_loss`` receives it: every tensor's
    bits, dtype and shape, and the text of the other leaves, labels included (a sync: the
    tables are read back at once). Replays take it of what ``rebuild_batch`` returned, so that
    two ranks' rebuilds of one target's batch can be compared even where the labels never reach
    the module's forward."""
    inputs = ForwardInputs()
    inputs.add((_plain(batch),), {})
    return inputs.digest()


def combine_digests(digests: Sequence[int]) -> int:
    """One non-zero digest for several (a step's micro-batches, in order); 0 when any is 0
    (unknown: nothing to compare)."""
    if not digests or any(d == 0 for d in digests):
        return 0
    if len(digests) == 1:
        return (digests[0] & _MASK63) | 1
    packed = struct.pack(f"<{len(digests)}q", *digests)
    value = struct.unpack("<q", hashlib.blake2b(packed, digest_size=8).digest())[0]
    return (value & _MASK63) | 1


class BatchRecorder:
    """Records what the module's forward was fed in training and in each replay (see the module
    docstring). One per audit; the hooks stay registered for the module's life."""

    def __init__(self, module: nn.Module, wrapper: nn.Module | None) -> None:
        """``module``: what replays run (the bare module); ``wrapper``: what training runs
        (DDP's wrapper), when it is another module."""
        self.trained: dict[int, ForwardInputs] = {}
        """Per micro-batch position of the current step: what its training forward received."""
        self._sink: ForwardInputs | None = None
        self._replaying = False
        self._wrapper_in_replay = False
        module.register_forward_pre_hook(self._on_module_forward, with_kwargs=True)
        if wrapper is not None and wrapper is not module:
            wrapper.register_forward_pre_hook(self._on_wrapper_forward, with_kwargs=True)

    # ------------------------------------------------------------------ training
    def new_step(self) -> None:
        """Forget the previous step's records."""
        self.trained = {}
        self._sink = None

    def begin_training(self, position: int) -> None:
        """Record what the training forward of micro-batch ``position`` receives."""
        self._sink = self.trained.setdefault(position, ForwardInputs())

    def end_training(self) -> None:
        """Stop recording the training forward."""
        self._sink = None

    def trained_digest(self, positions: Sequence[int]) -> int:
        """The digest of what these micro-batches' training forwards received (0: not recorded)."""
        return combine_digests(
            [self.trained[p].digest() if p in self.trained else 0 for p in positions]
        )

    # ------------------------------------------------------------------ replays
    @contextlib.contextmanager
    def replaying(self) -> Iterator[ReplayCapture]:
        """Record one replay's forward inputs (and whether it ran the training wrapper)."""
        capture = ReplayCapture()
        saved = self._sink, self._replaying, self._wrapper_in_replay
        self._sink, self._replaying, self._wrapper_in_replay = capture.inputs, True, False
        try:
            yield capture
        finally:
            capture.ran_wrapper = self._wrapper_in_replay
            self._sink, self._replaying, self._wrapper_in_replay = saved

    # ------------------------------------------------------------------ hooks
    def _on_module_forward(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        if self._sink is not None:
            self._sink.add(args, kwargs)

    def _on_wrapper_forward(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        if self._replaying:
            self._wrapper_in_replay = True


@dataclass
class ReplayCapture:
    """What one replay's forward calls received."""

    inputs: ForwardInputs = field(default_factory=ForwardInputs)
    ran_wrapper: bool = False
    """``compute_loss`` called the training wrapper instead of the module it was given."""
    alerts: list[str] = field(default_factory=list)
    """Ops deterministic mode warned have no deterministic kernel (filled by the audit)."""


def fed_another_batch(trained: int, replayed: Any) -> bool:
    """Whether a replay consumed another batch than its target trained on (both recorded; an
    outcome without a batch digest, a pipeline's, never did)."""
    batch = getattr(replayed, "batch", 0)
    return bool(trained and batch and trained != batch)
