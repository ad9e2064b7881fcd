"""What a fault drill's tap on a protected op looks like (its own module so that the linear
layers and the row-invariant ops share it without importing each other)."""

from __future__ import annotations

from collections.abc import Callable

import torch

GemmTap = Callable[[str, torch.Tensor], None]
"""``tap(gemm, result32)``: sees (and may change in place) a GEMM's fp32 result before its check.
``gemm`` is a :data:`.board.Gemm`, or for checked attention also the name of an intermediate
result (``"scores"``, ``"probs"``, ``"dprobs"`` ...) that no fault drill's ``gemm`` matches."""
