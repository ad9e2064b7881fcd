"""What the guard adds to a GPU training step, by a cost model that runs on a CPU.

A MODEL, not a measurement: no GPU runs here. For each named job (``costmodel.project.JOBS``:
(a) Llama-3-8B under FSDP2 on 64 GPUs, (b) Llama-3-70B TP8 x FSDP2 on 1,024 GPUs, the AWS
blog's 953M DDP job on 32 H100 at an assumed shape) a shape-faithful slice (one and two decoder
layers at the real width, heads, key/value heads and FFN size, one rank's share under TP; a
short sequence, a small vocabulary) runs on three gloo processes (three simulated nodes, as the
audits need), plainly and under ``sdc_agent.Guard`` in five configurations:

* ``checks``: check 1 + flags only (model not protected, no audit, no weight check);
* ``weights``: + weight fingerprints every 10 steps (a check step and the step that judges it,
  amortised 1/10);
* ``audit``: + deterministic ring replay audits every 100 steps (an audit step, amortised 1/100);
  the time rows amortise a later weight check and audit, not the first (whose preflight and
  fingerprint-plan constants a process pays once; they count in the peak memory);
* ``sensors``: ``sdc.protect(model)`` at the default budget after the burn-in: a step on which
  no sensor checks, plus the burst step on which every one does (the ``sensors_all`` step),
  amortised over the period the plan makes for a GPU;
* ``sensors_all``: every sensor on every step (``sensor_budget=math.inf``, also the burn-in's
  cost and the peak memory at step 0).

``costmodel.recorder.StepRecorder`` counts every aten operator of the recorded steps on rank 0
(bytes read and written, FLOPs, launches), the host syncs, blocking waits and collectives, and
the live memory of the tensors the step creates; ``costmodel.project`` scales them to the full
model (tokens and vocabulary by shape, layers from the 1- and 2-layer difference, micro-batches)
and times them on an H100 and an H200 with the constants it states. bf16 GEMMs are computed as
fp32 products rounded once (4x faster on this CPU; recorded as the bf16 GEMMs they stand for),
and a protected layer takes the CUDA path of ``mm(out_dtype=float32)`` (emulated the same way):
what the recorder counts is what a GPU would run.

    python benchmarks/step_cost.py                          # all three jobs (~5-10 min, 2 cores)
    python benchmarks/step_cost.py --jobs blog-953m-ddp     # one
    python benchmarks/step_cost.py --json out.json
    python benchmarks/step_cost.py --jobs blog-953m-ddp --add-to out.json --json out.json
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path
from typing import Any

import torch
from results import Recorder

sys.path.insert(0, str(Path(__file__).resolve().parent))
from costmodel import project, slices
from costmodel.recorder import Scaling, difference

from sdc_agent.drills.launch import launch

WORLD = 3
"""Processes (one per simulated node): an audit needs a replayer and a third node."""
TOP_OPS = 12


def _scaling(job: project.Job, tokens: int, vocab: int) -> Scaling:
    return Scaling(
        tokens=tokens,
        full_sequence=job.sequence,
        full_batch=job.micro_batch,
        vocab=vocab,
        full_vocab=job.local_vocab,
    )


def measure(job: str, group: str, tokens: int, vocab: int) -> dict[str, Any]:
    """On every rank: record the slice at 1 and 2 layers, plainly and under each configuration
    of ``group`` (``single``: one process; ``periodic``: three); rank 0 returns them."""
    import torch.distributed as dist

    from sdc_agent.sensors.runtime.plan import plan_sensors

    spec = project.JOBS_BY_NAME[job]
    shape = slices.SliceShape(**spec.slice_shape(), parallel=spec.parallel, bf16=spec.bf16)
    scaling = _scaling(spec, tokens, vocab)
    configurations = (
        (slices.PLAIN, *slices.CONFIGURATIONS) if group == "single" else (slices.PERIODIC,)
    )
    out: dict[str, Any] = {"rank": dist.get_rank(), "recordings": {}, "seconds": {}}
    for layers in (1, 2):
        recordings: dict[str, list[dict[str, Any]]] = {}
        for configuration in configurations:
            started = time.monotonic()
            built = slices.build(shape, configuration, layers=layers, tokens=tokens, vocab=vocab)
            recordings[configuration.name] = slices.record_steps(
                built, configuration, scaling=scaling, timer=project.roofline
            )
            if configuration.name == "sensors_idle":
                if any(r["sensing"] for r in recordings[configuration.name]):
                    raise RuntimeError("sensors_idle: a recorded step had sensors checking")
                # The period a GPU's plan makes (reads cost more there than on this CPU), for
                # the full micro-batch's rows.
                plan = plan_sensors(
                    built.board,
                    built.guard.schedule.sensor_budget,  # type: ignore[union-attr]
                    rows=spec.sequence * spec.micro_batch,
                    device_type="cuda",
                    burst=True,
                )
                out["period"] = plan.period
            del built
            gc.collect()
            out["seconds"][f"{configuration.name}/{layers}"] = round(time.monotonic() - started, 1)
        out["recordings"][layers] = recordings
    return out if dist.get_rank() == 0 else {"rank": dist.get_rank()}


def _compact(recording: dict[str, Any]) -> dict[str, Any]:
    """A recorded step without its per-operator tables (they stay in the top-ops lists)."""
    return {
        "phases": {
            p: {k: v for k, v in phase.items() if k != "ops"}
            for p, phase in recording["phases"].items()
        },
        "peak_bytes": recording["peak_bytes"],
        "peak_full_bytes": recording["peak_full_bytes"],
        "sensing": recording["sensing"],
    }


def _top_ops(guarded: dict[str, Any], plain: dict[str, Any]) -> list[dict[str, Any]]:
    """The operators whose calls the configuration adds, by added modelled H100 time (2 layers,
    both phases)."""
    rows = []
    for phase in ("micro", "step"):
        g, p = guarded["phases"][phase]["ops"], plain["phases"][phase]["ops"]
        for name in set(g) | set(p):
            a, b = g.get(name, {}), p.get(name, {})
            seconds = a.get("modelled_s", {}).get("H100", 0.0) - b.get("modelled_s", {}).get(
                "H100", 0.0
            )
            calls = a.get("calls", 0) - b.get("calls", 0)
            if calls or abs(seconds) > 0:
                rows.append(
                    {
                        "phase": phase,
                        "op": name,
                        "calls": calls,
                        "launches": a.get("launches", 0) - b.get("launches", 0),
                        "full_bytes": a.get("full_bytes", 0.0) - b.get("full_bytes", 0.0),
                        "h100_s": seconds,
                    }
                )
    rows.sort(key=lambda r: -abs(r["h100_s"]))
    return rows[:TOP_OPS]


def run_job(job: project.Job, args: argparse.Namespace) -> dict[str, Any]:
    """Record the job's slice at 1 and 2 layers and project it."""
    by_layers: dict[int, dict[str, list[dict[str, Any]]]] = {1: {}, 2: {}}
    seconds: dict[str, float] = {}
    period = None
    for group, world in (("single", 1), ("periodic", WORLD)):
        kwargs = {"job": job.name, "group": group, "tokens": args.tokens, "vocab": args.vocab}
        [per_rank] = launch(
            [(f"{Path(__file__).stem}:measure", kwargs)],
            world=world,
            ranks_per_node=1,
            timeout_s=args.timeout,
        )
        errors = [r for r in per_rank if "error" in r]
        if errors:
            raise RuntimeError(f"{job.name}, {group}:\n{errors[0]['trace']}")
        rank0 = next(r for r in per_rank if r["rank"] == 0)
        for layers, recordings in rank0["recordings"].items():
            by_layers[int(layers)].update(recordings)
        period = rank0.get("period", period)
        seconds.update(rank0["seconds"])
        print(f"  {job.name}: {group} recorded ({rank0['seconds']} s)", flush=True)
    projection = project.project(by_layers, job, period)  # type: ignore[arg-type]
    two = by_layers[2]
    periodic = dict(zip(project.PERIODIC_ROLES, two["periodic"], strict=True))
    projection["top_ops"] = {
        name: _top_ops(guarded, baseline)
        for name, guarded, baseline in (
            ("checks", two["checks"][0], two["plain"][0]),
            ("weight check judged", periodic["judged"], periodic["common"]),
            ("audit step", periodic["audit"], periodic["common"]),
            ("first audit step", periodic["first_audit"], periodic["common"]),
            ("sensors, idle step", two["sensors_idle"][0], two["plain"][0]),
            ("sensors_all", two["sensors_all"][0], two["plain"][0]),
        )
    }
    projection["slice"] = {
        "shape": job.slice_shape(),
        "tokens": args.tokens,
        "vocab": args.vocab,
        "world": {"checks, sensors": 1, "weights, audit": WORLD},
        "seconds": seconds,
    }
    projection["recorded"] = {
        layers: {name: [_compact(r) for r in recs] for name, recs in recs_by.items()}
        for layers, recs_by in by_layers.items()
    }
    projection["added_2_layers"] = {
        name: {
            p: {k: v for k, v in d.items() if k != "ops"}
            for p, d in difference(guarded, baseline)["phases"].items()
        }
        for name, guarded, baseline in (
            ("checks", two["checks"][0], two["plain"][0]),
            ("weight check launched", periodic["launched"], periodic["common"]),
            ("weight check judged", periodic["judged"], periodic["common"]),
            ("audit step", periodic["audit"], periodic["common"]),
            ("first weight check launched", periodic["first_launched"], periodic["common"]),
            ("first weight check judged", periodic["first_judged"], periodic["common"]),
            ("first audit step", periodic["first_audit"], periodic["common"]),
            ("sensors, idle step", two["sensors_idle"][0], two["plain"][0]),
            ("sensors_all", two["sensors_all"][0], two["plain"][0]),
        )
    }
    return projection


def _gb(x: float) -> str:
    return f"{x / 1e9:,.2f} GB"


def print_projection(p: dict[str, Any]) -> None:
    """The job's table, as the docs render it."""
    job = p["job"]
    print(f"\n{job['title']}: {job['note']}")
    print(
        f"  {p['parameters'] / 1e9:.2f}B parameters, {p['tokens_per_gpu']:,} tokens per GPU per "
        f"step, plain step {p['plain_step_s']:.2f} s at {project.MFU:.0%} MFU; GPU sensor "
        f"period {p['sensor_period_gpu']} steps"
    )
    print(
        f"  {'configuration':12} {'bytes':>12} {'launches':>9} {'syncs':>6} {'waits':>6} "
        f"{'coll':>5} {'peak':>10} {'H100':>8} {'H200':>8} {'own H100':>9} target"
    )
    for name, row in p["configurations"].items():
        a = row["added"]
        print(
            f"  {name:12} {_gb(a['full_bytes']):>12} {a['launches']:>9,.0f} {a['syncs']:>6.2f} "
            f"{a['waits']:>6.2f} {a['guard_collectives']:>5.2f} {_gb(row['extra_peak_bytes']):>10} "
            f"{row['percent']['H100']:>7.2f}% {row['percent']['H200']:>7.2f}% "
            f"{row['own_percent']['H100']:>8.2f}% <= {row['target_percent']}% "
            f"{'met' if row['meets_target_h100'] else 'MISSED'}"
        )


def main(argv: list[str] | None = None) -> int:
    """Record, project, print, and write the results (``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--jobs",
        default="blog-953m-ddp,llama3-70b-tp8-fsdp,llama3-8b-fsdp",
        help="comma-separated jobs, run in this order (default: all, the cheapest first: "
        "%(default)s)",
    )
    parser.add_argument(
        "--tokens",
        type=int,
        default=24,
        help="the slice's sequence length (no other dimension may have this size)",
    )
    parser.add_argument(
        "--vocab", type=int, default=1000, help="the slice's vocabulary (scaled to the job's)"
    )
    parser.add_argument("--timeout", type=float, default=900, help="seconds per launch")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument(
        "--add-to",
        type=Path,
        action="append",
        help="a results file of an earlier run (repeatable; a later file's job replaces an "
        "earlier's): its jobs not recorded in this run are kept in --json, each with that "
        "run's provenance (runs of one tree, e.g. a job re-recorded)",
    )
    parser.add_argument(
        "--reproject",
        action="store_true",
        help="with --add-to: project the kept jobs' saved recordings again with the current "
        "costmodel.project (their recording's provenance stays theirs); --jobs '' records none",
    )
    args = parser.parse_args(argv)
    if args.reproject and args.add_to is None:
        parser.error("--reproject needs --add-to (the recordings to project again)")
    earlier: dict[str, Any] = {}
    earlier_asked: list[str] = []
    if args.add_to is not None:
        if args.json is None:
            parser.error("--add-to needs --json (where the combined results go)")
        import json

        for path in args.add_to:
            try:
                old = json.loads(path.read_text())
                earlier.update(
                    {
                        name: {**job, "provenance": job.get("provenance", old["provenance"])}
                        for name, job in old["jobs"].items()
                    }
                )
                earlier_asked += [n for n in old["jobs_asked"] if n not in earlier_asked]
            except (OSError, ValueError, KeyError) as error:
                parser.error(f"--add-to {path}: not a step-cost results file ({error})")
        if args.reproject:
            for name, job in earlier.items():
                by_layers = {int(k): v for k, v in job["recorded"].items()}
                again = project.project(
                    by_layers, project.JOBS_BY_NAME[name], job["sensor_period_gpu"]
                )
                job.update(again)
                job["reprojected"] = True
    recorder = Recorder(__file__, argv)
    names = [n.strip() for n in args.jobs.split(",") if n.strip()]
    unknown = [n for n in names if n not in project.JOBS_BY_NAME]
    if unknown:
        parser.error(f"--jobs: unknown {unknown}; known: {sorted(project.JOBS_BY_NAME)}")
    print("A MODEL, not a measurement: no GPU ran. Constants:", project.constants())
    torch.set_num_threads(1)
    projections: dict[str, Any] = {}

    def write(complete: bool) -> None:
        if args.json:
            kept = {n: j for n, j in earlier.items() if n not in projections}
            asked = [*names, *(n for n in earlier_asked if n not in names)]
            recorder.write(
                args.json,
                {
                    "args": {
                        k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
                    },
                    "model_not_measurement": True,
                    "complete": complete and all(n in projections or n in kept for n in asked),
                    "jobs_asked": asked,
                    "constants": project.constants(),
                    "targets_percent_h100": project.TARGETS,
                    "amortised_every": project.AMORTISED,
                    "jobs": {**kept, **projections},
                },
            )

    for name in names:
        projections[name] = run_job(project.JOBS_BY_NAME[name], args)
        print_projection(projections[name])
        # After each job: a run stopped later keeps what it recorded (``complete`` False).
        write(complete=len(projections) == len(names))
    if not names:
        write(complete=True)
    for name, job in earlier.items():
        if name not in projections:
            print_projection(job)
    return 0


if __name__ == "__main__":
    sys.exit(main())
