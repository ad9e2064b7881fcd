"""Check 1's "does this gradient hold a NaN/Inf?", in one pass, on the device.

:func:`mark_non_finite` tests every element of some tensors and raises a one-element flag on
their device when any is NaN, +Inf or -Inf; it never reads anything back to the host, so a
per-parameter hook can call it and the flag waits on the device for the step's agreement point.

It runs torch's fused GradScaler kernel (``_amp_foreach_non_finite_check_and_unscale_``) at
scale 1.0: one pass that tests each element with ``isfinite`` in its own dtype's float opmath
(bf16/fp16 widened to float32, exactly) and writes each value back unchanged (the kernel skips
the multiplication when the scale is 1: finite values, signed zeros and subnormals keep their
bits, which the unit tests check; a bf16/fp16 NaN may come back as the canonical NaN, still a
NaN, which is why the taps fingerprint a gradient before checking it). It is element by
element, as DDP's comm hook tests a bucket (:mod:`.comm_hook`), so the largest finite
value of the dtype is finite here, where a squared norm would overflow and a float32 sum of two
such values would too.

Why this kernel rather than ``(~torch.isfinite(g).all())``: in torch ``isfinite`` of a floating
tensor is a composite, ``(g == g) * (g.abs() != inf)`` (``TensorCompare.cpp`` in ATen), so it
allocates a full-size ``abs`` temporary and three boolean tensors and makes four passes; on the
CPU, allocating and faulting in those temporaries dominates. ``benchmarks/finite_check.py``
times the candidates (the composite, this kernel per tensor and batched, ``aminmax``,
``_foreach_norm(inf)``, a float64 sum): docs/performance.md has the numbers. Where the kernel
does not exist for a device or dtype (complex gradients; any backend without it), the composite
is the fallback: slower, same answer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_FUSED_SUPPORT: dict[tuple[str, torch.dtype], bool] = {}
_ONE: dict[torch.device, torch.Tensor] = {}


def new_flag(device: torch.device | str) -> torch.Tensor:
    """A fresh, lowered flag for :func:`mark_non_finite`: one float32 zero on ``device``."""
    return torch.zeros(1, dtype=torch.float32, device=device)


def fused_supported(tensor: torch.Tensor) -> bool:
    """Whether torch's fused non-finite check exists for ``tensor``'s device type and dtype
    (probed once per pair on a small tensor of that kind). DDP's comm hook asks too: it runs
    the same kernel with 1/world as the scale (:func:`.comm_hook.divide_and_check`)."""
    key = (tensor.device.type, tensor.dtype)
    if key not in _FUSED_SUPPORT:
        probe = torch.ones(2, dtype=tensor.dtype, device=tensor.device)
        found = new_flag(tensor.device)
        try:
            torch._amp_foreach_non_finite_check_and_unscale_([probe], found, _one(tensor.device))
            _FUSED_SUPPORT[key] = True
        except (AttributeError, NotImplementedError, RuntimeError):
            _FUSED_SUPPORT[key] = False
    return _FUSED_SUPPORT[key]


def _one(device: torch.device) -> torch.Tensor:
    """The kernel's scale, 1.0 as float32 on ``device``, made once (the kernel only reads it)."""
    if device not in _ONE:
        _ONE[device] = torch.ones(1, dtype=torch.float32, device=device)
    return _ONE[device]


def mark_non_finite(tensors: Sequence[torch.Tensor], flag: torch.Tensor) -> None:
    """Raise ``flag`` (from :func:`new_flag`, on the tensors' device) when any element of
    ``tensors`` is NaN or +-Inf; leave it as it was otherwise. Finite values keep their
    bits (a bf16/fp16 NaN may become the canonical NaN). Issues device work only: nothing is
    read back to the host.

    A raised flag is nonzero (1.0 from the fused kernel, a positive count from the fallback).
    Raises ``ValueError`` when ``flag`` is not a one-element float32 tensor on the tensors'
    device, or when a tensor is not floating point or complex (its check would mean nothing).
    """
    if flag.numel() != 1 or flag.dtype != torch.float32:
        raise ValueError(
            f"flag: expected one float32 element, got {flag.dtype} {tuple(flag.shape)}"
        )
    for tensor in tensors:
        if not (tensor.is_floating_point() or tensor.is_complex()):
            raise ValueError(f"tensors: finiteness of a {tensor.dtype} tensor is not a check")
        if tensor.device != flag.device:
            raise ValueError(f"flag: on {flag.device}, a tensor is on {tensor.device}")
        if fused_supported(tensor):
            # One tensor per call: the per-parameter hooks that call this see one at a time,
            # and a list must share a dtype on CUDA's multi-tensor path.
            torch._amp_foreach_non_finite_check_and_unscale_([tensor], flag, _one(flag.device))
        else:
            flag.add_((~torch.isfinite(tensor).all()).to(torch.float32))


def all_finite(tensors: Sequence[torch.Tensor | None]) -> bool:
    """Whether every element of every tensor is finite (None entries are skipped); one sync.

    Element by element, as the comm hook's fused kernel tests a bucket: huge finite values
    (1e30) are finite here, where a squared norm would overflow to Inf.
    """
    present = [t for t in tensors if t is not None]
    if not present:
        return True
    flag = new_flag(present[0].device)
    mark_non_finite(present, flag)
    return not bool(flag)
