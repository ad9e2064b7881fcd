"""What each sensor family's check moves, by the dispatch-level recorder, against what the sensor
plan registers for it and the coefficient the plan prices it with.

Counts, not times: each family's probe (``costmodel.calibration.PROBES``: the op at ``--width``
features on ``--rows`` rows, fp32) runs one forward and backward with only that sensor armed
and one with none; the recorder's difference is what the check adds (bytes read and written as
fp32 elements, kernel launches, FLOPs). ``plan.CALIBRATION`` holds ``moved / registered`` per
family; this prints both, so a stale coefficient shows (and
``tests/unit/test_sensor_calibration.py`` fails when one is off by more than 25%).

    python benchmarks/sensor_calibration.py                 # width 1024, 256 rows (~30 s)
    python benchmarks/sensor_calibration.py --width 4096 --json out.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from costmodel.calibration import ROWS, WIDTH, measure_all
from results import Recorder

from sdc_agent.sensors.runtime.plan import calibration


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=WIDTH, help="features of each probe's op")
    parser.add_argument("--rows", type=int, default=ROWS, help="rows (tokens) of the batch")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    if min(args.width, args.rows) < 8:
        parser.error("--width and --rows must be >= 8")
    recorder = Recorder(__file__, argv)
    torch.set_num_threads(1)
    rows = measure_all(width=args.width, rows=args.rows)
    for row in rows:
        row["coefficient"] = calibration(row["kind"], row["op"])
    print(f"width {args.width}, {args.rows} rows, fp32: elements a check moves (recorder)")
    print(f"{'family':28}{'op':9}{'registered':>12}{'moved':>12}{'x':>7}{'table':>7}{'launch':>7}")
    for r in rows:
        print(
            f"{r['family']:28}{r['op']:9}{r['registered_elements']:12.0f}"
            f"{r['moved_elements']:12.0f}{r['ratio']:7.2f}{r['coefficient']:7.2f}{r['launches']:7d}"
        )
    if args.json:
        recorder.write(args.json, {"args": vars(args), "checks": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
