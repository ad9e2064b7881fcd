"""How one observation is judged: by comparison with the node's other devices and with a golden
digest, never by tolerance.

An *observation* is one op at one repetition's seed: every device's digest of its outputs. Its
reference (the digest judged right) is found in this order:

1. With at least two devices, the digest a strict majority of them computed (more than half:
   3 of 4, 2 of 3, 2 of 2). If a golden digest for this op and seed exists and differs from that
   majority, nobody is named (``inconclusive``: the majority and the history disagree, which a
   software difference the key does not capture explains better than a majority of bad GPUs).
2. Otherwise (a tie, or a single device), the golden digest, when one exists: golden digests
   are learned only from screens in which every device agreed, under the same environment key.
3. Otherwise the observation is ``inconclusive`` and names nobody.

Every device whose digest differs from the reference mismatched. A reference that is an error
(``error:<class>``: most devices' kernel raised) names nobody either: the op is not exercised.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from .ops import is_error

Source = Literal["majority", "golden", "none"]
"""Where an observation's reference came from."""


@dataclass(frozen=True)
class Judgement:
    """What one observation says."""

    reference: str | None
    """The digest judged right, or None (inconclusive)."""
    source: Source
    """Where the reference came from."""
    mismatched: tuple[int, ...]
    """The devices (indices) whose digest differs from the reference."""
    inconclusive: str | None = None
    """Why no reference could be chosen (None when one was)."""

    @property
    def errored(self) -> bool:
        """Whether the reference is an error: the op could not run here, nobody is named."""
        return self.reference is not None and is_error(self.reference)

    @property
    def unanimous(self) -> bool:
        """Whether every device computed the reference (and it is not an error)."""
        return self.reference is not None and not self.errored and not self.mismatched


def judge(digests: Mapping[int, str], golden: str | None) -> Judgement:
    """Judge one observation: ``digests`` by device index, ``golden`` the golden digest of this
    op and seed under this environment key, if any (module docstring)."""
    if not digests:
        return Judgement(None, "none", (), inconclusive="no device computed it")
    counts = Counter(digests.values())
    top, votes = counts.most_common(1)[0]
    reference: str | None = None
    source: Source = "none"
    if len(digests) >= 2 and votes * 2 > len(digests):
        if golden is not None and golden != top and not is_error(top):
            return Judgement(
                None, "none", (), inconclusive="the devices' majority differs from the golden"
            )
        reference, source = top, "majority"
    elif golden is not None:
        reference, source = golden, "golden"
    if reference is None:
        why = "a single device and no golden" if len(digests) == 1 else "no strict majority"
        return Judgement(None, "none", (), inconclusive=why)
    if is_error(reference):
        return Judgement(reference, source, ())
    mismatched = tuple(sorted(i for i, d in digests.items() if d != reference))
    return Judgement(reference, source, mismatched)


__all__ = ["Judgement", "Source", "judge"]
