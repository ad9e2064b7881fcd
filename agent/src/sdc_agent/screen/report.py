"""A screen's result as its ``sdc.screen/v1`` JSON document, within the termination message's
bound.

Kubernetes keeps at most :data:`~sdc_contract.screen.TERMINATION_MESSAGE_BYTES` (4096) bytes of
a container's termination message and silently drops the rest, which would leave the pipeline a
document it cannot parse. So :func:`document` makes the whole document and, only when its
compact JSON is over the bound, cuts lists in order of how little the pipeline needs them, each
to the longest part that fits, and counts what it cut in ``<list>_omitted`` beside the list
(the contract's rule, :data:`~sdc_contract.screen.SCREEN_KEYS`):

1. ``exercised.ops`` (the labels; ``exercised.kinds`` and the counts stay);
2. ``inconclusive_ops``;
3. every device's ``ops`` (the labels it mismatched; its ``mismatches`` count stays);
4. ``not_exercised``;
5. ``devices``, those named (``reproduced``, ``suspect``) kept before those that agree.

The verdict, the summary, the environment and every named device's index and UUID fit in any
realistic case; long text (an exception's message) is cut to a bound first and says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sdc_contract.screen import SCREEN_SCHEMA, TERMINATION_MESSAGE_BYTES

from .runner import DeviceResult, ScreenResult

MAX_TEXT_CHARS = 1024
"""The longest ``summary`` or ``error`` kept whole (a longer one is cut and marked)."""
MAX_FIELD_CHARS = 200
"""The longest environment value or device UUID kept whole."""
_CUT = "...(cut)"
_NAMED = ("reproduced", "suspect")


def _text(value: str, limit: int) -> str:
    """``value``, or its first characters marked as cut when it is longer than ``limit``."""
    return value if len(value) <= limit else value[: limit - len(_CUT)] + _CUT


def _device(result: DeviceResult) -> dict[str, Any]:
    return {
        "index": result.device.index,
        "uuid": _text(result.device.uuid, MAX_FIELD_CHARS),
        "status": result.status,
        "mismatches": result.mismatches,
        "ops": list(result.ops),
        "digest": result.digest,
    }


def full_document(result: ScreenResult) -> dict[str, Any]:
    """The whole document, nothing cut (it may be over the termination message's bound)."""
    environment = None
    if result.environment is not None:
        environment = {
            k: _text(v, MAX_FIELD_CHARS) for k, v in result.environment.as_dict().items()
        }
    return {
        "schema": SCREEN_SCHEMA,
        "verdict": result.verdict,
        "summary": _text(result.summary, MAX_TEXT_CHARS),
        "devices": [_device(d) for d in result.devices],
        "exercised": dict(result.exercised),
        "not_exercised": list(result.not_exercised),
        "inconclusive_ops": list(result.inconclusive_ops),
        "golden": dict(result.golden),
        "environment": environment,
        "durations_s": dict(result.durations_s),
        "error": None if result.error is None else _text(result.error, MAX_TEXT_CHARS),
    }


def dumps(doc: dict[str, Any]) -> str:
    """The document's compact JSON text (what the termination message holds)."""
    return json.dumps(doc, separators=(",", ":"))


def size(doc: dict[str, Any]) -> int:
    """The document's size in bytes as :func:`dumps` writes it (UTF-8)."""
    return len(dumps(doc).encode())


def _largest(fits: Callable[[int], bool], high: int) -> int:
    """The largest n in [0, high] with ``fits(n)`` (``fits`` is monotone), or 0 when none is."""
    low = 0
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def _cut_list(doc: dict[str, Any], owner: dict[str, Any], key: str, limit: int) -> None:
    """Keep the longest prefix of ``owner[key]`` with which ``doc`` fits; count the rest."""
    whole = list(owner[key])

    def keep(n: int) -> None:
        owner[key] = whole[:n]
        if n < len(whole):
            owner[f"{key}_omitted"] = len(whole) - n
        else:
            owner.pop(f"{key}_omitted", None)

    def fits(n: int) -> bool:
        keep(n)
        return size(doc) <= limit

    keep(_largest(fits, len(whole)))


def _cut_device_ops(doc: dict[str, Any], limit: int) -> None:
    """Keep at most the same number of op labels on every device, as many as fit."""
    devices: list[dict[str, Any]] = doc["devices"]
    whole = [list(d["ops"]) for d in devices]

    def keep(n: int) -> None:
        for device, ops in zip(devices, whole, strict=True):
            device["ops"] = ops[:n]
            if n < len(ops):
                device["ops_omitted"] = len(ops) - n
            else:
                device.pop("ops_omitted", None)

    def fits(n: int) -> bool:
        keep(n)
        return size(doc) <= limit

    keep(_largest(fits, max((len(ops) for ops in whole), default=0)))


def _cut_devices(doc: dict[str, Any], limit: int) -> None:
    """Keep as many devices as fit, the named ones first, listed by index."""
    whole: list[dict[str, Any]] = doc["devices"]
    # Stable: named devices first, each group in index order.
    ranked = sorted(whole, key=lambda d: d["status"] not in _NAMED)

    def keep(n: int) -> None:
        doc["devices"] = sorted(ranked[:n], key=lambda d: d["index"])
        if n < len(whole):
            doc["devices_omitted"] = len(whole) - n
        else:
            doc.pop("devices_omitted", None)

    def fits(n: int) -> bool:
        keep(n)
        return size(doc) <= limit

    keep(_largest(fits, len(whole)))


def fit(doc: dict[str, Any], limit: int = TERMINATION_MESSAGE_BYTES) -> dict[str, Any]:
    """``doc`` cut (in place, and returned) until its JSON is at most ``limit`` bytes (module
    docstring); ValueError when even the cut document is over (a bound set far too low)."""
    if size(doc) <= limit:
        return doc
    exercised = doc.get("exercised")
    if isinstance(exercised, dict) and isinstance(exercised.get("ops"), list):
        _cut_list(doc, exercised, "ops", limit)
    if size(doc) > limit:
        _cut_list(doc, doc, "inconclusive_ops", limit)
    if size(doc) > limit:
        _cut_device_ops(doc, limit)
    if size(doc) > limit:
        _cut_list(doc, doc, "not_exercised", limit)
    if size(doc) > limit:
        _cut_devices(doc, limit)
    if size(doc) > limit:
        raise ValueError(f"the screen's result is {size(doc)} bytes even cut, over {limit}")
    return doc


def document(result: ScreenResult, limit: int = TERMINATION_MESSAGE_BYTES) -> dict[str, Any]:
    """The result's ``sdc.screen/v1`` document, cut to fit ``limit`` bytes of JSON."""
    return fit(full_document(result), limit)


__all__ = ["MAX_FIELD_CHARS", "MAX_TEXT_CHARS", "document", "dumps", "fit", "full_document", "size"]
