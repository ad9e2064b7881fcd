"""Bit-exact fingerprints of tensors: two wrapping 64-bit sums of the raw bit patterns.

For a tensor whose elements have bit patterns b_1..b_n (read as signed integers of the element's
width), the fingerprint is (sum b_i, sum i * b_i), both modulo 2**64. Changing one element changes
the plain sum. Changing two elements by d and -d leaves the plain sum but shifts the weighted sum
by (i - j) * d, which is non-zero modulo 2**64 while |i - j| < 2**32 and |d| < 2**32 (any
element of at most 32 bits): swaps and compensating changes are caught too.

This definition is fixed (other parts compare tables across ranks and jobs). How it is computed
is not: ``_fingerprint_plan`` lays the tensors out and ``_fingerprint_fast`` computes the sums
from exact int32 row and column sums, 5-20x faster on a CPU than widening every element to
int64; on a GPU with Triton, ``_fingerprint_triton`` reads each element once (docs/performance.md
has the measurements).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence

import torch
from torch.distributed.tensor import DTensor

from . import _fingerprint_triton
from ._fingerprint_fast import run_fast, run_generic
from ._fingerprint_plan import CPU_TUNING, CUDA_TUNING, Plan, Signature, build_plan

logger = logging.getLogger("sdc_agent")

BACKEND_ENV = "SDC_FINGERPRINT_BACKEND"
"""auto (default): the Triton kernel on GPUs when Triton is importable and agrees with the torch
path on a self-check, else torch; torch: always the torch path; triton: always the kernel."""
_BACKENDS = ("auto", "torch", "triton")

# Signed integer dtypes by element width: the raw bit patterns we sum.
_BITS_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

# Plans (layout, index tensors, row/column sum buffers) by (device, signature). A job
# fingerprints the same lists (weights, gradients) every time, and the comm hook fingerprints
# gradients one at a time: one plan per distinct parameter shape, a few dozen in a model.
_PLANS: OrderedDict[tuple[torch.device, Signature], Plan] = OrderedDict()
_MAX_PLANS = 64
# Plans and the shared scratch buffer are reused: one fingerprint pass at a time.
_LOCK = threading.Lock()

# Reading 16-bit elements as 32-bit pairs assumes the first element is the low half.
_LITTLE_ENDIAN = sys.byteorder == "little"


def bit_patterns(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's elements reinterpreted (not converted) as signed integers, flattened.

    A view of the same storage whenever the tensor is contiguous, so writing to it changes the
    tensor's raw bits (fault drills use that). A DTensor's are its local shard's: reshaping the
    DTensor itself could redistribute it."""
    if isinstance(tensor, DTensor):
        tensor = tensor.to_local()
    flat = tensor.detach().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    return flat.view(_BITS_VIEW[flat.element_size()])


def _signature(bits: Sequence[torch.Tensor]) -> Signature:
    """What the plan depends on: width, size and (16-bit) whether pairs can be viewed as int32."""
    return tuple(
        (b.element_size(), b.numel(), _LITTLE_ENDIAN and b.storage_offset() % 2 == 0) for b in bits
    )


def _plan(device: torch.device, signature: Signature) -> Plan:
    """The cached plan for this device and signature, built on first use."""
    key = (device, signature)
    plan = _PLANS.get(key)
    if plan is None:
        tuning = CPU_TUNING if device.type == "cpu" else CUDA_TUNING
        plan = build_plan(signature, device, tuning)
        _PLANS[key] = plan
        while len(_PLANS) > _MAX_PLANS:
            _PLANS.popitem(last=False)
    _PLANS.move_to_end(key)
    return plan


# Per device: whether the Triton kernel passed its self-check there.
_TRITON_TRUSTED: dict[torch.device, bool] = {}


def _backend(device: torch.device) -> str:
    """'torch' or 'triton' for tensors on ``device`` (see BACKEND_ENV)."""
    choice = os.environ.get(BACKEND_ENV, "auto").strip().lower() or "auto"
    if choice not in _BACKENDS:
        raise ValueError(f"{BACKEND_ENV} must be one of {', '.join(_BACKENDS)}, got {choice!r}")
    if choice == "triton":
        if not _fingerprint_triton.AVAILABLE:
            raise ValueError(f"{BACKEND_ENV}=triton but Triton is not installed")
        return "triton"
    if choice == "torch" or device.type != "cuda" or not _fingerprint_triton.AVAILABLE:
        return "torch"
    if device not in _TRITON_TRUSTED:
        _TRITON_TRUSTED[device] = _self_check(device)
    return "triton" if _TRITON_TRUSTED[device] else "torch"


def prepare_backend(device: torch.device) -> str:
    """Choose how fingerprints of tensors on ``device`` are computed, now: on a GPU with Triton,
    the kernel is compiled and self-checked here (once per device, one sync) instead of lazily
    inside the first forward that fingerprints. The Guard calls it at construction. Returns
    ``"torch"`` or ``"triton"``; raises ValueError for a bad ``SDC_FINGERPRINT_BACKEND``."""
    return _backend(device)


def _self_check(device: torch.device) -> bool:
    """Whether the Triton kernel matches the torch path on ``device`` (runs once; syncs once).

    A wrong kernel would raise false alarms in every job, so it has to earn its place.
    """
    g = torch.Generator().manual_seed(12345)
    sizes = [0, 1, 8191, 8192, 8193, 3 * 8192 + 5, 70_001]
    raw = [torch.randint(-(2**31), 2**31, (n,), generator=g, dtype=torch.int32) for n in sizes]
    raw += [torch.full((20_000,), v, dtype=torch.int32) for v in (2**31 - 1, -(2**31), -1)]
    raw += [torch.randint(-(2**15), 2**15, (50_001,), generator=g).to(torch.int16)]
    raw += [torch.randint(-(2**62), 2**62, (9_000,), generator=g, dtype=torch.int64)]
    bits = [t.to(device) for t in raw]
    try:
        with _LOCK:
            by_kernel = torch.zeros((len(bits), 2), dtype=torch.int64, device=device)
            _fingerprint_triton.run_triton(bits, by_kernel)
            by_torch = _run_torch(bits, device)
        agree = bool(torch.equal(by_kernel, by_torch))
    except Exception:  # a kernel that cannot even run is not trusted either
        logger.warning(
            "Triton fingerprint kernel failed on %s; using torch ops", device, exc_info=True
        )
        return False
    if not agree:
        logger.warning("Triton fingerprint kernel disagrees with torch ops on %s; not used", device)
    return agree


def _run_torch(bits: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The torch path (row/column kernel + generic kernel); caller holds the lock."""
    out = torch.zeros((len(bits), 2), dtype=torch.int64, device=device)
    plan = _plan(device, _signature(bits))
    k = plan.tuning.lanes_per_row
    lanes = []
    for tensor in plan.fast:
        flat = bits[tensor.index]
        if tensor.pairs:
            flat = flat[: 2 * tensor.rows * k].view(torch.int32)
        lanes.append(flat[: tensor.rows * k].view(tensor.rows, k))
    run_fast(plan, lanes, out)
    run_generic(plan, list(bits), out)
    return out


def _fingerprint_same_device(bits: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The [len(bits), 2] table of tensors that all live on ``device``."""
    backend = _backend(device)
    with _LOCK:
        if backend == "triton":
            out = torch.zeros((len(bits), 2), dtype=torch.int64, device=device)
            _fingerprint_triton.run_triton(bits, out)
            return out
        return _run_torch(bits, device)


def fingerprint(tensor: torch.Tensor | None) -> torch.Tensor:
    """The (plain, position-weighted) fingerprint of one tensor as an int64 tensor of shape [2].

    ``None`` (a parameter without a gradient) fingerprints like an all-zero tensor: (0, 0).
    The result stays on the tensor's device; nothing is synchronised.
    """
    if tensor is None:
        return torch.zeros(2, dtype=torch.int64)
    return fingerprints([tensor])[0]


def fingerprints(tensors: Iterable[torch.Tensor | None]) -> torch.Tensor:
    """Fingerprints of many tensors as an int64 table of shape [len(tensors), 2].

    The table lives on the device of the first tensor (CPU when there is none), so it can go
    straight into a collective. Row i is ``fingerprint(tensors[i])``; None rows are (0, 0).
    Nothing is read back to the host, so on a GPU the call only queues work (the one exception:
    the first call on a GPU with Triton installed compares the kernel with the torch path once).
    Set SDC_FINGERPRINT_BACKEND to auto, torch or triton to choose the GPU path.
    """
    items = list(tensors)
    present = [(i, bit_patterns(t)) for i, t in enumerate(items) if t is not None]
    if not present:
        return torch.zeros((len(items), 2), dtype=torch.int64)
    device = present[0][1].device
    by_device: dict[torch.device, list[tuple[int, torch.Tensor]]] = {}
    for index, bits in present:
        by_device.setdefault(bits.device, []).append((index, bits))
    if len(by_device) == 1 and len(present) == len(items):
        return _fingerprint_same_device([bits for _, bits in present], device)
    table = torch.zeros((len(items), 2), dtype=torch.int64, device=device)
    for group_device, group in by_device.items():
        rows = _fingerprint_same_device([bits for _, bits in group], group_device)
        positions = torch.tensor([i for i, _ in group], dtype=torch.int64, device=device)
        table.index_copy_(0, positions, rows.to(device))
    return table


def table_digest(table: torch.Tensor) -> str:
    """A short hex digest of a fingerprint table (for checkpoint tags and logs)."""
    raw = table.detach().to("cpu", torch.int64).contiguous().reshape(-1).view(torch.uint8)
    return hashlib.sha256(bytes(raw.tolist())).hexdigest()
