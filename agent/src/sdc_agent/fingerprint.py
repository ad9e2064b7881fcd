"""Bit-exact fingerprints of tensors: two wrapping 64-bit sums of the raw bit patterns.

For a tensor whose elements have bit patterns b_1..b_n (read as signed integers of the element's
width), the fingerprint is (sum b_i, sum i * b_i), both modulo 2**64. Changing one element changes
the plain sum. Changing two elements by d and -d leaves the plain sum but shifts the weighted sum
by (i - j) * d, which is non-zero modulo 2**64 while |i - j| < 2**32 and |d| < 2**32 (any
element of at most 32 bits): swaps and compensating changes are caught too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch

# Signed integer dtypes by element width: the raw bit patterns we sum.
_BITS_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

# Elements per chunk: bounds the int64 temporaries to a few tens of MiB whatever the tensor size.
_CHUNK = 1 << 22


def _bit_patterns(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's elements reinterpreted (not converted) as signed integers, flattened."""
    flat = tensor.detach().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    return flat.view(_BITS_VIEW[flat.element_size()])


def fingerprint(tensor: torch.Tensor | None) -> torch.Tensor:
    """The (plain, position-weighted) fingerprint of one tensor as an int64 tensor of shape [2].

    ``None`` (a parameter without a gradient) fingerprints like an all-zero tensor: (0, 0).
    The result stays on the tensor's device; nothing is synchronised.
    """
    if tensor is None:
        return torch.zeros(2, dtype=torch.int64)
    bits = _bit_patterns(tensor)
    out = torch.zeros(2, dtype=torch.int64, device=bits.device)
    for start in range(0, bits.numel(), _CHUNK):
        chunk = bits[start : start + _CHUNK].to(torch.int64)
        positions = torch.arange(
            start + 1, start + 1 + chunk.numel(), dtype=torch.int64, device=chunk.device
        )
        out[0] += chunk.sum()
        out[1] += (chunk * positions).sum()
    return out


def fingerprints(tensors: Iterable[torch.Tensor | None]) -> torch.Tensor:
    """Fingerprints of many tensors as an int64 table of shape [len(tensors), 2].

    The table lives on the device of the first tensor (CPU when there is none), so it can go
    straight into a collective.
    """
    rows = [fingerprint(t) for t in tensors]
    if not rows:
        return torch.zeros((0, 2), dtype=torch.int64)
    device = next((r.device for r in rows if r.device.type != "cpu"), rows[0].device)
    return torch.stack([r.to(device) for r in rows])


def table_digest(table: torch.Tensor) -> str:
    """A short hex digest of a fingerprint table (for checkpoint tags and logs)."""
    raw = table.detach().to("cpu", torch.int64).contiguous().reshape(-1).view(torch.uint8)
    return hashlib.sha256(bytes(raw.tolist())).hexdigest()
