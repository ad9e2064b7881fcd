"""Golden digests: a small local JSON store of what earlier screens that agreed computed.

One file (``--golden PATH``; schema ``sdc.screen-golden/v1``)::

    {"schema": "sdc.screen-golden/v1",
     "entries": [{"key": {"device_model": ..., "driver": ..., "cuda": ..., "torch": ...,
                          "workload": ...},
                  "digests": {"gemm:bf16:64x96x96@0": "3f0c...", ...}}]}

An entry is used only for a screen whose environment key (:class:`EnvironmentKey`) equals its
``key`` in every field: another torch, CUDA, driver, device model or list of ops computes other
bits, so its digests would name a healthy GPU. Within an entry a digest is filed by op label and
repetition seed (:func:`observation_id`). Entries are learned only from a screen on at least two
devices in which every device agreed on every observation (:mod:`sdc_agent.screen.runner`), and
a digest already filed is never overwritten. The file is replaced atomically (a temporary file
and ``os.replace``), so a screen killed mid-write leaves the old store.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdc_contract.screen import ENVIRONMENT_KEYS, GOLDEN_SCHEMA

from .devices import EnvironmentKey


def observation_id(label: str, seed: int) -> str:
    """How a digest is filed within an entry: ``<op label>@<seed>``."""
    return f"{label}@{seed}"


def _key(value: Any, where: str) -> EnvironmentKey:
    if not isinstance(value, Mapping) or set(value) != set(ENVIRONMENT_KEYS):
        raise ValueError(f"{where} must have exactly the keys {list(ENVIRONMENT_KEYS)}")
    if not all(isinstance(value[k], str) for k in ENVIRONMENT_KEYS):
        raise ValueError(f"{where} values must be strings")
    return EnvironmentKey(**{k: value[k] for k in ENVIRONMENT_KEYS})


@dataclass
class GoldenStore:
    """The golden digests of one file, by environment key."""

    path: Path | None = None
    """Where it is read from and saved to (None: in memory only)."""
    entries: dict[EnvironmentKey, dict[str, str]] = field(default_factory=dict)
    """Digests by observation id, by key."""

    @classmethod
    def load(cls, path: Path) -> GoldenStore:
        """The store in ``path`` (empty when the file does not exist); ValueError names the
        field of a malformed file."""
        try:
            text = path.read_text()
        except FileNotFoundError:
            return cls(path=path)
        except (OSError, UnicodeDecodeError) as exc:
            # A store that exists but cannot be read must not be taken for an empty one: the
            # next clean screen would replace it.
            raise ValueError(f"golden store {path}: cannot read it: {exc}") from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"golden store {path}: invalid JSON: {exc}") from None
        if not isinstance(doc, Mapping) or doc.get("schema") != GOLDEN_SCHEMA:
            raise ValueError(f"golden store {path}: schema must be {GOLDEN_SCHEMA!r}")
        raw = doc.get("entries")
        if not isinstance(raw, list):
            raise ValueError(f"golden store {path}: entries must be a list")
        store = cls(path=path)
        for i, entry in enumerate(raw):
            where = f"golden store {path}: entries[{i}]"
            if not isinstance(entry, Mapping):
                raise ValueError(f"{where} must be an object")
            key = _key(entry.get("key"), f"{where}.key")
            digests = entry.get("digests")
            if not isinstance(digests, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in digests.items()
            ):
                raise ValueError(f"{where}.digests must map observation ids to digests")
            store.entries.setdefault(key, {}).update(digests)
        return store

    def digests(self, key: EnvironmentKey) -> dict[str, str]:
        """The golden digests filed under exactly ``key`` (empty when none)."""
        return dict(self.entries.get(key, {}))

    def foreign_keys(self, key: EnvironmentKey) -> int:
        """How many entries are filed under other keys (not used for this screen)."""
        return sum(1 for k in self.entries if k != key)

    def learn(self, key: EnvironmentKey, digests: Mapping[str, str]) -> int:
        """File ``digests`` under ``key`` (never overwriting one filed); returns how many were new."""
        entry = self.entries.setdefault(key, {})
        new = {k: v for k, v in digests.items() if k not in entry}
        entry.update(new)
        return len(new)

    def document(self) -> dict[str, Any]:
        """The store as its file holds it."""
        return {
            "schema": GOLDEN_SCHEMA,
            "entries": [
                {"key": key.as_dict(), "digests": dict(sorted(digests.items()))}
                for key, digests in self.entries.items()
            ],
        }

    def save(self) -> None:
        """Write the store to its path atomically (nothing to do without a path)."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".golden-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(self.document(), out, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


__all__ = ["GoldenStore", "observation_id"]
