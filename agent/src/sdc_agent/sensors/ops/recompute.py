"""Recompute comparisons: a checkpointed block's recomputation against its first forward.

With activation checkpointing (``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``,
Hugging Face's ``gradient_checkpointing_enable``, torch's ``checkpoint_wrapper``) a block's
forward runs twice: once in the forward pass, whose activations are dropped, and again during
the backward pass, which recomputes them to compute the gradients. On a healthy GPU the two are
bit for bit the same (the checkpoint restores the RNG and autocast state; the kernels are the
same). A fault in the first forward reaches the loss while the gradients come from clean
activations; a fault in the recompute corrupts the gradients. Either way the two passes differ,
and comparing them costs one fingerprint of each value compared (AEGIS, OSDI 2026, compares
computations a job does twice anyway in the same spirit).

What is compared: the inputs of every module called inside the block, in call order (the
fingerprints of :mod:`sdc_agent.fingerprint`: two 64-bit sums of the raw bits, which any change
of one or two elements moves). The input of a module is the output of the ops before it, so the
comparison covers every op of the block whose result feeds a later module call: the norms, the
attention (including the fused SDPA kernel, unchecked otherwise), the rotary embedding, the
SwiGLU product, the adds. It cannot cover what the recompute does not redo: torch stops a
recompute as soon as it has every tensor the backward needs (``early_stop``), so the block's last
op (usually the second residual add, checked by its own sensor) is not recomputed, nor is what
no later module reads.

How the passes are matched: a module's forward that runs during a backward pass (an autograd
graph task is running) is a recompute. The first such module of a recompute names the block:
itself when it has submodules (``checkpoint_wrapper`` and ``checkpoint(block, ...)`` recompute
the block's own call), else its parent (Hugging Face checkpoints the decoder layer's
``forward``, whose own hooks do not run again). The block's sensor, ``"<block>/recompute"``
(kind ``recompute``), is registered the first time (on the first step, which has nothing to
compare yet); from then on, while it checks, every forward records the fingerprints of the
block's module inputs (a stack per block: micro-batches recompute in reverse order), and the
recompute compares them in order. A mismatch reports +Inf (no rounding is allowed: the two
passes run the same kernels on the same inputs), a match 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn

from ...fingerprint import fingerprints
from .rows import OpSensor, outside_function_modes

MAX_PENDING = 64
"""First-forward records kept per block without a recompute (a forward under ``no_grad`` or
without checkpointing records nothing that is compared): the oldest are dropped beyond this."""

_INF = float("inf")


def in_backward() -> bool:
    """Whether an autograd backward pass is running on this thread (a recompute runs there)."""
    return torch._C._current_graph_task_id() != -1


def _inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The floating-point tensors among a call's arguments (one level into tuples and lists)."""
    found: list[torch.Tensor] = []
    for value in (*args, *kwargs.values()):
        items = value if isinstance(value, (tuple, list)) else (value,)
        found.extend(t for t in items if isinstance(t, torch.Tensor) and t.is_floating_point())
    return found


class SiteLookup(Protocol):
    """What the comparisons need of :class:`.sites.FunctionSensors` (typed by this protocol so
    that this module, which ``sites`` imports, does not import it back)."""

    def site(self, module: str, function: str) -> OpSensor:
        """The sensor of ``function`` in the forward of ``module``."""
        ...

    def ensure_registered(self, site: Any, costs: Callable[[], list[tuple[int, int]]]) -> None:
        """Register ``site`` (one that :meth:`site` returned: a ``sites.Site``, which this
        module cannot name) on the board the first time it runs."""
        ...


class _Record:
    """One forward of a block: the fingerprints of its module inputs, in call order."""

    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries: list[tuple[str, torch.Tensor]] = []


class RecomputeComparisons:
    """Matches each checkpointed block's recompute with its first forward (module docstring);
    driven by :class:`.sites.FunctionSensors`' module hooks."""

    def __init__(self, sites: SiteLookup) -> None:
        """For the blocks of ``sites``' model."""
        self.sites = sites
        self.starts: dict[str, str] = {}
        """The first module a block's recompute calls -> the block's name."""
        self.pending: dict[str, list[_Record]] = {}
        self._recording: tuple[str, _Record] | None = None
        self._comparing: tuple[str, OpSensor, _Record | None, int] | None = None

    @staticmethod
    def _inside(name: str, block: str) -> bool:
        return block == "" or name == block or name.startswith(block + ".")

    def before(
        self,
        name: str,
        module: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        """A module's forward starts (pre-hook): record or compare its inputs."""
        if in_backward():
            self._recomputed(name, module, args, kwargs)
            return
        self._comparing = None
        if self._recording is not None and not self._inside(name, self._recording[0]):
            self._recording = None
        block = self.starts.get(name)
        if block is not None and torch.is_grad_enabled():
            site = self.sites.site(block, "recompute")
            if site.sensing():
                record = _Record()
                stack = self.pending.setdefault(block, [])
                stack.append(record)
                del stack[:-MAX_PENDING]
                self._recording = (block, record)
        if self._recording is not None:
            with torch.no_grad(), outside_function_modes():
                self._recording[1].entries.append((name, fingerprints(_inputs(args, kwargs))))

    def after(self, name: str) -> None:
        """A module's forward ended (forward hook): a block's own end ends its record."""
        if self._recording is not None and name == self._recording[0] and not in_backward():
            self._recording = None

    def _recomputed(
        self, name: str, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        current = self._comparing
        if current is None or name in self.starts or not self._inside(name, current[0]):
            block = self.starts.get(name)
            if block is None:
                # The first recompute of this block: name it and register its sensor.
                has_children = any(True for _ in module.children())
                block = name if has_children else name.rpartition(".")[0]
                self.starts[name] = block
            site = self.sites.site(block, "recompute")
            self.sites.ensure_registered(site, lambda: self._costs(args, kwargs))
            stack = self.pending.get(block)
            record = stack.pop() if stack else None
            current = self._comparing = (block, site, record, 0)
        block, site, record, index = current
        if record is None or not site.checks("forward"):
            return
        self._comparing = (block, site, record, index + 1)
        if index >= len(record.entries):
            ratio = torch.tensor(_INF)  # the recompute called more modules than the forward
        else:
            first_name, first = record.entries[index]
            with torch.no_grad(), outside_function_modes():
                again = fingerprints(_inputs(args, kwargs))
            if first_name != name or first.shape != again.shape:
                ratio = torch.tensor(_INF)  # another module, or other inputs: not the same pass
            else:
                same = torch.equal(first, again) if first.device.type == "cpu" else None
                if same is None:
                    differ = (first != again.to(first.device)).any()
                    ratio = torch.where(differ, _INF, 0.0).float()
                else:
                    ratio = torch.tensor(0.0 if same else _INF)
        site.record("forward", ratio.to(torch.float32))

    def _costs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[int, int]]:
        """Per-row cost of a block's comparisons: about ten module inputs of this width each
        read once per pass; the comparison adds no op of its own to the step."""
        inputs = _inputs(args, kwargs)
        width = max((t.shape[-1] for t in inputs if t.dim()), default=1)
        return [(20 * width, 0)]
