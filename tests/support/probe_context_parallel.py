"""Probe: does torch's ``context_parallel`` ring attention run on the CPU over gloo?

Not a test (issue 34 asked for the fact to be verified and written down). Run it under torchrun
with 2 processes::

    torchrun --nproc-per-node 2 tests/support/probe_context_parallel.py

Each rank prints, per rotate method (``allgather``, ``alltoall``) and SDPA backend (flash, the
CPU's default, and math), whether a causal SDPA forward and backward under
``context_parallel`` ran and, if so, its largest error against the unsharded attention. With
torch 2.13.0+cpu (2026-12-02): every combination fails. The CPU's flash operator
(``aten._scaled_dot_product_flash_attention_for_cpu``) has no sharding strategy, so
context parallel's dispatcher does not take it, and the math backend's decomposition mixes the
sharded DTensors with plain tensors. CPU tests of context parallel need a ring attention of
their own over the CPU's operator.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
from torch.distributed.tensor.experimental._attention import (
    context_parallel_unshard,
    set_rotate_method,
)
from torch.nn.attention import SDPBackend, sdpa_kernel


def main() -> None:
    """Run the probe on this rank and print what ran."""
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("cp",))
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 64, 16, requires_grad=True) for _ in range(3))
    reference = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    for method in ("allgather", "alltoall"):
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.MATH):
            set_rotate_method(method)
            # context_parallel shards its buffers in place: copies, made leaves inside
            buffers = [t.detach().clone() for t in (q, k, v)]
            what = f"rank {rank}, {method}, {backend.name}:"
            try:
                with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2]):
                    cq, ck, cv = (t.clone().requires_grad_(True) for t in buffers)
                    with sdpa_kernel(backend):
                        out = F.scaled_dot_product_attention(cq, ck, cv, is_causal=True)
                    out.sum().backward()
                (full,) = context_parallel_unshard(mesh, [out.detach()], [2])
                largest = (full - reference).abs().max().item()
                print(what, f"ran, largest error {largest:.3g}", flush=True)
            except Exception as error:  # the probe reports what failed
                print(what, f"FAILED {type(error).__name__}: {str(error)[:200]}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
