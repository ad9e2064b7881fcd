"""Raw benchmark results, written with what it takes to read and rerun them.

Every benchmark behind a published figure writes its figures through :class:`Recorder` when it
is given ``--json PATH`` (``make bench`` passes ``benchmarks/results/<name>.json``). The file is
the script's own summary plus a ``provenance`` entry: the command as typed (argv, relative to the
repository root), when it started and finished (UTC), the machine (CPU model, cores, memory; no
host name), the load average before and after and sampled during the run, the Python and torch
versions and the git commit (and whether the benchmark or agent sources differed from it).
``benchmarks/render.py`` turns these files into the tables of docs/performance.md.

A figure measured on a shared machine means little without the load it was measured under, which
is why the load is sampled for the whole run rather than read once.

    recorder = results.Recorder(__file__, argv)  # first thing in main(): clock and load start
    ...                                # measure
    recorder.write(args.json, summary)           # summary: the script's dict of raw figures
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "benchmarks" / "results"
# Sources whose changes change a figure: a results file lists those that differed from its
# commit (the results themselves, the runner and the renderer measure nothing).
MEASURED_SOURCES = (
    "agent/src",
    "benchmarks",
    "tests/support",
    ":(exclude)benchmarks/results",
    ":(exclude)benchmarks/bench.py",
    ":(exclude)benchmarks/render.py",
)


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def machine() -> dict[str, Any]:
    """The machine a figure was measured on, without anything that identifies the host."""
    cpu_model = None
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            cpu_model = line.split(":", 1)[1].strip()
            break
    mem_gib = None
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            mem_gib = round(int(line.split()[1]) / 2**20, 1)
            break
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    return {
        "cpu_model": cpu_model or platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "cpus_usable": affinity,
        "memory_gib": mem_gib,
        "arch": platform.machine(),
        "system": f"{platform.system()} {platform.release()}",
    }


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout


def software() -> dict[str, Any]:
    """Python, torch and the git commit the figures were measured with."""
    try:
        import torch

        torch_version: str | None = torch.__version__
    except ImportError:  # the publisher benchmark needs no torch
        torch_version = None
    changed = _git("status", "--porcelain", "--", *MEASURED_SOURCES)
    return {
        "python": platform.python_version(),
        "torch": torch_version,
        "git_commit": (_git("rev-parse", "HEAD") or "").strip() or None,
        # Uncommitted edits to what is measured: the commit alone would not reproduce the figure.
        "sources_modified": (
            [line[3:] for line in changed.splitlines() if line] if changed is not None else None
        ),
    }


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _command(script: str, argv: list[str]) -> list[str]:
    """The command as a reader would type it from the repository root."""
    path = Path(script).resolve()
    try:
        shown = str(path.relative_to(REPO))
    except ValueError:
        shown = str(path)
    return ["python", shown, *argv]


class Recorder:
    """Times a benchmark run, samples the load during it, and writes its results file.

    Construct it at the start of ``main()`` with the script's ``__file__`` and the ``argv`` main
    received (None: the process's own, ``sys.argv[1:]``); the start time and the first load
    sample are taken here. :meth:`write` stops the sampling and writes the file. ``interval`` is
    the load sampling period in seconds.
    """

    def __init__(
        self, script: str, argv: list[str] | None = None, *, interval: float = 5.0
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be positive, got {interval}")
        self.command = _command(script, list(sys.argv[1:] if argv is None else argv))
        self.started = _now()
        # The tree the run's code came from: read now, as a commit made while a long run goes
        # on is not what it ran.
        self.software = software()
        self.load_before = [round(x, 2) for x in os.getloadavg()]
        self._samples: list[float] = [self.load_before[0]]
        self._stop = threading.Event()
        self._interval = interval
        self._thread = threading.Thread(target=self._sample, name="load-sampler", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self._interval):
            self._samples.append(round(os.getloadavg()[0], 2))

    def provenance(self) -> dict[str, Any]:
        """What :meth:`write` adds to the figures (stops the load sampling)."""
        self._stop.set()
        self._thread.join(timeout=self._interval + 1)
        samples = [*self._samples, round(os.getloadavg()[0], 2)]
        return {
            "command": self.command,
            "started_utc": self.started,
            "finished_utc": _now(),
            "machine": machine(),
            "load": {
                "before": self.load_before,
                "after": [round(x, 2) for x in os.getloadavg()],
                "during_mean": round(sum(samples) / len(samples), 2),
                "during_max": max(samples),
                "samples": len(samples),
                "sample_interval_s": self._interval,
            },
            **self.software,
        }

    def write(self, path: Path | str, figures: dict[str, Any]) -> Path:
        """Write ``figures`` (the script's raw results) with their provenance to ``path``."""
        if not isinstance(figures, dict):
            raise TypeError(f"figures must be a dict, got {type(figures).__name__}")
        if "provenance" in figures:
            raise ValueError("figures must not have a 'provenance' key: write() adds it")
        path = Path(path)
        document = {"provenance": self.provenance(), **figures}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, indent=2, default=str) + "\n")
        return path


def load(path: Path | str) -> dict[str, Any]:
    """Read a results file, with a clear error when it is not one."""
    path = Path(path)
    try:
        document = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable results file: {exc}") from exc
    if not isinstance(document, dict) or "provenance" not in document:
        raise ValueError(f"{path}: no 'provenance' entry: not written by benchmarks/results.py")
    return document


def short_time(us: float) -> str:
    """Microseconds as a short human figure (the tables' time columns)."""
    return f"{us / 1000:.1f} ms" if us >= 1000 else f"{us:.0f} us"


def short_size(nbytes: float) -> str:
    """Bytes as a short human figure (the tables' size columns)."""
    for unit, scale in (("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} B"


def model_cell(cell: dict[str, Any] | None) -> str:
    """One modelled collective at one rank count, as the model tables print it: time
    (algorithm/protocol, hops, bytes), with the ring's time where another algorithm wins by
    more than 5%; None (the collective has one rank there) reads "- (one rank)"."""
    if cell is None:
        return "- (one rank)"
    text = f"{short_time(cell['total_us'])} ({cell['best']}, {cell['hops']:,} hops, "
    text += f"{short_size(cell['bytes'])})"
    if cell["ring_total_us"] > cell["total_us"] * 1.05:
        text += f" [ring {short_time(cell['ring_total_us'])}]"
    return text
