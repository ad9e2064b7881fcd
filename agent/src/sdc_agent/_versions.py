"""The oldest torch the agent supports, enforced when ``sdc_agent`` is imported.

The floor is the oldest release on which every path is both correct and fast:

* ``torch.mm(a, b, out_dtype=torch.float32)`` (torch 2.8): a protected 16-bit linear layer's
  GEMM with an fp32 output, which the online sensors check. Below 2.8 the layer falls back to an
  fp32 ``F.linear`` (2-15x slower with TF32 off): silently slow, so refused.
* ``torch.distributed.fsdp.FSDPModule`` / ``fully_shard`` (public from 2.6) and
  ``torch.distributed.tensor`` (``DTensor``, public from 2.5), imported by ``import sdc_agent``.

:func:`check_torch` runs when this module is imported, which ``sdc_agent/__init__.py`` does
before anything else of the package, so an older torch gets this module's error rather than an
ImportError from deep inside the package.
"""

from __future__ import annotations

import re

import torch

TORCH_FLOOR = (2, 8)
"""The oldest supported torch (major, minor); agent/pyproject.toml says the same."""

WHY = (
    "torch.mm(..., out_dtype=torch.float32) (torch 2.8) computes the protected 16-bit layers' "
    "checked GEMMs (below it they fall back to an fp32 GEMM, 2-15x slower), and the agent "
    "imports torch.distributed.fsdp.FSDPModule (public from 2.6) and torch.distributed.tensor "
    "(public from 2.5)"
)

_RELEASE = re.compile(r"^(\d+)\.(\d+)")


def torch_release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string (``2.13.0+cpu``, ``2.9.0a0+git1234``,
    ``2.10.0.dev20250901``); ValueError when it does not start with ``MAJOR.MINOR``."""
    match = _RELEASE.match(version.strip())
    if match is None:
        raise ValueError(f"cannot read a torch release from the version string {version!r}")
    return int(match.group(1)), int(match.group(2))


def check_torch(version: str | None = None) -> None:
    """Raise ImportError unless ``version`` (default: the installed ``torch.__version__``) is at
    least :data:`TORCH_FLOOR`, naming the version found, the floor and why. A pre-release of the
    floor (``2.8.0a0``, a nightly) counts as the floor."""
    found = str(torch.__version__ if version is None else version)
    floor = ".".join(map(str, TORCH_FLOOR))
    try:
        release = torch_release(found)
    except ValueError as err:
        raise ImportError(f"sdc_agent needs torch >= {floor}: {err}; {WHY}") from err
    if release < TORCH_FLOOR:
        raise ImportError(
            f"sdc_agent needs torch >= {floor}, found torch {found}: {WHY}. "
            f"Upgrade torch (pip install 'torch>={floor}') or use an image that has it."
        )


check_torch()
