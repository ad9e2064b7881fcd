"""Check every fingerprint backend on this machine against the definition, bit for bit.

The unit tests cover the torch path on the CPU. This script covers what they cannot: the torch
path on a GPU and the Triton kernel, on random and adversarial inputs of every parameter dtype,
against the definition computed independently with numpy uint64 arithmetic on the host.

    python benchmarks/fingerprint_check.py                      # CPU, plus CUDA when present
    TRITON_INTERPRET=1 python benchmarks/fingerprint_check.py   # Triton kernel on the CPU too

Exits 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

import sdc_agent  # noqa: F401  (loads the package; the module is shadowed by the function)

FP = sys.modules["sdc_agent.fingerprint"]
TRITON = sys.modules["sdc_agent._fingerprint_triton"]


def reference(tensor: torch.Tensor) -> list[int]:
    """The definition, from the raw bytes, with numpy uint64 (wrapping) arithmetic."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    if flat.is_complex():
        flat = torch.view_as_real(flat).contiguous().reshape(-1)
    width = flat.element_size()
    raw = flat.view(torch.uint8).numpy().tobytes()
    signed = np.frombuffer(raw, dtype=f"=i{width}").astype(np.int64).view(np.uint64)
    positions = np.arange(1, signed.size + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        s0 = int(signed.sum(dtype=np.uint64))
        s1 = int((signed * positions).sum(dtype=np.uint64))
    return [(s + 2**63) % 2**64 - 2**63 for s in (s0, s1)]


def cases(device: str, scale: int) -> list[torch.Tensor]:
    """Random bit patterns in every dtype and size class, plus extreme constant patterns."""
    g = torch.Generator().manual_seed(7)
    sizes = [0, 1, 1023, 8191, 8193, 2**15 + 1, 2**20 + 1025, scale]
    out = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8):
        width = torch.empty(0, dtype=dtype).element_size()
        for n in sizes:
            raw = torch.randint(0, 256, (n * width,), generator=g, dtype=torch.uint8)
            out.append(raw.view(dtype))
    for value in (2**31 - 1, -(2**31), -1, 0x7FFF0000, 0xFFFF):
        out.append(torch.full((2**21 + 3,), value, dtype=torch.int64).to(torch.int32))
    for value in (2**15 - 1, -(2**15), -1):
        out.append(torch.full((2**21 + 5,), value, dtype=torch.int16))
    out.append(torch.randn(1000, 1001).t())  # non-contiguous
    return [t.to(device) for t in out]


def check(name: str, got: torch.Tensor, tensors: list[torch.Tensor]) -> int:
    expected = [reference(t) for t in tensors]
    rows = got.cpu().tolist()
    bad = [i for i, (a, b) in enumerate(zip(rows, expected, strict=True)) if a != b]
    for i in bad[:5]:
        t = tensors[i]
        print(f"  MISMATCH {name}: {t.dtype} {tuple(t.shape)}: {rows[i]} != {expected[i]}")
    print(f"{name:40s} {len(tensors) - len(bad)}/{len(tensors)} tensors agree")
    return len(bad)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=int, default=10_000_000, help="largest tensor size")
    args = parser.parse_args(argv)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    failures = 0
    for device in devices:
        tensors = cases(device, args.scale)
        bits = [FP.bit_patterns(t) for t in tensors]
        with FP._LOCK:
            by_torch = FP._run_torch(bits, torch.device(device))
        failures += check(f"{device}: torch ops", by_torch, tensors)
        failures += check(f"{device}: fingerprints()", FP.fingerprints(tensors), tensors)
        if TRITON.AVAILABLE and (device == "cuda" or interpret):
            out = torch.zeros((len(bits), 2), dtype=torch.int64, device=device)
            with FP._LOCK:
                TRITON.run_triton(bits, out)
            failures += check(f"{device}: triton kernel", out, tensors)
        elif device == "cuda":
            print("cuda: triton kernel                       not checked (Triton not installed)")
    if not TRITON.AVAILABLE:
        print("Triton not installed: kernel not checked")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
