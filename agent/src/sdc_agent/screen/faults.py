"""Fault injection for the screen: TESTS AND DEMOS ONLY.

A fault is an :data:`sdc_agent.screen.ops.OutputHook` attached to one (simulated) device: it
sees every op's outputs on that device before they are fingerprinted and may change them, as
a bad GPU would. Nothing in a real screen attaches one; the CLI does only when asked with
``--simulate N --fault DEVICE:FAULT[:PROBABILITY]`` (simulated CPU devices only), so a harness (the tests, the local demo, a
Lambda rehearsal) can run the screen as a real process and watch it name the device:

- ``gemm-x1000``: multiply one output element (the middle one; a zero becomes 1000) of the first
  GEMM shape the device computes by 1000, on every call.
- ``reduction-bitflip``: flip bit 0 (one ulp) of one element of the first reduction's result.
- ``<kind>-x1000`` / ``<kind>-bitflip`` for any op kind (``sdpa``, ``norm``, ``rmsnorm``,
  ``softmax``, ``reduction``, ``gemm``, ``collective``): the same on that kind's first shape.
- ``any-x1000`` / ``any-bitflip``: every op of every kind (each output list's first tensor).
- ``:P`` (0 < P <= 1): the fault fires on a fraction P of the calls it would fire on (a call:
  one op's outputs it targets), drawn from ``random.Random(seed)``: an intermittent fault that
  is the same in every run with the same seed (``--fault-seed``) and device.

This module is never imported by a screen without a fault (the runner takes hooks; the CLI
imports this module only for ``--fault``).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field

import torch

from sdc_contract.screen import OP_KINDS, OpSpec

from ..fingerprint import bit_patterns
from .ops import OutputHook

EFFECTS = ("x1000", "bitflip")
"""How a fault changes the element it hits."""
TARGETS: tuple[str, ...] = (*OP_KINDS, "any")
"""Which ops a fault hits: the first shape of one kind, or every op (``any``)."""


def _hit(tensor: torch.Tensor, effect: str) -> None:
    """Change the middle element of ``tensor`` in place (a zero scaled by 1000 becomes 1000)."""
    flat = tensor.reshape(-1)
    i = flat.numel() // 2
    if effect == "x1000":
        value = flat[i].item()
        flat[i] = value * 1000.0 if value != 0 else 1000.0
    else:
        bits = bit_patterns(tensor)
        bits[i] = bits[i] ^ 1


@dataclass
class Fault:
    """One fault on one device's outputs (an :data:`OutputHook`)."""

    target: str
    """An op kind (its first shape is hit) or ``any`` (every op)."""
    effect: str
    """``x1000`` or ``bitflip``."""
    probability: float = 1.0
    """The fraction of the calls it fires on."""
    seed: int = 0
    """Seeds the draw of those calls."""
    fired: int = 0
    """How many times it changed an output (the tests read it)."""
    calls: int = 0
    """How many calls it targeted."""
    _label: str | None = None
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        """Check the fields and seed the draw."""
        if self.target not in TARGETS:
            raise ValueError(f"fault target must be one of {list(TARGETS)}, got {self.target!r}")
        if self.effect not in EFFECTS:
            raise ValueError(f"fault effect must be one of {list(EFFECTS)}, got {self.effect!r}")
        if not 0 < self.probability <= 1:
            raise ValueError(f"fault probability must be in (0, 1], got {self.probability}")
        self._rng = random.Random(self.seed)

    def _targets(self, spec: OpSpec) -> bool:
        if self.target == "any":
            return True
        if spec.kind != self.target:
            return False
        if self._label is None:
            self._label = spec.label()
        return spec.label() == self._label

    def __call__(self, spec: OpSpec, outputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The outputs, one element of the first changed when the fault fires."""
        if not outputs or not self._targets(spec):
            return outputs
        self.calls += 1
        if self.probability < 1 and self._rng.random() >= self.probability:
            return outputs
        self.fired += 1
        first = outputs[0].contiguous().clone()
        _hit(first, self.effect)
        return [first, *outputs[1:]]


def parse_fault(text: str, seed: int = 0) -> tuple[int, Fault]:
    """``DEVICE:TARGET-EFFECT[:PROBABILITY]`` (``2:gemm-x1000``, ``0:any-bitflip:0.1``) as the
    device index and its fault; ValueError says what is wrong."""
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"expected DEVICE:TARGET-EFFECT[:PROBABILITY], got {text!r}")
    device_text, name = parts[0], parts[1]
    if not device_text.isdigit():
        raise ValueError(f"the device must be an index (0, 1, ...), got {device_text!r}")
    target, _, effect = name.rpartition("-")
    probability = 1.0
    if len(parts) == 3:
        try:
            probability = float(parts[2])
        except ValueError:
            raise ValueError(f"the probability must be a number, got {parts[2]!r}") from None
    return int(device_text), Fault(target, effect, probability=probability, seed=seed)


def hooks(specs: list[str], seed: int = 0) -> dict[int, OutputHook]:
    """The hooks of ``--fault`` specs by device (one fault per device); each fault's draw
    is seeded by ``seed`` and its device. ValueError for a bad spec or a device given twice."""
    found: dict[int, OutputHook] = {}
    for text in specs:
        index, fault = parse_fault(text)
        if index in found:
            raise ValueError(f"device {index} has two faults; one per device")
        found[index] = dataclasses.replace(fault, seed=seed * 1000 + index)
    return found


__all__ = ["EFFECTS", "TARGETS", "Fault", "hooks", "parse_fault"]
