"""The node screen's campaign: faults of every kind in one simulated GPU, and what the screen
(``python -m sdc_agent.screen``) made of each; fault-free screens beside them; the runtime.

Not part of the test suite (tests/unit/test_screen_*.py pin single cases): ``make bench`` runs
it as the job ``screen-campaign`` (the tables in docs/usage/screen.md are rendered from its
results), or by hand,

    python benchmarks/screen_campaign.py
    python benchmarks/screen_campaign.py --trials 1 --devices 4 --json out.json

Each cell is a fault target (the first shape of one op kind, or ``any``: every op) x an effect
(``x1000``: one output element times 1000; ``bitflip``: its lowest bit) x a rate (on every call,
or on 10% of the calls, drawn from a seeded generator). Each trial puts that fault on one device
(trial t of cell c: device t mod N, fault seed 1000 c + t) of N simulated CPU devices and runs the screen at its
defaults (the ``small`` suite, 16 repetitions). A trial is

- ``reproduced``: the verdict names that device ``reproduced``, and nobody else;
- ``suspect``: it names that device ``suspect`` (the screen ``inconclusive``: a second screen
  decides), and nobody else;
- ``missed``: it names nobody;
- ``WRONG``: it names another device (a false name: the one outcome a screen cannot afford).

The fault-free rows run the same screens with no fault, two runs per seed: each must be
``clean`` with every device agreeing, every device's digest the same, and the same in both runs.

Exits 1 when a trial names a wrong device or a fault-free screen is not clean. What the screen
misses is reported, not an error: a miss shows a gap of the screen (a rate, a kind), which the
table makes visible.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from results import Recorder

from sdc_agent.screen import ScreenConfig, run_screen
from sdc_agent.screen.devices import simulated_devices
from sdc_agent.screen.faults import EFFECTS, TARGETS, Fault

RATES = (1.0, 0.1)
"""On every call the fault targets, and on a tenth of them."""


def outcome(result: Any, faulty: int | None) -> str:
    """What one screen said about the device that carried the fault (None: no fault)."""
    named = {
        d.device.index: d.status for d in result.devices if d.status in ("reproduced", "suspect")
    }
    if faulty is None:
        if result.verdict == "clean" and not named:
            return "clean"
        return "WRONG" if named else result.verdict
    others = set(named) - {faulty}
    if others:
        return "WRONG"
    return named.get(faulty, "missed")


def run_trial(devices: int, fault: Fault | None, index: int, seed: int) -> tuple[str, float, Any]:
    """One screen of ``devices`` simulated devices, ``fault`` on device ``index``."""
    hooks = {index: fault} if fault is not None else {}
    started = time.monotonic()
    result = run_screen(simulated_devices(devices), ScreenConfig(seed=seed), hooks=hooks)
    return outcome(result, index if fault is not None else None), time.monotonic() - started, result


def main(argv: list[str] | None = None) -> int:
    """Run the campaign; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=4, help="simulated devices per screen")
    parser.add_argument("--trials", type=int, default=3, help="trials per fault cell")
    parser.add_argument("--clean", type=int, default=6, help="fault-free screens")
    parser.add_argument("--json", help="write the results here")
    recorder = Recorder(__file__, argv)
    args = parser.parse_args(argv)
    if args.devices < 3:
        parser.error("--devices must be at least 3 (a strict majority must outvote one device)")
    if args.trials < 1 or args.clean < 1:
        parser.error("--trials and --clean must be at least 1")

    print(f"Screen campaign: {args.devices} simulated devices, {args.trials} trials per cell")
    cells: list[dict[str, Any]] = []
    seconds: list[float] = []
    kinds = [(t, e, r) for t in TARGETS for e in EFFECTS for r in RATES]
    for number, (target, effect, rate) in enumerate(kinds):
        counts = {"reproduced": 0, "suspect": 0, "missed": 0, "WRONG": 0}
        for trial in range(args.trials):
            # A seed per cell and trial: the same draws in every run, independent across cells.
            fault = Fault(target, effect, probability=rate, seed=1000 * number + trial)
            said, took, _ = run_trial(args.devices, fault, trial % args.devices, trial)
            counts[said] += 1
            seconds.append(took)
        cells.append({"target": target, "effect": effect, "rate": rate, **counts})
        print(f"{target}-{effect}:{rate:g}: {counts}")

    clean: dict[str, int] = {}
    digests: dict[int, set[tuple[str, ...]]] = {}
    for run in range(args.clean):
        # Two runs per seed: the same seed must give the same digests in every run, and every
        # device the same digest; other seeds draw other inputs a false name could come from.
        seed = 100 * (run // 2)
        said, took, result = run_trial(args.devices, None, 0, seed)
        clean[said] = clean.get(said, 0) + 1
        digests.setdefault(seed, set()).add(tuple(d.digest for d in result.devices))
        seconds.append(took)
    same_digests = all(
        len(runs) == 1 and len(set(next(iter(runs)))) == 1 for runs in digests.values()
    )
    print(f"fault-free: {clean}; the same digests on every device and run: {same_digests}")

    wrong = sum(c["WRONG"] for c in cells) + sum(v for k, v in clean.items() if k != "clean")
    trials = sum(c["reproduced"] + c["suspect"] + c["missed"] + c["WRONG"] for c in cells)
    reproduced = sum(c["reproduced"] for c in cells)
    print(
        f"{reproduced} of {trials} faulty screens reproduced; {wrong} wrong or unclean; "
        f"screen time median {statistics.median(seconds):.2f} s, max {max(seconds):.2f} s"
    )
    if args.json:
        recorder.write(
            args.json,
            {
                "devices": args.devices,
                "trials": args.trials,
                "cells": cells,
                "clean": clean,
                "clean_runs": args.clean,
                "same_digests": same_digests,
                "screen_s": {
                    "median": round(statistics.median(seconds), 3),
                    "max": round(max(seconds), 3),
                    "screens": len(seconds),
                },
            },
        )
    return 1 if wrong or not same_digests else 0


if __name__ == "__main__":
    raise SystemExit(main())
