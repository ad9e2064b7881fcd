"""Run the benchmarks behind docs/performance.md's figures, then render its tables.

``make bench`` runs this: every job below, one after the other (they would disturb each other's
timings on a small machine), each writing ``benchmarks/results/<job>.json`` through its
``--json`` option (``benchmarks/results.py`` adds the command, machine, load and versions), and
then ``benchmarks/render.py``, which rewrites the tables of docs/performance.md from those files.

    python benchmarks/bench.py                       # everything (see --list for the times)
    python benchmarks/bench.py --only fingerprint,attention-cost
    python benchmarks/bench.py --skip campaign,sensor-soak-llama-fp32
    python benchmarks/bench.py --list                # the jobs, their commands and last times
    make bench BENCH=fingerprint,overhead-ddp        # the same through make

A job that fails is reported and the next ones still run; the exit status is 1 if any failed.
Its previous results file, if any, is kept (the tables then show the last successful run, whose
date and load they print).
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from results import REPO, RESULTS_DIR, load


@dataclass(frozen=True, kw_only=True)
class Job:
    """One benchmark command behind published figures; its results go to ``<name>.json``."""

    name: str
    script: str
    args: tuple[str, ...] = ()
    tables: str = ""
    """What in docs/performance.md it feeds (for --list)."""

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name != self.name.strip():
            raise ValueError(f"name: not a plain file name: {self.name!r}")
        if not (REPO / "benchmarks" / self.script).is_file():
            raise ValueError(f"script: benchmarks/{self.script} does not exist")
        if "--json" in self.args:
            raise ValueError("args: --json is added by the runner")

    @property
    def results_path(self) -> Path:
        """Where the job's results file goes."""
        return RESULTS_DIR / f"{self.name}.json"

    def command(self, python: str = sys.executable) -> list[str]:
        """The command the runner executes, from the repository root."""
        results = self.results_path.relative_to(REPO)
        return [python, f"benchmarks/{self.script}", *self.args, "--json", str(results)]


# In the order they run: the quick ones first, so that a partial run still renders most tables.
# The flags are the ones the published figures were measured with.
JOBS: tuple[Job, ...] = (
    Job(name="collectives-model", script="collectives.py", args=("--model",),
        tables="NCCL's modelled collectives, the pipeline's, weights_max against T"),
    Job(name="fingerprint", script="fingerprint.py", args=("--large", "--reps", "9"),
        tables="the fingerprint's CPU throughput"),
    Job(name="finite-check-fp32", script="finite_check.py",
        tables="check 1's local test under FSDP2, float32 column"),
    Job(name="finite-check-bf16", script="finite_check.py", args=("--dtype", "bfloat16"),
        tables="check 1's local test under FSDP2, bf16 column"),
    Job(name="finite-check-2threads", script="finite_check.py", args=("--threads", "2"),
        tables="check 1's local test under FSDP2, 2-thread column"),
    Job(name="attention-cost", script="attention_cost.py",
        tables="the checked attention's cost"),
    Job(name="mistakes-held-out", script="mistakes.py",
        tables="the held-out user mistakes (docs/recovery.md)"),
    Job(name="screen-campaign", script="screen_campaign.py",
        tables="the node screen's faults by kind and its runtime (docs/usage/screen.md)"),
    Job(name="sensor-calibration", script="sensor_calibration.py",
        tables="what each sensor's check moves against the plan's cost coefficients"),
    Job(name="step-work", script="step_work.py",
        tables="the always-on path counted (this tree)"),
    # Each job's launch may take 30 min on 2 busy cores ((a) 8B passed 15 min): its own limit.
    Job(name="step-cost", script="step_cost.py", args=("--timeout", "1800"),
        tables="the GPU cost model: what the guard adds to (a), (b) and the 953M job's steps"),
    Job(name="publish", script="publish.py", args=("--steps", "1000"),
        tables="the publisher's step times (docs/agent-install.md)"),
    Job(name="collectives-gloo", script="collectives.py",
        tables="the guard's collectives on gloo, 3-12 processes"),
    Job(name="overhead-ddp", script="overhead.py",
        tables="the guard's overhead over plain DDP, accumulation"),
    Job(name="overhead-2nodes", script="overhead.py",
        args=("--nodes", "2", "--variants", "checks,weights10", "--rounds", "5"),
        tables="the guard's overhead, one core per process"),
    Job(name="overhead-sensors", script="overhead.py",
        args=("--variants", "checks,sensors,sensors_full"),
        tables="online sensors' overhead"),
    Job(name="overhead-fsdp", script="overhead.py",
        args=("--nodes", "3", "--ranks-per-node", "2", "--variants", "fsdp,hsdp", "--rounds", "2"),
        tables="FSDP2 and HSDP over their unguarded loops"),
    Job(name="sensor-ratios", script="sensor_ratios.py", args=("--trials", "30"),
        tables="healthy ratios and x1.1 detection per op family"),
    Job(name="campaign", script="campaign.py", args=("--trials", "20"),
        tables="the single-fault campaign on a Llama, the sensors' overhead on it"),
    Job(name="sensor-soak-drill-fp32", script="sensor_soak.py",
        args=("--model", "drill", "--steps", "2000"), tables="sensor soak, drill model fp32"),
    Job(name="sensor-soak-drill-bf16", script="sensor_soak.py",
        args=("--model", "drill", "--dtype", "bf16", "--steps", "2000"),
        tables="sensor soak, drill model bf16"),
    Job(name="sensor-soak-llama-bf16", script="sensor_soak.py",
        args=("--model", "llama", "--dtype", "bf16", "--attention", "checked", "--steps", "2000"),
        tables="sensor soak, Llama bf16, checked attention"),
    Job(name="sensor-soak-llama-fp32", script="sensor_soak.py",
        args=("--model", "llama", "--attention", "checked", "--steps", "2000"),
        tables="sensor soak, Llama fp32, checked attention"),
    Job(name="overhead-tp", script="overhead.py",
        args=("--nodes", "3", "--ranks-per-node", "2", "--variants", "tp,hsdp", "--rounds", "2"),
        tables="HSDP x TP over its unguarded TP loop"),
    Job(name="overhead-pp", script="overhead.py",
        args=("--nodes", "3", "--ranks-per-node", "2", "--variants", "pp", "--rounds", "2"),
        tables="PP x HSDP over its unguarded pipeline loop"),
    Job(name="three-d-clean", script="three_d.py",
        args=("--scenarios", "clean", "--steps", "50", "--bf16"),
        tables="TP x PP x HSDP on 12 processes, fault-free"),
    Job(name="three-d-faults", script="three_d.py", args=("--scenarios", "output,wgrad,weight"),
        tables="TP x PP x HSDP on 12 processes, injected faults"),
)  # fmt: skip
BY_NAME = {job.name: job for job in JOBS}


def _names(text: str, parser: argparse.ArgumentParser, option: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        parser.error(f"{option}: unknown job(s) {unknown}; --list shows them")
    return names


def _seconds(started: str, finished: str) -> float:
    parse = datetime.datetime.fromisoformat
    delta = parse(finished.replace("Z", "+00:00")) - parse(started.replace("Z", "+00:00"))
    return delta.total_seconds()


def last_duration(job: Job) -> float | None:
    """Seconds the job's last recorded run took (from its results file), None if never run."""
    if not job.results_path.exists():
        return None
    meta = load(job.results_path)["provenance"]
    return meta.get("runner_wall_s") or _seconds(meta["started_utc"], meta["finished_utc"])


def record_wall_time(job: Job, seconds: float) -> None:
    """Add the whole command's wall time (interpreter start and imports included, which the
    script's own clock misses) to the results file the job just wrote."""
    document = load(job.results_path)
    document["provenance"]["runner_wall_s"] = round(seconds, 1)
    job.results_path.write_text(json.dumps(document, indent=2, default=str) + "\n")


def list_jobs() -> None:
    """Print every job, its command and how long its last recorded run took."""
    total = 0.0
    for job in JOBS:
        seconds = last_duration(job)
        total += seconds or 0.0
        took = f"{seconds:5.0f} s" if seconds is not None else "  never"
        print(f"{job.name:24} {took}  python {' '.join(job.command('')[1:-2])}")
        print(f"{'':24}          -> {job.tables}")
    print(f"sum of the last recorded runs: {total / 60:.0f} min")


def main(argv: list[str] | None = None) -> int:
    """Run the chosen jobs, then render the tables; 1 if any job failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated jobs to run (default: all)")
    parser.add_argument("--skip", default="", help="comma-separated jobs not to run")
    parser.add_argument("--list", action="store_true", help="list the jobs and exit")
    parser.add_argument("--no-render", action="store_true", help="do not run render.py after")
    args = parser.parse_args(argv)
    if args.list:
        list_jobs()
        return 0
    only = _names(args.only, parser, "--only")
    skip = set(_names(args.skip, parser, "--skip"))
    jobs = [j for j in JOBS if (not only or j.name in only) and j.name not in skip]
    failed: list[str] = []
    started = time.monotonic()
    for i, job in enumerate(jobs, 1):
        command = job.command()
        print(f"== [{i}/{len(jobs)}] {job.name}: {' '.join(command[1:])}", flush=True)
        job_started = time.monotonic()
        # The scripts write their file last, once they have measured: a run that fails early
        # leaves the previous results file (with its own date) in place.
        code = subprocess.run(command, cwd=REPO, check=False).returncode
        took = time.monotonic() - job_started
        if code == 0:
            record_wall_time(job, took)
            print(f"== {job.name}: {took:.0f} s -> {command[-1]}")
        else:
            failed.append(job.name)
            print(f"== {job.name}: FAILED (exit {code}) after {took:.0f} s", flush=True)
    print(f"== {len(jobs)} job(s) in {(time.monotonic() - started) / 60:.1f} min", flush=True)
    if not args.no_render:
        render = [sys.executable, "benchmarks/render.py"]
        if subprocess.run(render, cwd=REPO, check=False).returncode:
            failed.append("render")
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
