"""The drills' data: every micro-batch a pure function of (step, rank), so any rank rebuilds any
other's (what ``rebuild_batch`` must do)."""

from __future__ import annotations

import torch


def make_batch(step: int, rank: int, *, seed: int = 0, batch: int = 8, d_in: int = 16) -> tuple:
    """The micro-batch ``rank`` trains on at ``step``: a pure function, so any rank can rebuild it."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    return torch.randn(batch, d_in, generator=g), torch.randint(0, 4, (batch,), generator=g)
