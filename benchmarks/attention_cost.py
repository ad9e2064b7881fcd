"""What the checked attention path costs against the fused SDPA kernel, on a Llama's training step.

``sdc.protect(model, attention="checked")`` replaces ``F.scaled_dot_product_attention`` by an
unfused path whose GEMMs and softmax are checked (sensors/ops/attention.py); it runs on every step,
checked or not (replays must reproduce training bit for bit), so its cost is paid always. This
times one process's forward and backward of the test Llama (tests/support/llama.py, with the
sequence length raised) under three settings: the plain model (fused kernel), protected with the
fused kernel, protected with the checked path; each with no sensor checking and with every
sensor checking. CPU time per step, best of ``--rounds``.

    python benchmarks/attention_cost.py                    # sequences of 16, 128 and 512 tokens
    python benchmarks/attention_cost.py --tokens 16,1024 --json cost.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from results import Recorder

# The Llama comes from the tests' support package (transformers is a development dependency).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import sdc_agent as sdc
from sdc_agent.sensors.runtime.board import SensorBoard
from tests.support.llama import VOCAB, llama


def step_seconds(
    model: torch.nn.Module, ids: torch.Tensor, board: SensorBoard | None, armed: bool, steps: int
) -> float:
    """CPU seconds per forward and backward."""
    if board is not None:
        board.arm(frozenset(range(len(board))) if armed else frozenset())
    started = time.process_time()
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
    spent = (time.process_time() - started) / steps
    if board is not None:
        board.disarm()
    return spent


def measure(tokens: int, batch: int, steps: int, rounds: int) -> dict[str, Any]:
    """Per setting, the best of ``rounds`` CPU seconds per step at ``tokens`` per sequence."""
    ids = torch.randint(0, VOCAB, (batch, tokens), generator=torch.Generator().manual_seed(0))
    plain = llama()
    fused, checked = llama(), llama()
    boards = {
        "fused": sdc.protect(fused, attention="fused"),
        "checked": sdc.protect(checked, attention="checked"),
    }
    for model in (plain, fused, checked):  # discovery pass, warm kernels
        model(input_ids=ids, labels=ids).loss.backward()
    settings = {
        "plain": (plain, None, False),
        "fused, idle": (fused, boards["fused"], False),
        "fused, every sensor": (fused, boards["fused"], True),
        "checked, idle": (checked, boards["checked"], False),
        "checked, every sensor": (checked, boards["checked"], True),
    }
    best = {name: float("inf") for name in settings}
    for _ in range(rounds):
        for name, (model, board, armed) in settings.items():
            best[name] = min(best[name], step_seconds(model, ids, board, armed, steps))
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="16,128,512", help="sequence lengths, comma-separated")
    parser.add_argument("--batch", type=int, default=2, help="sequences per step")
    parser.add_argument("--steps", type=int, default=5, help="steps per timed round")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (best is kept)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    recorder = Recorder(__file__, argv)
    lengths = [int(t) for t in args.tokens.split(",") if t.strip()]
    if not lengths or min(lengths) < 2 or min(args.batch, args.steps, args.rounds) < 1:
        parser.error("--tokens >= 2 each; --batch, --steps, --rounds >= 1")
    torch.set_num_threads(1)
    report = {}
    for tokens in lengths:
        best = measure(tokens, args.batch, args.steps, args.rounds)
        report[tokens] = best
        base = best["plain"]
        print(f"{tokens} tokens x {args.batch}: CPU ms per step (vs the plain model)")
        for name, seconds in best.items():
            print(f"  {name:<22}{seconds * 1e3:9.1f}  {seconds / base - 1:+7.1%}")
    if args.json:
        recorder.write(args.json, {"args": vars(args), "tokens": report})
    return 0


if __name__ == "__main__":
    sys.exit(main())
