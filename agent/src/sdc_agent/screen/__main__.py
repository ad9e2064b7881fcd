"""``python -m sdc_agent.screen``: screen every GPU of this node (docs/usage/screen.md).

Prints the one ``sdc.screen/v1`` result document (compact JSON, at most 4096 bytes) to stdout,
writes the same text to the termination log (the Kubernetes termination message, which the
pipeline reads), and exits with the verdict's code (:data:`sdc_contract.screen.SCREEN_EXIT_CODES`:
clean 0, reproduced 3, inconclusive 4, failed 5). A bad command line (an unknown flag, a fault
without ``--simulate``) is argparse's exit 2 with its message. A workload or golden store that
cannot be read is a ``failed`` result whose ``error`` names the file and the field, so the
pipeline learns why from the termination message and not only from the pod's log.

``--simulate N`` screens N simulated devices on the CPU instead of the GPUs, and only then may
``--fault`` inject a fault (tests and demos: :mod:`sdc_agent.screen.faults`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sdc_contract._json import json_object
from sdc_contract.report import ALARM_SCHEMA
from sdc_contract.screen import (
    SCREEN_EXIT_CODES,
    TERMINATION_MESSAGE_BYTES,
    OpSpec,
    parse_workload,
)

from .devices import ScreenDevice, cuda_devices, simulated_devices
from .golden import GoldenStore
from .ops import SIZES, OutputHook, Size
from .report import document, dumps
from .runner import DEFAULT_BUDGET_S, DEFAULT_REPETITIONS, ScreenConfig, ScreenResult, run_screen

PROG = "python -m sdc_agent.screen"
TERMINATION_LOG = Path("/dev/termination-log")
"""Where Kubernetes reads a container's termination message by default."""


def _whole_number(text: str, minimum: int, expected: str) -> int:
    """``text`` as an int of at least ``minimum`` (argparse's error says ``expected``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
    return value


def _positive_int(text: str) -> int:
    return _whole_number(text, 1, "at least 1")


def _non_negative_int(text: str) -> int:
    return _whole_number(text, 0, "0 or more")


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The command line (``--help`` describes every flag)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Known-answer SDC screen of every GPU of this node: the same seeded ops on "
        "every GPU, compared bit for bit across the GPUs and with golden digests. Prints one "
        "sdc.screen/v1 JSON document; exit code 0 clean, 3 reproduced, 4 inconclusive, "
        "5 failed, 2 bad command line.",
    )
    parser.add_argument(
        "--workload",
        metavar="PATH",
        type=Path,
        help="the job's ops, run after the fixed suite: an sdc.workload/v1 JSON file, or an "
        "alarm report (sdc.alarm/v1) whose 'workload' the guard recorded ('-' reads standard "
        "input)",
    )
    parser.add_argument(
        "--repetitions",
        type=_positive_int,
        default=DEFAULT_REPETITIONS,
        metavar="N",
        help=f"at most N repetitions, each with a new seed (default {DEFAULT_REPETITIONS})",
    )
    parser.add_argument(
        "--budget-s",
        type=_positive_seconds,
        default=DEFAULT_BUDGET_S,
        metavar="SECONDS",
        help="start no new repetition after this many seconds; the first always runs "
        f"(default {DEFAULT_BUDGET_S:g})",
    )
    parser.add_argument(
        "--seed",
        type=_non_negative_int,
        default=0,
        metavar="N",
        help="repetition r uses seed N + r (default 0)",
    )
    parser.add_argument(
        "--size",
        choices=SIZES,
        default=None,
        help="the fixed suite's shapes (default: training on GPUs, small with --simulate)",
    )
    parser.add_argument(
        "--golden",
        metavar="PATH",
        type=Path,
        help="the golden digest store (sdc.screen-golden/v1 JSON) to compare with, and to learn "
        "into after a clean screen of two devices or more; created when absent",
    )
    parser.add_argument(
        "--no-learn",
        action="store_true",
        help="compare with the golden store but never add to it",
    )
    parser.add_argument(
        "--simulate",
        type=_positive_int,
        metavar="N",
        help="screen N simulated devices on the CPU instead of the GPUs (tests and demos)",
    )
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="with --simulate only: inject a fault, DEVICE:TARGET-EFFECT[:PROBABILITY], e.g. "
        "1:gemm-x1000, 2:reduction-bitflip, 0:any-x1000:0.1 (repeatable, one per device)",
    )
    parser.add_argument(
        "--fault-seed",
        type=_non_negative_int,
        default=0,
        metavar="N",
        help="seeds which calls an intermittent fault fires on (default 0)",
    )
    log = parser.add_mutually_exclusive_group()
    log.add_argument(
        "--termination-log",
        metavar="PATH",
        type=Path,
        default=None,
        help=f"also write the result here (default {TERMINATION_LOG} when it exists: the "
        f"Kubernetes termination message, at most {TERMINATION_MESSAGE_BYTES} bytes)",
    )
    log.add_argument(
        "--no-termination-log",
        action="store_true",
        help="write the result to standard output only",
    )
    return parser


def _hooks(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[int, OutputHook]:
    """The faults asked for, checked against the simulated devices (argparse exits on error)."""
    if not args.fault:
        return {}
    if args.simulate is None:
        parser.error("--fault needs --simulate N: faults are injected into simulated devices only")
    # Imported only when asked for: nothing in a real screen loads the fault injector.
    from . import faults

    try:
        found = faults.hooks(list(args.fault), seed=args.fault_seed)
    except ValueError as exc:
        parser.error(f"--fault: {exc}")
    beyond = sorted(i for i in found if i >= args.simulate)
    if beyond:
        parser.error(
            f"--fault: device(s) {beyond} do not exist with --simulate {args.simulate} "
            f"(devices 0 to {args.simulate - 1})"
        )
    return found


def _workload(path: Path | None) -> tuple[OpSpec, ...]:
    """The workload file's ops; ValueError names the file and the field that is wrong."""
    if path is None:
        return ()
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the workload {path}: {exc}") from None
    try:
        return parse_workload(workload_of(text))
    except ValueError as exc:
        raise ValueError(f"workload {path}: {exc}") from None


def workload_of(text: str) -> Any:
    """The workload document in ``text``: the text itself, or an alarm report's (``sdc.alarm/v1``)
    ``workload``; ValueError when a report has none."""
    doc = json_object(text, '{"schema": "sdc.workload/v1", "ops": [...]} or an sdc.alarm/v1 report')
    if doc is None or doc.get("schema") != ALARM_SCHEMA:
        return text  # parse_workload says what is wrong with it
    workload = doc.get("workload")
    if workload is None:
        raise ValueError(
            f"the alarm report (schema {ALARM_SCHEMA!r}, step {doc.get('step')!r}) has no "
            "'workload': the guard that wrote it recorded none (an older agent, or nothing it "
            "records ran); pass an sdc.workload/v1 file instead"
        )
    return workload


def _failed(error: str) -> ScreenResult:
    """A result for a screen that could not start."""
    return ScreenResult(
        verdict="failed", summary=f"failed: {error}", error=error, durations_s={"total": 0.0}
    )


def _termination_log(args: argparse.Namespace) -> Path | None:
    if args.no_termination_log:
        return None
    if args.termination_log is not None:
        return Path(args.termination_log)
    return TERMINATION_LOG if TERMINATION_LOG.exists() else None


def screen(args: argparse.Namespace, hooks: dict[int, OutputHook]) -> ScreenResult:
    """Run the screen the parsed command line asks for; never raises for bad input files."""
    try:
        workload = _workload(args.workload)
        store = GoldenStore.load(args.golden) if args.golden is not None else None
    except ValueError as exc:
        return _failed(str(exc))
    devices: list[ScreenDevice]
    if args.simulate is not None:
        devices = simulated_devices(args.simulate)
    else:
        devices = cuda_devices()
        if not devices:
            return _failed("no CUDA device is visible (--simulate N screens N CPU devices)")
    size: Size | None = args.size
    config = ScreenConfig(
        workload=workload,
        size=size,
        repetitions=args.repetitions,
        budget_s=args.budget_s,
        seed=args.seed,
        learn_golden=not args.no_learn,
    )
    return run_screen(devices, config, golden=store, hooks=hooks)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (argparse exits with 2 itself on a bad command line)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    hooks = _hooks(parser, args)
    result = screen(args, hooks)
    text = dumps(document(result))
    print(text, flush=True)
    if result.error is not None:
        print(f"{PROG}: {result.error}", file=sys.stderr)
    path = _termination_log(args)
    if path is not None:
        try:
            path.write_text(text)
        except OSError as exc:
            # The verdict stands; the pipeline, lacking the message, reads the exit code.
            print(f"{PROG}: cannot write the termination log {path}: {exc}", file=sys.stderr)
    return SCREEN_EXIT_CODES[result.verdict]


if __name__ == "__main__":
    sys.exit(main())
