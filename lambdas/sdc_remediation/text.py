"""Text that came from a report, a metric dimension or a request, made safe to show a person.

Reports are written by training pods; anything in one can reach an SNS subject, a message, a
terminal (``sdc-remediation pending``, ``stats``, ``history``) or a log line. A newline in an SNS
subject makes SNS refuse the message (the approval is then never announced), and an escape
sequence in a terminal can rewrite what the operator reads. So what a person reads passes
through here: control and formatting characters are replaced, and the length is bounded.
"""

from __future__ import annotations

import unicodedata

SUBJECT_MAX_CHARS = 99
"""SNS refuses a subject of 100 characters or more, with a line break or a control character,
or that does not start with a letter, a digit or punctuation."""

_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
"""Control, format (bidirectional overrides, zero-width), surrogate, private-use, unassigned, and
line/paragraph separators: nothing a person should receive from someone else's data."""


def _safe_char(char: str, *, ascii_only: bool) -> str:
    if char in "\t\n\r\v\f":
        return " "
    if ascii_only and not " " <= char <= "~":
        return "?"
    if unicodedata.category(char) in _UNSAFE_CATEGORIES:
        return "?"
    return char


def printable(value: object, limit: int = 1000, *, ascii_only: bool = False) -> str:
    """``value`` as text with control and formatting characters replaced (whitespace by a space,
    the rest by ``?``), cut to ``limit`` characters (the cut marked with ``...``)."""
    text = "".join(_safe_char(c, ascii_only=ascii_only) for c in str(value))
    if len(text) > limit:
        return text[: max(0, limit - 3)] + "..."
    return text


def subject(value: object) -> str:
    """An SNS subject SNS accepts: printable ASCII on one line, runs of spaces collapsed, at most
    ``SUBJECT_MAX_CHARS`` characters, starting with a letter, a digit or punctuation."""
    text = " ".join(printable(value, 10 * SUBJECT_MAX_CHARS, ascii_only=True).split())
    if not text:
        text = "[sdc-guard]"
    return printable(text, SUBJECT_MAX_CHARS, ascii_only=True)


__all__ = ["SUBJECT_MAX_CHARS", "printable", "subject"]
