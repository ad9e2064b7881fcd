"""A random single-fault campaign over op families: which one-step faults do the sensors see?

Between two audits the guard sees a wrong finite value only through the online sensors. This
drives one fault at a time into one op family of a small transformer block (every family of a
training step: the GEMMs of its linear layers, its layer norms forward and backward, its
residual adds, the attention softmax forward and backward, the attention score/context batched
matmuls, the GELU activation, the output log-softmax and the loss's gradient) and asks whether
any sensor flags on that step. Each trial picks a fresh batch, a random site of the family
(layer, element) and a random fault (x1.1 of the element, or a flip of one bit in 20-30 of its
fp32 value; bits 4-14 of a bf16 value, the same positions in its 16 bits), once. All sensors
check every step here (full coverage, after their warm-up); the ``rate`` column says on what
fraction of steps the family's sensors check at the default 1% budget, so a one-step fault is
seen between audits with about ``caught x rate``. Single process, CPU: the sensors' view is
local to the rank that computed wrong; how a flag becomes an alarm on a multi-rank job is what
tests/agent/test_sensors_ddp.py and test_sensor_ops_ddp.py show.

    python benchmarks/campaign.py                 # 100 trials per family, fp32 and bf16
    python benchmarks/campaign.py --trials 300 --json campaign.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sdc_agent.drills.faults import _flip_bit_
from sdc_agent.sensors import ResidualAdd, SensorBoard, protect
from sdc_agent.sensors.plan import plan_sensors

Corrupt = Callable[[torch.Tensor], None]


class Tap(nn.Module):
    """An identity a fault can hook: a site of an op family that has no module of its own."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Block(nn.Module):
    """A pre-norm transformer block with a classifier head: every op family of a step."""

    def __init__(self, d_in: int, d: int, heads: int, classes: int) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Linear(d_in, d)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.attn = nn.Softmax(dim=-1)
        self.scores, self.context = Tap(), Tap()  # the two batched matmuls of attention
        self.add1, self.add2 = ResidualAdd(d), ResidualAdd(d)
        self.up, self.act, self.down = nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)
        self.head, self.out = nn.Linear(d, classes), nn.LogSoftmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        b, t, d = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(b, t, 3, self.heads, -1).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        scores = self.scores(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]))
        ctx = self.context(self.attn(scores) @ v).transpose(1, 2).reshape(b, t, d)
        h = self.add1(h, self.proj(ctx))
        h = self.add2(h, self.down(self.act(self.up(self.norm2(h)))))
        return self.out(self.head(h.mean(dim=1)))


# family: (module types or names it lives in, how the fault reaches it)
FAMILIES: dict[str, tuple[str, str]] = {
    "GEMM forward": ("linear", "forward"),
    "GEMM dgrad": ("linear", "dgrad"),
    "GEMM wgrad": ("linear", "wgrad"),
    "norm forward": ("layer_norm", "forward"),
    "norm backward": ("layer_norm", "dgrad"),
    "residual add": ("residual_add", "forward"),
    "softmax forward": ("softmax", "forward"),
    "softmax backward": ("softmax", "dgrad"),
    "log-softmax forward": ("log_softmax", "forward"),
    "log-softmax backward": ("log_softmax", "dgrad"),
    "attention bmm": ("scores,context", "hook"),
    "activation (GELU)": ("act", "hook"),
    "loss gradient": ("loss", "hook"),
}


def fault_of(gen: torch.Generator) -> tuple[str, Callable[[torch.Tensor, int], None]]:
    """x1.1 (half the trials) or one bit flip in 20-30 (fp32; 4-14 for a 16-bit value)."""
    if torch.rand((), generator=gen) < 0.5:

        def scale(flat: torch.Tensor, i: int) -> None:
            flat[i] *= 1.1

        return "x1.1", scale
    bit = int(torch.randint(20, 31, (1,), generator=gen))

    def flip(flat: torch.Tensor, i: int) -> None:
        _flip_bit_(flat, i, bit - 16 if flat.element_size() == 2 else bit)

    return f"bit {bit}", flip


class Campaign:
    """One protected block, warmed up, and the means to hit one op family once."""

    def __init__(self, args: argparse.Namespace, bf16: bool) -> None:
        torch.manual_seed(args.seed)
        self.args, self.bf16 = args, bf16
        self.model = Block(args.d_in, args.d, args.heads, args.classes)
        self.board: SensorBoard = protect(self.model)
        self.gen = torch.Generator().manual_seed(args.seed + 1)
        self.plan = plan_sensors(self.board, 0.01)
        self._hook: Callable[[str, str, torch.Tensor], None] | None = None
        for module in self.model.modules():
            if hasattr(module, "gemm_taps"):
                name = module.layer_name
                module.gemm_taps.append(lambda op, v, name=name: self._tapped(name, op, v))
        for name in ("scores", "context", "act"):
            self.model.get_submodule(name).register_forward_hook(
                lambda m, i, out, name=name: self._hooked(name, out)
            )

    def _tapped(self, name: str, op: str, value: torch.Tensor) -> None:
        if self._hook is not None:
            self._hook(name, op, value)

    def _hooked(self, name: str, out: torch.Tensor) -> torch.Tensor | None:
        if self._hook is None:
            return None
        out = out.clone()
        with torch.no_grad():
            self._hook(name, "hook", out)
        return out

    def step(self) -> bool:
        """One forward and backward of a fresh batch, every sensor checking; whether any flagged."""
        a = self.args
        # The input needs a gradient so that every linear layer runs its dgrad GEMM.
        x = torch.randn(a.batch, a.tokens, a.d_in, generator=self.gen).requires_grad_()
        y = torch.randint(0, a.classes, (a.batch,), generator=self.gen)
        self.board.arm(frozenset(range(len(self.board))))
        self.model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            logp = self.model(x)
        if self._hook is not None:
            logp.register_hook(self._loss_grad)
        F.nll_loss(logp.float(), y).backward()
        return bool(self.board.take_flags()[0].any())

    def _loss_grad(self, grad: torch.Tensor) -> torch.Tensor:
        out = grad.clone()
        assert self._hook is not None
        self._hook("loss", "hook", out)
        return out

    def sites(self, family: str) -> list[str]:
        where, _ = FAMILIES[family]
        if where in ("linear", "layer_norm", "residual_add", "softmax", "log_softmax"):
            return [n for n, kind in self.board.layers.items() if kind == where]
        return where.split(",")

    def rate(self, family: str) -> float:
        """Fraction of steps on which the family's sensors check at the default 1% budget."""
        where, op = FAMILIES[family]
        found = [
            self.plan.rate(i)
            for i, s in enumerate(self.board.sensors)
            if s.kind == where and s.gemm == op
        ]
        return sum(found) / len(found) if found else 0.0

    def trial(self, family: str) -> bool:
        """Hit one random site of ``family`` once with a random fault; whether a sensor flagged."""
        sites = self.sites(family)
        site = sites[int(torch.randint(len(sites), (1,), generator=self.gen))]
        op = FAMILIES[family][1]
        _, corrupt = fault_of(self.gen)
        done = [False]

        def hook(name: str, got: str, value: torch.Tensor) -> None:
            if done[0] or name != site or got != op:
                return
            flat = value.view(-1) if value.is_contiguous() else value.reshape(-1)
            index = int(torch.randint(flat.numel(), (1,), generator=self.gen))
            with torch.no_grad():
                corrupt(flat, index)
                if not value.is_contiguous():
                    value.copy_(flat.view_as(value))
            done[0] = True

        self._hook = hook
        try:
            flagged = self.step()
        finally:
            self._hook = None
        if not done[0]:
            raise RuntimeError(f"campaign: the fault in {family} ({site}) never fired")
        return flagged


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Per precision: the healthy false-flag rate and, per family, the fraction caught."""
    result: dict[str, Any] = {"trials": args.trials, "families": {}}
    for bf16 in (False, True):
        label = "bf16" if bf16 else "fp32"
        campaign = Campaign(args, bf16)
        for _ in range(campaign.board.config.warmup_checks):
            campaign.step()
        campaign.board.agree_alone()  # the agreed thresholds, as a job's ranks reach them
        result[f"false_flags_{label}"] = (
            sum(campaign.step() for _ in range(args.trials)) / args.trials
        )
        for family in FAMILIES:
            caught = sum(campaign.trial(family) for _ in range(args.trials))
            row = result["families"].setdefault(family, {"rate": campaign.rate(family)})
            row[label] = caught / args.trials
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=100, help="trials per family and dtype")
    parser.add_argument("--d-in", type=int, default=32, help="input features")
    parser.add_argument("--d", type=int, default=64, help="model width")
    parser.add_argument("--heads", type=int, default=4, help="attention heads")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per sequence")
    parser.add_argument("--batch", type=int, default=8, help="sequences per batch")
    parser.add_argument("--classes", type=int, default=10, help="output classes")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args(argv)
    if min(args.trials, args.d_in, args.d, args.heads, args.tokens, args.batch) < 1:
        parser.error("every size and --trials must be >= 1")
    if args.d % args.heads:
        parser.error("--d must be a multiple of --heads")
    result = run(args)
    print(
        f"one-step faults, {args.trials} trials per family; healthy steps flagged: "
        f"fp32 {result['false_flags_fp32']:.1%}, bf16 autocast {result['false_flags_bf16']:.1%}"
    )
    print(f"{'op family':<22}{'fp32':>8}{'bf16':>8}{'rate@1%':>9}")
    for family, row in result["families"].items():
        rate = f"{row['rate']:.2f}" if row["rate"] else "-"
        print(f"{family:<22}{row['fp32']:>8.0%}{row['bf16']:>8.0%}{rate:>9}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
