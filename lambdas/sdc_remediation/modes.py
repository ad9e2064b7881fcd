"""Per check x verdict modes: ``enforce`` (cordon, health check, approval, replace) or
``shadow`` (localize, admit as shadow, notify "would have cordoned", record; nothing touched).

One table for infra (the ``checkModes`` context key, validated at synth) and the functions
(``CHECK_MODES``, the same JSON object). Standard library only: infra imports it without the
Lambda runtime's dependencies.

Keys are ``<check>/<verdict>`` (``compute/persistent``), ``<check>/*`` (every verdict of a
check) or ``*`` (everything else); the most specific key wins, and without any the mode is
``enforce`` (what the pipeline did before modes existed). The checks are the agent's
(``compute``, ``reduced_gradient``, ``weights``); verdicts are the names localize gives
(``persistent``, ``transient``, ``culprit``, ``nonfinite``, ``unattributable``, ``unclear``,
``weights_minority``, ``named``), any lower-case word is accepted so a verdict a newer agent
adds can be configured before it first fires.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Literal

Mode = Literal["enforce", "shadow"]
MODES: tuple[str, ...] = ("enforce", "shadow")
CHECKS: tuple[str, ...] = ("compute", "reduced_gradient", "weights")
"""The agent's checks (the ``check`` of an ``sdc.alarm/v1`` report)."""
DEFAULT_MODE: Mode = "enforce"
ANY = "*"
_VERDICT = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


def parse_modes(value: Any) -> dict[str, Mode]:
    """Validate a modes table (a JSON object, or its text); ValueError names the bad entry."""
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return {}
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"invalid JSON object: {exc}") from None
    if not isinstance(value, Mapping):
        raise ValueError(
            'expected an object like {"*": "shadow", "compute/persistent": "enforce"}, '
            f"got {value!r}"
        )
    table: dict[str, Mode] = {}
    for key, mode in value.items():
        if not isinstance(key, str) or not _valid_key(key):
            raise ValueError(
                f"{key!r} is not '<check>/<verdict>', '<check>/*' or '*' "
                f"(checks: {', '.join(CHECKS)}; verdicts: lower-case words like persistent)"
            )
        if mode not in MODES:
            raise ValueError(f"{key}: mode must be one of {', '.join(MODES)}, got {mode!r}")
        table[key] = mode
    return table


def _valid_key(key: str) -> bool:
    if key == ANY:
        return True
    check, sep, verdict = key.partition("/")
    return bool(sep) and check in CHECKS and (verdict == ANY or bool(_VERDICT.match(verdict)))


def mode_for(table: Mapping[str, str], check: str, verdict: str) -> Mode:
    """The mode of one check x verdict: exact key, else ``<check>/*``, else ``*``, else
    ``enforce``."""
    for key in (f"{check}/{verdict}", f"{check}/{ANY}", ANY):
        if key in table:
            return table[key]  # type: ignore[return-value]
    return DEFAULT_MODE


__all__ = ["ANY", "CHECKS", "DEFAULT_MODE", "MODES", "Mode", "mode_for", "parse_modes"]
