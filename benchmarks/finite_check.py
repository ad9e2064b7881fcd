"""Check 1's local finiteness check under FSDP2, each way it could be done, timed on one process.

Under FSDP2 check 1's local tap sees every parameter's unsharded (pre-reduce-scatter) gradient
once per step, one post-accumulate-grad hook call per parameter, and must say whether any element
of any of them is NaN or +-Inf without reading the flag on the host. This times one step's worth
of that work, on the gradients of ``benchmarks/overhead.py``'s MLP (or any width and depth), for
each candidate way of doing it:

  isfinite_all     per parameter ``~isfinite(g).all()`` as a float32 flag, the flags concatenated
                   once per step (what the tap did before; ``isfinite`` is a composite in torch:
                   ``(g == g) * (g.abs() != inf)``, several passes and a full-size temporary)
  fused_per_param  per parameter torch's fused GradScaler kernel at scale 1.0
                   (``_amp_foreach_non_finite_check_and_unscale_``) into one flag per step
  fused_batched    the same kernel once over every gradient of the step (what batching a whole
                   FSDP group's gradients would give; needs them all alive at once)
  aminmax          per parameter ``aminmax`` (read-only, one pass; NaN propagates), one
                   ``isfinite`` over the stacked extremes per step
  foreach_inf_norm ``_foreach_norm(grads, inf)`` over every gradient at once, one ``isfinite``
  sum_float64      per parameter a float64 sum (finite exactly when every float32/bf16 element is)

Each is the minimum over ``--repeats`` runs of ``--number`` steps (the minimum is what is least
disturbed by other load on a shared machine), in milliseconds per step. Every candidate is first
checked to flag a NaN and to pass the largest finite value, so a wrong one cannot look fast.

    python benchmarks/finite_check.py                       # the overhead benchmark's MLP
    python benchmarks/finite_check.py --dtype bfloat16 --threads 2
"""

from __future__ import annotations

import argparse
import math
import timeit
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from results import Recorder

Check = Callable[[Sequence[torch.Tensor]], torch.Tensor]


def mlp_gradient_shapes(width: int, depth: int, d_in: int = 256, classes: int = 16) -> list[tuple]:
    """The parameter shapes of ``benchmarks/overhead.py``'s ``Mlp`` (weights and biases)."""
    shapes: list[tuple] = [(width, d_in), (width,)]
    for _ in range(depth):
        shapes += [(width, width), (width,), (width,), (width,)]  # Linear, then LayerNorm
    return [*shapes, (classes, width), (classes,)]


def isfinite_all(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    flags = [(~torch.isfinite(g).all()).to(torch.float32).reshape(1) for g in grads]
    return torch.cat(flags).any()


def fused_per_param(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    found = torch.zeros(1, dtype=torch.float32)
    one = torch.ones(1, dtype=torch.float32)
    for g in grads:
        torch._amp_foreach_non_finite_check_and_unscale_([g], found, one)
    return found.bool()


def fused_batched(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    found = torch.zeros(1, dtype=torch.float32)
    torch._amp_foreach_non_finite_check_and_unscale_(list(grads), found, torch.ones(1))
    return found.bool()


def aminmax(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    extremes = [torch.stack(torch.aminmax(g)).float() for g in grads]
    return ~torch.isfinite(torch.cat(extremes)).all()


def foreach_inf_norm(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    norms = torch._foreach_norm(list(grads), math.inf)
    return ~torch.isfinite(torch.stack(norms)).all()


def sum_float64(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    sums = [g.sum(dtype=torch.float64) for g in grads]
    return ~torch.isfinite(torch.stack(sums)).all()


CANDIDATES: dict[str, Check] = {
    "isfinite_all": isfinite_all,
    "fused_per_param": fused_per_param,
    "fused_batched": fused_batched,
    "aminmax": aminmax,
    "foreach_inf_norm": foreach_inf_norm,
    "sum_float64": sum_float64,
}


def _sound(check: Check, grads: list[torch.Tensor]) -> bool:
    """Whether ``check`` flags a NaN in the last element of the largest gradient and passes the
    dtype's largest finite value everywhere in it (on copies: nothing timed is disturbed)."""
    big = max(range(len(grads)), key=lambda i: grads[i].numel())
    poisoned = [g.clone() for g in grads]
    poisoned[big].view(-1)[-1] = float("nan")
    huge = [g.clone() for g in grads]
    huge[big].fill_(torch.finfo(huge[big].dtype).max)
    return bool(check(poisoned)) and not bool(check(huge)) and not bool(check(grads))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024, help="MLP width (overhead.py's)")
    parser.add_argument("--depth", type=int, default=4, help="hidden layers (overhead.py's)")
    parser.add_argument("--dtype", default="float32", help="gradient dtype: float32, bfloat16")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--number", type=int, default=20, help="steps per timed run")
    parser.add_argument("--repeats", type=int, default=15, help="timed runs (min reported)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    recorder = Recorder(__file__, argv)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    shapes = mlp_gradient_shapes(args.width, args.depth)
    grads = [torch.randn(s, generator=g).mul_(1e-3).to(dtype) for s in shapes]
    numel = sum(t.numel() for t in grads)
    print(
        f"{len(grads)} gradients, {numel / 1e6:.2f}M elements of {args.dtype}, "
        f"{args.threads} thread(s), torch {torch.__version__}; ms per step, min of "
        f"{args.repeats} x {args.number}"
    )
    figures: dict[str, float | None] = {}
    for name, check in CANDIDATES.items():
        if not _sound(check, grads):
            print(f"{name:18s} UNSOUND (misses a NaN or flags the largest finite value)")
            figures[name] = None
            continue
        best = min(timeit.repeat(lambda c=check: c(grads), number=args.number, repeat=args.repeats))
        print(f"{name:18s} {1e3 * best / args.number:8.3f}")
        figures[name] = 1e3 * best / args.number
    if args.json:
        document = {"args": vars(args), "gradients": len(grads), "elements": numel}
        recorder.write(args.json, {**document, "ms_per_step": figures})


if __name__ == "__main__":
    main()
