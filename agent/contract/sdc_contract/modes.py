"""Per check x verdict modes: ``enforce`` (cordon, health check, approval, replace) or
``shadow`` (localize, admit as shadow, notify "would have cordoned", record; nothing touched).

One table for infra (the ``checkModes`` context key, validated at synth) and the functions
(``CHECK_MODES``, the same JSON object).

Keys are ``<check>/<verdict>`` (``compute/persistent``), ``<check>/*`` (every verdict of a
check) or ``*`` (everything else); the most specific key wins, and without any the mode is
``enforce`` (what the pipeline did before modes existed). Checks and verdicts are the report's
(``report.CHECKS``, ``report.SUSPECT_VERDICTS``). A verdict outside that list (a newer agent's)
is looked up as ``unknown``, so ``compute/unknown`` is how to set the mode of verdicts this
deployment does not know yet; a key naming any other verdict is refused, since it could never
match.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from ._json import json_object
from .report import CHECKS, SUSPECT_VERDICTS, verdict_name

Mode = Literal["enforce", "shadow"]
MODES: tuple[str, ...] = ("enforce", "shadow")
DEFAULT_MODE: Mode = "enforce"
ANY = "*"


def parse_modes(value: Any) -> dict[str, Mode]:
    """Validate a modes table (a JSON object, or its text); ValueError names the bad entry."""
    value = json_object(value, '{"*": "shadow", "compute/persistent": "enforce"}')
    if value is None:
        return {}
    table: dict[str, Mode] = {}
    for key, mode in value.items():
        if not isinstance(key, str) or not _valid_key(key):
            raise ValueError(
                f"{key!r} is not '<check>/<verdict>', '<check>/*' or '*' "
                f"(checks: {', '.join(CHECKS)}; verdicts: {', '.join(SUSPECT_VERDICTS)})"
            )
        if mode not in MODES:
            raise ValueError(f"{key}: mode must be one of {', '.join(MODES)}, got {mode!r}")
        table[key] = mode
    return table


def _valid_key(key: str) -> bool:
    if key == ANY:
        return True
    check, sep, verdict = key.partition("/")
    return bool(sep) and check in CHECKS and (verdict == ANY or verdict in SUSPECT_VERDICTS)


def mode_for(table: Mapping[str, Mode], check: str, verdict: str) -> Mode:
    """The mode of one check x verdict: exact key, else ``<check>/*``, else ``*``, else
    ``enforce``. A verdict outside the contract's list is looked up as ``unknown``."""
    for key in (f"{check}/{verdict_name(verdict)}", f"{check}/{ANY}", ANY):
        if key in table:
            return table[key]
    return DEFAULT_MODE


__all__ = ["ANY", "DEFAULT_MODE", "MODES", "Mode", "mode_for", "parse_modes"]
