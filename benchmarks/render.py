"""Render the tables of docs/performance.md (and its pages under docs/performance/,
docs/agent-install.md, docs/recovery.md) from raw results, and the coverage matrix of
docs/usage/coverage.md from the agent's code.

Each rendered table sits between two marker comments in the document:

    <!-- bench:overhead-fsdp -->
    | variant | ... |          <- rewritten from benchmarks/results/overhead-fsdp.json
    _From `python benchmarks/overhead.py ...`, <date>, <machine>, <load>, <versions>._
    <!-- /bench:overhead-fsdp -->

Everything outside the markers (the prose) is left alone. The table names are the keys of
``TABLES``; each reads one or more results files written by ``make bench``
(``benchmarks/bench.py``), but for ``coverage``, which asks ``sdc_agent.coverage.describe``
(``benchmarks/coverage_matrix.py``). A marker indented inside a list item renders its lines at
the same indentation.

    python benchmarks/render.py            # rewrite the documents' tables
    python benchmarks/render.py --check    # exit 1 (and show the difference) if they differ

``tests/unit/test_bench_render.py`` runs the check, so a figure in the docs is always what the
committed results render.
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from results import REPO, RESULTS_DIR, load, model_cell
from results import short_size as _bytes
from results import short_time as _us

DOCS = (
    "docs/performance.md",
    "docs/performance/sensors.md",
    "docs/performance/collectives.md",
    "docs/agent-install.md",
    "docs/recovery.md",
    "docs/usage/coverage.md",
    "docs/usage/screen.md",
)
MARKER = re.compile(
    r"^(?P<indent>[ \t]*)<!-- bench:(?P<name>[\w-]+) -->\n(?P<body>.*?)"
    r"^(?P=indent)<!-- /bench:(?P=name) -->$",
    re.MULTILINE | re.DOTALL,
)


class MissingResults(LookupError):
    """A table needs a results file that is not there (its job never ran)."""


class Results:
    """The results files of one directory, read on first use."""

    def __init__(self, directory: Path = RESULTS_DIR) -> None:
        self.directory = directory
        self._cache: dict[str, dict[str, Any]] = {}

    def __getitem__(self, job: str) -> dict[str, Any]:
        if job not in self._cache:
            path = self.directory / f"{job}.json"
            if not path.exists():
                raise MissingResults(
                    f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path} is missing:"
                    f" run `make bench BENCH={job}`"
                )
            self._cache[job] = load(path)
        return self._cache[job]


# ------------------------------------------------------------------------------- formatting
def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _pct(value: float) -> str:
    return f"{value:+.2f}%"


def _ms(value: float) -> str:
    return f"{value:.1f} ms"


def _relative(fraction: float) -> str:
    """+0.5%, +61%: a decimal only where it is not noise next to the figure."""
    pct = fraction * 100
    return f"{pct:+.1f}%" if abs(pct) < 10 else f"{pct:+.0f}%"


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "-"


def _minutes(stamp: str) -> str:
    return stamp[11:16]  # HH:MM of an ISO UTC stamp


def provenance(document: dict[str, Any], *, timed: bool = True) -> str:
    """One line saying where a table's figures come from and, for timings (``timed``), on what
    machine and under what load."""
    meta = document["provenance"]
    commit = (meta.get("git_commit") or "unknown")[:7]
    modified = meta.get("sources_modified")
    if modified:
        commit += f" with uncommitted changes to {', '.join(modified)}"
    command = f"`{' '.join(meta['command'])}`"
    if not timed:
        return f"_Modelled by {command} ({meta['started_utc'][:10]}, commit {commit})._"
    machine, load_ = meta["machine"], meta["load"]
    day = meta["started_utc"][:10]
    when = f"{day} {_minutes(meta['started_utc'])}-{_minutes(meta['finished_utc'])} UTC"
    cpus = f"{machine['cpu_count']} CPUs ({machine['cpu_model']}), {machine['memory_gib']} GiB"
    load_text = (
        f"load average {load_['before'][0]:.1f} before, {load_['during_mean']:.1f} mean / "
        f"{load_['during_max']:.1f} max during"
    )
    return (
        f"_Measured by {command}, {when}; {cpus}; {load_text}; torch {meta['torch']}, "
        f"commit {commit}._"
    )


def _provenances(results: Results, jobs: list[str], *, timed: bool = True) -> list[str]:
    lines: list[str] = []
    for job in jobs:
        lines += ["", provenance(results[job], timed=timed)]
    return lines


# ----------------------------------------------------------------------------- the tables
def fingerprint_cpu(results: Results) -> list[str]:
    """CPU throughput of the fingerprint against torch.sum over the same bytes."""
    document = results["fingerprint"]
    dtypes = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
    rows = []
    for r in document["results"]:
        if r["device"] != "cpu":
            continue
        n = r["elements"]
        size = f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.{0 if n >= 1e8 else 1}f}M"
        eager = f"{r['eager_int64_gbps']:.2f} GB/s" if r["eager_int64_gbps"] else "-"
        rows.append(
            [
                f"{size} elements, {r['tensors']} tensors",
                dtypes.get(r["dtype"], r["dtype"]),
                str(r["threads"]),
                f"{r['fingerprint_gbps']:.1f} GB/s",
                f"{r['baseline_gbps']:.1f} GB/s",
                f"{r['ratio']:.2f}",
                f"{r['ratio_cpu_time']:.2f}",
                eager,
                {True: "yes", False: "**NO**", None: "-"}[r["agrees_with_eager_int64"]],
            ]
        )
    head = ["list", "dtype", "threads", "fingerprint", "baseline", "ratio", "ratio in CPU time"]
    reps = sorted({r["reps"] for r in document["results"]})
    lines = _table([*head, "old eager int64", "agrees with eager"], rows)
    lines += ["", f"Medians of {'/'.join(map(str, reps))} interleaved repetitions."]
    return lines + _provenances(results, ["fingerprint"])


def overhead(job: str) -> Callable[[Results], list[str]]:
    """The table ``benchmarks/overhead.py`` prints, for the results file ``job``."""

    def render(results: Results) -> list[str]:
        document = results[job]
        config = document["config"]
        rows = []
        for variant, r in document["variants"].items():
            base = variant == r["baseline"]
            rounds = ", ".join(f"{p:+.1f}" for p in r["overhead_pct_per_round"])
            cpu = f"{r['cpu_overhead_pct_min']:+.1f}..{r['cpu_overhead_pct_max']:+.1f}"
            rows.append(
                [
                    variant,
                    "-" if base else r["baseline"],
                    _ms(r["step_ms"]),
                    _ms(r["median_step_ms"]),
                    "-" if base else f"{_pct(r['overhead_pct'])} ({rounds})",
                    _ms(r["cpu_step_ms"]),
                    "-" if base else f"{_pct(r['cpu_overhead_pct'])} ({cpu})",
                ]
            )
        head = ["variant", "baseline", "mean step", "median step", "overhead wall (per round)"]
        lines = _table([*head, "CPU per step", "overhead CPU (min..max)"], rows)
        world = config["nodes"] * config["ranks_per_node"]
        lines += [
            "",
            f"{world} processes ({config['nodes']} nodes x {config['ranks_per_node']}), "
            f"{config['rounds']} rounds of {config['steps']} steps, MLP width {config['width']} "
            f"x {config['depth']}, batch {config['batch']}; "
            f"{document['params'] / 1e6:.1f}M parameters (the MLP's).",
        ]
        if any(variant.endswith("tp") for variant in document["variants"]):
            lines[-1] += " `plain_tp` and `tp` run the drill's TP model at that width instead."
        if any(variant.endswith("pp") for variant in document["variants"]):
            lines[-1] += " `plain_pp` and `pp` cut the MLP in pipeline stages."
        targets = document.get("targets_pct", {})
        verdicts = [
            f"{variant} <= {target:g}%: wall {_pct(r['overhead_pct'])} "
            f"{'met' if r['overhead_pct'] <= target else 'missed'}, CPU "
            f"{_pct(r['cpu_overhead_pct'])} {'met' if r['cpu_overhead_pct'] <= target else 'missed'}"
            for variant, target in targets.items()
            if (r := document["variants"].get(variant))
        ]
        if verdicts:
            lines[-1] += " Targets: " + "; ".join(verdicts) + "."
        return lines + _provenances(results, [job])

    return render


STEP_WORK_ROWS = (
    ("aten operators, every thread", "aten_ops"),
    ("aten operators, training thread", "aten_ops_main"),
    ("tensors allocated", "allocations"),
    ("bytes allocated", "allocated_bytes"),
    ("Python calls", "python_calls"),
    ("of them in `sdc_agent`", "agent_calls"),
    ("builtin calls", "c_calls"),
    ("host reads", "host_reads"),
    ("waits", "waits"),
    ("collectives", "collectives"),
    ("collective payload (bytes)", "collective_bytes"),
)


def step_work(results: Results) -> list[str]:
    """The always-on step's work counted, this tree only (guarded, plain and the difference)."""
    [summary] = results["step-work"]["summaries"][-1:]
    rows = [
        [
            label,
            f"{summary['plain'][key]:,}",
            f"{summary['guarded'][key]:,}",
            f"{summary['extra'][key]:+,}",
        ]
        for label, key in STEP_WORK_ROWS
    ]
    lines = _table(["per step, rank 0 of 2", "plain DDP", "guarded (check 1)", "extra"], rows)
    issued = "; ".join(
        f"{c['op']}{' ' + c['reduce'] if c['reduce'] else ''} of {c['bytes']:,} B"
        for c in summary["collectives"]
    )
    unsteady = {k: v for k, v in summary["unsteady"].items() if v}
    lines += ["", f"Collectives of the guarded step: {issued}."]
    if unsteady:
        lines[-1] += f" Counts that differed between counted steps: {unsteady}."
    return lines + _provenances(results, ["step-work"])


FINITE_CHECK_JOBS = (
    ("float32, 1 thread", "finite-check-fp32"),
    ("bf16, 1 thread", "finite-check-bf16"),
    ("float32, 2 threads", "finite-check-2threads"),
)
FINITE_CHECK_LABELS = {
    "isfinite_all": "`isfinite_all`: `~isfinite(g).all()` per parameter (before)",
    "fused_per_param": "`fused_per_param`: the fused kernel per parameter, one flag (**now**)",
    "fused_batched": "`fused_batched`: the fused kernel once over all parameters",
    "aminmax": "`aminmax` per parameter, one `isfinite` of the extremes per step",
    "foreach_inf_norm": "`foreach_inf_norm`: `_foreach_norm(grads, inf)`, one `isfinite`",
    "sum_float64": "`sum_float64`: float64 sum per parameter",
}


def finite_check(results: Results) -> list[str]:
    """Check 1's local finiteness test: each candidate's ms per step, three settings."""
    columns = [(label, results[job]["ms_per_step"]) for label, job in FINITE_CHECK_JOBS]
    rows = [
        [FINITE_CHECK_LABELS.get(name, f"`{name}`")]
        + [f"{col[name]:.2f}" if col.get(name) is not None else "UNSOUND" for _, col in columns]
        for name in columns[0][1]
    ]
    lines = _table(["candidate (ms per step)", *(label for label, _ in columns)], rows)
    return lines + _provenances(results, [job for _, job in FINITE_CHECK_JOBS])


ATTENTION_SETTINGS = (
    ("protected, fused, idle", "fused, idle"),
    ("protected, fused, every sensor", "fused, every sensor"),
    ("protected, checked, idle", "checked, idle"),
    ("protected, checked, every sensor", "checked, every sensor"),
)


def attention_cost(results: Results) -> list[str]:
    """The protected Llama's step against the plain one, CPU time, by sequence length."""
    document = results["attention-cost"]
    rows = []
    for tokens, best in document["tokens"].items():
        plain = best["plain"]
        rows.append(
            [tokens, f"{plain * 1e3:.1f} ms"]
            + [_relative(best[key] / plain - 1) for _, key in ATTENTION_SETTINGS]
        )
    lines = _table(["tokens", "plain (fused)", *(label for label, _ in ATTENTION_SETTINGS)], rows)
    return lines + _provenances(results, ["attention-cost"])


def sensor_calibration(results: Results) -> list[str]:
    """Per sensor family: what its check moves by the recorder against what the plan registers,
    and the coefficient the plan prices it with (sensors/runtime/plan.py's CALIBRATION)."""
    document = results["sensor-calibration"]
    rows = [
        [
            c["family"],
            c["op"],
            f"{c['registered_elements'] / 1e6:.2f}M",
            f"{c['moved_elements'] / 1e6:.2f}M",
            f"{c['ratio']:.2f}",
            f"{c['coefficient']:.2f}",
            f"{c['launches']}",
        ]
        for c in document["checks"]
    ]
    head = [
        "family",
        "check",
        "registered (fp32 elements)",
        "moved (recorder)",
        "moved / registered",
        "plan's coefficient",
        "launches added",
    ]
    counted = provenance(document, timed=False).replace("_Modelled by", "_Counted by", 1)
    return [*_table(head, rows), "", counted]


PARALLEL_PREFIX = re.compile(r"^(pp|tp|cp|ep)_")


def collectives_model(prefix: str | None) -> Callable[[Results], list[str]]:
    """NCCL's modelled time per collective and rank count; ``prefix`` picks a dimension's rows
    (``pp``), None the data-parallel ones."""

    def render(results: Results) -> list[str]:
        model = results["collectives-model"]["model"]
        chosen = [
            r
            for r in model["rows"]
            if (PARALLEL_PREFIX.match(r["name"]) or [None, None])[1] == prefix
        ]
        ranks = [k for k in chosen[0] if k.isdigit()]
        rows = []
        for row in chosen:
            cells = [model_cell(row[n]) for n in ranks]
            rows.append([row["name"], row["when"], f"{row['op']} {row['payload']}", *cells])
        head = ["collective", "when", "payload", *(f"{int(n):,} ranks" for n in ranks)]
        return _table(head, rows) + _provenances(results, ["collectives-model"], timed=False)

    return render


def collectives_weights(results: Results) -> list[str]:
    """The weight check's all-reduce against the number of tensors, modelled."""
    rows = [
        [
            f"{r['tensors']:,}",
            _bytes(r["bytes"]),
            r["best"],
            _us(r["latency_us"]),
            _us(r["bandwidth_us"]),
        ]
        for r in results["collectives-model"]["model"]["weights_max_by_tensors"]
    ]
    head = ["T tensors", "payload", "NCCL's pick", "latency", "bandwidth term"]
    return _table(head, rows) + _provenances(results, ["collectives-model"], timed=False)


def collectives_gloo(results: Results) -> list[str]:
    """Median (p90) ms of each collective on gloo, per process count."""
    document = results["collectives-gloo"]
    gloo = document["gloo"]
    sizes = list(gloo["sizes"])
    described = {r["name"]: r for r in document["model"]["rows"]}
    names = list(gloo["sizes"][sizes[0]]["collectives"])
    rows = []
    for name in names:
        row = described.get(name, {"when": "-", "op": "", "payload": ""})
        cells = [
            "{median_ms:.2f} ({p90_ms:.2f})".format(**gloo["sizes"][s]["collectives"][name])
            for s in sizes
        ]
        rows.append([name, row["when"], f"{row['op']} {row['payload']}".strip(), *cells])
    lines = _table(["collective", "when", "payload", *(f"{s} proc." for s in sizes)], rows)
    loads = ", ".join(
        f"{s} proc. {v['loadavg_before'][0]:.1f} ({v['seconds']:.0f} s)"
        for s, v in gloo["sizes"].items()
    )
    lines += [
        "",
        f"{gloo['config']['reps']} repetitions after {gloo['config']['warmup']} of warm-up "
        f"({gloo['config']['bucket_reps']} for ddp_bucket), each timed as its slowest rank, on "
        f"{gloo['cpus']} CPUs; load average before each size: {loads}.",
    ]
    return lines + _provenances(results, ["collectives-gloo"])


RATIO_FAMILIES_DTYPES = ("fp32", "bf16")


def sensor_ratios(results: Results) -> list[str]:
    """Healthy ratios per op family, and how often a x1.1 fault reads above the thresholds."""
    document = results["sensor-ratios"]
    families: dict[str, list[dict[str, Any]]] = {}
    for cell in document["cells"]:
        families.setdefault(cell["family"], []).append(cell)
    dtypes = sorted({c["dtype"] for c in document["cells"]}, key=lambda d: (d != "fp32", d))

    def caught(cells: list[dict[str, Any]]) -> str:
        faulted = [c for c in cells if "fault_over_initial" in c]
        trials = sum(c["trials"] for c in faulted)
        if not trials:
            return "-"
        initial = sum(c["fault_over_initial"] for c in faulted)
        floor = sum(c["fault_over_floor"] for c in faulted)
        return f"{_share(initial, trials)} / {_share(floor, trials)}"

    rows = []
    for family, cells in sorted(families.items()):
        medians = sorted(c["median"] for c in cells)
        rows.append(
            [family, str(len(cells)), f"{max(c['max'] for c in cells):.2f}"]
            + [f"{medians[len(medians) // 2]:.2f}"]
            + [caught([c for c in cells if c["dtype"] == d]) for d in dtypes]
        )
    head = ["family", "cells", "healthy max", "median of cells"]
    head += [f"x{document['args']['fault']:g} caught above 12 / above 3, {d}" for d in dtypes]
    lines = _table(head, rows)
    lines += ["", f"{document['args']['trials']} trials a cell."]
    return lines + _provenances(results, ["sensor-ratios"])


def campaign(results: Results) -> list[str]:
    """The single-fault campaign: per op family, effective and named faults, per dtype."""
    document = results["campaign"]
    dtypes = [d for d in ("fp32", "bf16") if d in document]
    tables = {d: document[d]["table"] for d in dtypes}
    rows = []
    for family in tables[dtypes[0]]:
        per = [tables[d][family] for d in dtypes]
        shares = [
            f"{_share(r['named'], r['effective'])} ({r['named']} / {r['effective']})" for r in per
        ]
        defaults = {
            f"{r['share_default']:.1%}" if r["share_default"] is not None else "-" for r in per
        }
        label = f"**{family}**" if family == "all" else family
        rows.append(
            [
                label,
                str(per[0]["trials"]),
                " / ".join(str(r["effective"]) for r in per),
                " / ".join(shares),
                str(sum(r["wrong"] for r in per)),
                " / ".join(sorted(defaults)),
            ]
        )
    slash = " / ".join(dtypes)
    head = ["op family", "trials", f"effective ({slash})", f"named, full coverage ({slash})"]
    periods = ", ".join(f"{d} {document[d]['period']}" for d in dtypes)
    lines = _table([*head, "wrong names", "at the default budget (1%)"], rows)
    lines += [
        "",
        f"Default budget's burst period (steps): {periods}; {document['seconds']:.0f} s "
        f"for the whole campaign.",
    ]
    return lines + _provenances(results, ["campaign"])


CAMPAIGN_VARIANTS = (
    ("unguarded", "unguarded"),
    ("checks 1-3 only", "checks"),
    ("default budget (1%)", "default"),
    ("full coverage", "full"),
)


def campaign_overhead(results: Results) -> list[str]:
    """The sensors' CPU time per step on the campaign's Llama, per dtype (rank 0)."""
    document = results["campaign"]
    dtypes = [d for d in ("fp32", "bf16") if f"overhead_{d}" in document]
    timings = {d: document[f"overhead_{d}"]["timing"] for d in dtypes}
    rows = []
    for label, key in CAMPAIGN_VARIANTS:
        row = [label]
        for d in dtypes:
            t, base = timings[d].get(key), timings[d]["unguarded"]
            if t is None:
                row += ["-", "-"]
                continue
            cpu = t["cpu"] / t["steps"] * 1e3
            over = "-" if key == "unguarded" else f"{(t['cpu'] / base['cpu'] - 1) * 100:+.0f}%"
            row += [f"{cpu:.1f}", over]
        rows.append(row)
    head = ["variant"]
    for d in dtypes:
        head += [f"{d} CPU ms/step", "over unguarded"]
    return _table(head, rows) + _provenances(results, ["campaign"])


SOAK_JOBS = (
    "sensor-soak-llama-fp32",
    "sensor-soak-llama-bf16",
    "sensor-soak-drill-fp32",
    "sensor-soak-drill-bf16",
)


def sensor_soak(results: Results) -> list[str]:
    """Fault-free soaks with every sensor every step: candidates, alarms, thresholds."""
    rows, ran, missing = [], [], []
    for job in SOAK_JOBS:
        try:
            s = results[job]
        except MissingResults:
            missing.append(job)
            continue
        ran.append(job)
        families = s["families"]
        top_name, top = max(families.items(), key=lambda kv: kv[1]["max_healthy_ratio"])
        bounds = [t for f in families.values() if f["thresholds"] for t in f["thresholds"]]
        sets = "one set" if s["same_thresholds_on_every_rank"] else "per rank"
        model = "Llama" if s["model"] == "llama" else "drill model"
        label = f"{model} {s['dtype']}"
        if s.get("attention") == "checked":
            label += ", checked attention"
        rows.append(
            [
                label,
                f"{s['steps']:,}",
                str(sum(f["sensors"] for f in families.values())),
                str(s["candidates"]),
                str(s["unconfirmed"]),
                str(s["alarms"]) if not s["alarms"] else f"**{s['alarms']}**",
                f"{sets}, {min(bounds):.1f}-{max(bounds):.1f}" if bounds else sets,
                f"{top['max_healthy_ratio']:.2f} ({top_name})",
                f"{s['wall_s']:.0f} s",
            ]
        )
    head = ["run", "steps", "sensors", "candidates", "unconfirmed (`reproducible`)", "alarms"]
    head.append("thresholds")
    if not ran:
        raise MissingResults(f"no sensor soak has results: run `make bench BENCH={SOAK_JOBS[0]}`")
    lines = _table([*head, "largest healthy ratio (family)", "wall"], rows)
    if missing:
        lines += ["", f"Not run yet by `make bench`: {', '.join(missing)}."]
    return lines + _provenances(results, ran)


THREE_D_JOBS = ("three-d-clean", "three-d-faults")

THREE_D_FAULTS = {
    "ScaleOutputElement": "x{factor:g} in rank {rank}'s `{layer}` output from step {step}",
    "ScaleWeightGradElement": "x{factor:g} in one element of rank {rank}'s local `{param}` "
    "gradient slice from step {step}",
    "FlipWeightBit": "bit {bit} flipped in rank {rank}'s stored `{param}` slice at step {step}",
}
"""How each fault injector that ``benchmarks/three_d.py`` records reads in the table."""


def _three_d_scenario(record: dict[str, Any]) -> str:
    if not record["faults"]:
        return record["scenario"] + (", bf16 autocast" if record["bf16"] else "")
    return "; ".join(
        THREE_D_FAULTS[fault["kind"]].format(**fault)
        if fault["kind"] in THREE_D_FAULTS
        else f"{fault['kind']} {fault}"
        for fault in record["faults"]
    )


def three_d(results: Results) -> list[str]:
    """TP x PP x HSDP on 12 processes: each scenario, what the guard found, what was expected."""
    rows = []
    for job in THREE_D_JOBS:
        document = results[job]
        for r in document["scenarios"]:
            what = _three_d_scenario(r)
            every = r["every"]
            cadence = f"every {every}" if every > 1 else "every step"
            alarm = r["alarm"]
            if alarm is None:
                found = (
                    f"no alarm, {r['updates_applied']} updates applied, last audit and weight "
                    f"check passed at steps {r['last_audit_pass']}, {r['last_weight_check_pass']}"
                )
            else:
                found = (
                    f"`{alarm['check']}` alarm at step {alarm['step']}, suspects "
                    f"{alarm['suspects']}"
                )
            outcome = "as expected" if r["ok"] else "**NOT as expected**"
            rows.append(
                [
                    what,
                    str(r["steps"]),
                    cadence,
                    found,
                    f"{r['expected']} ({outcome})",
                    f"{r['wall_s']:.1f} s",
                ]
            )
    head = ["scenario", "steps", "audits, weight checks", "what the guard found", "expected"]
    return _table([*head, "wall"], rows) + _provenances(results, list(THREE_D_JOBS))


def mistakes(results: Results) -> list[str]:
    """The held-out user mistakes: what each is, what the guard said, whom it named."""
    document = results["mistakes-held-out"]
    rows = []
    for r in document["rows"]:
        if "refused" in r:
            said = f"refused at construction ({r['refused'][:120].rstrip()}...)"
            job = "not started"
        else:
            said = ", ".join(f"`{f}`" for f in r["findings"]) or "none"
            said += "; audits " + ("on" if r["audit_on"] else "off")
            job = "stopped (on_setup_error)" if r["stopped"] else f"{r['updates']} steps applied"
        named = "nobody" if not r["named"] else f"**ranks {r['named']} NAMED**"
        rows.append([f"`{r['mistake']}`", r["what"], said, job, named])
    passed = sum(1 for r in document["rows"] if r["ok"])
    summary = f"**{passed} of {len(document['rows'])}** named nobody and left the job running."
    head = ["mistake", "what it is", "what the guard said", "the job", "named"]
    return [*_table(head, rows), "", summary, *_provenances(results, ["mistakes-held-out"])]


SCREEN_OUTCOMES = ("reproduced", "suspect", "missed", "WRONG")


def screen_campaign(results: Results) -> list[str]:
    """The node screen's campaign: per fault kind, what the screens said of the faulty device;
    the fault-free screens; the screen's time."""
    document = results["screen-campaign"]
    rows = []
    for cell in document["cells"]:
        rate = "every call" if cell["rate"] == 1 else f"{cell['rate']:.0%} of calls"
        counts = [
            str(cell[o]) if o != "WRONG" or not cell[o] else f"**{cell[o]}**"
            for o in SCREEN_OUTCOMES
        ]
        rows.append([f"`{cell['target']}-{cell['effect']}`", rate, *counts])
    cells = document["cells"]
    trials = sum(cell[o] for cell in cells for o in SCREEN_OUTCOMES)
    every = [cell for cell in cells if cell["rate"] == 1]
    every_trials = sum(cell[o] for cell in every for o in SCREEN_OUTCOMES)
    summary = (
        f"**{sum(c['reproduced'] for c in cells)} of {trials}** faulty screens reproduced the "
        f"faulty device ({sum(c['reproduced'] for c in every)} of {every_trials} for the faults "
        f"on every call), {sum(c['suspect'] for c in cells)} named it suspect, "
        f"{sum(c['missed'] for c in cells)} missed it, {sum(c['WRONG'] for c in cells)} named "
        f"another device. Fault-free: {document['clean'].get('clean', 0)} of "
        f"{document['clean_runs']} screens `clean`; "
        f"the same digests on every device and in both runs of a seed: "
        f"{'yes' if document['same_digests'] else '**no**'}. Each screen ({document['devices']} "
        f"simulated devices, the default 16 repetitions) took {document['screen_s']['median']:.2f} s "
        f"median, {document['screen_s']['max']:.2f} s at most, over "
        f"{document['screen_s']['screens']} screens."
    )
    head = ["fault", "fires on", *SCREEN_OUTCOMES]
    return [*_table(head, rows), "", summary, *_provenances(results, ["screen-campaign"])]


def publish(results: Results) -> list[str]:
    """The publisher benchmark: step times with each endpoint."""
    document = results["publish"]
    rows = [
        [
            kind,
            f"{c['median_ms']:.3f}",
            f"{c['p99_ms']:.3f}",
            f"{c['slowest_publish_ms']:.1f}",
            f"{c['flush_s']:.2f}",
            "yes" if c["delivered"] else "no",
        ]
        for kind, c in document["cases"].items()
    ]
    head = ["endpoint", "median step ms", "p99 step ms", "slowest publish ms", "exit flush s"]
    lines = _table([*head, "delivered"], rows)
    lines += ["", f"{document['args']['steps']} steps per endpoint."]
    return lines + _provenances(results, ["publish"])


STEP_COST_CONFIGURATIONS = {
    "checks": "check 1 + flags (always on)",
    "weights": "+ weight checks every 10",
    "audit": "+ deterministic audits every 100",
    "sensors": "+ sensors, default budget",
    "sensors_all": "+ every sensor every step",
}


STEP_COST_JOBS = ("llama3-8b-fsdp", "llama3-70b-tp8-fsdp", "blog-953m-ddp")
"""The table's order: (a), (b), the 953M job."""


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:,.2f} GB" if abs(nbytes) >= 1e7 else _bytes(nbytes)


def step_cost(results: Results) -> list[str]:
    """The GPU cost model's projection: per job x configuration, what the guard adds per step
    and its share of an H100's and an H200's step, against issue 31's targets."""
    document = results["step-cost"]
    head = [
        "job",
        "configuration",
        "bytes moved",
        "launches",
        "host syncs",
        "collectives",
        "extra peak memory",
        "H100",
        "H200",
        "own share, H100",
        "target",
    ]
    rows = []
    notes = []
    order = {name: i for i, name in enumerate(STEP_COST_JOBS)}
    jobs = sorted(document["jobs"].items(), key=lambda item: order.get(item[0], len(order)))
    for _, job in jobs:
        title = job["job"]["title"]
        for configuration, label in STEP_COST_CONFIGURATIONS.items():
            row = job["configurations"][configuration]
            added = row["added"]
            own = row["own_percent"]["H100"]
            base = row["target_is_share_over"]
            target = f"<= {row['target_percent']:g}%" + (" over check 1" if base else "")
            verdict = "met" if row["meets_target_h100"] else "**MISSED**"
            collectives = f"{added['guard_collectives']:.2f}"
            if added["guard_collective_bytes"]:
                collectives += f" ({_gb(added['guard_collective_bytes'])})"
            rows.append(
                [
                    title if configuration == "checks" else "",
                    label,
                    _gb(added["full_bytes"]),
                    f"{added['launches']:,.0f}",
                    f"{added['syncs']:.2f}",
                    collectives,
                    _gb(row["extra_peak_bytes"]),
                    f"{row['percent']['H100']:+.2f}%",
                    f"{row['percent']['H200']:+.2f}%",
                    f"{own:+.2f}%",
                    f"{target}: {verdict}",
                ]
            )
        common = job["recorded"]["2"]["checks"][0]["phases"]
        syncs = [
            f"`{x['where']}` {x['what']}"
            for phase in ("micro", "step")
            for x in common[phase]["sync_list"]
            if x["guard"] and "/" in x["where"]  # in the agent's code (not a model's file)
        ]
        waits = [f"`{w['where']}`" for p in common.values() for w in p["waits"] if w["guard"]]
        notes.append(
            f"{title}, the common step's host syncs (recorded): {'; '.join(syncs) or 'none'}; "
            f"blocking waits: {', '.join(waits) or 'none'}."
        )
        plain = job["plain_step_s"]
        notes.append(
            f"{title}: {job['job']['note']}; {job['parameters'] / 1e9:.2f}B parameters, "
            f"{job['tokens_per_gpu']:,} tokens per GPU per step, plain step {plain:.2f} s "
            f"(H100 and H200: the same bf16 rate) at {document['constants']['mfu_of_the_plain_step']:.0%} "
            f"MFU; sensor period on a GPU {job['sensor_period_gpu']} steps; slice "
            f"{job['slice']['shape']}, {job['slice']['tokens']} tokens, vocabulary "
            f"{job['slice']['vocab']}, {job['slice']['world']} gloo processes."
        )
    lines = _table(head, rows)
    c = document["constants"]
    gpus = "; ".join(
        f"{g['name']} {g['hbm_tb_s']} TB/s HBM, {g['bf16_tflops']:g} TF/s bf16, "
        f"{g['fp32_tflops']:g} TF/s fp32, NVLink {g['nvlink_gb_s']:g} GB/s, EFA "
        f"{g['efa_gb_s_per_node']:g} GB/s per node"
        for g in c["gpus"]
    )
    lines += [
        "",
        "A MODEL, not a measurement: no GPU ran. Per step (micro-batches and layers included;"
        " weight checks and audits amortised over their period, the default budget's sensor"
        " step over the GPU plan's period). Constants: "
        f"{gpus}; memory-bound operators at {c['memory_efficiency']:.0%} of HBM, GEMMs at "
        f"{c['gemm_efficiency']:.0%} of the dense rate, at least {c['launch_s'] * 1e6:g} us per "
        f"kernel, {c['sync_s'] * 1e6:g} us per host sync, {c['straggler_s'] * 1e6:g} us per "
        f"blocking wait on a collective of the same step; collectives at {c['collectives']}.",
    ]
    for note in notes:
        lines += ["", note]
    missing = [j for j in document["jobs_asked"] if j not in document["jobs"]]
    if missing:
        lines += [
            "",
            f"**Not recorded in this run** (stopped before them): {', '.join(missing)}; "
            "`make bench BENCH=step-cost` records them.",
        ]
    lines += _provenances(results, ["step-cost"], timed=False)
    for _, job in jobs:
        # A job kept from an earlier run (step_cost.py --add-to) says where it came from.
        if "provenance" in job and job["provenance"] != document["provenance"]:
            lines += ["", f"{job['job']['title']}: " + provenance(job, timed=False)]
    return lines


def bench_runs(results: Results) -> list[str]:
    """Every job of ``make bench``: its command, when it last ran, how long it took, the load."""
    from bench import JOBS  # the runner's job list (bench.py imports nothing of this module)

    rows, total = [], 0.0
    for job in JOBS:
        command = f"`python {' '.join(job.command('')[1:-2])}`"
        try:
            meta = results[job.name]["provenance"]
        except MissingResults:
            rows.append([job.name, command, "not run", "-", "-"])
            continue
        parse = datetime.datetime.fromisoformat
        took = meta.get("runner_wall_s")
        mark = ""
        if took is None:  # run outside bench.py: the script's own clock, imports excluded
            took = (parse(meta["finished_utc"]) - parse(meta["started_utc"])).total_seconds()
            mark = "*"
        load_ = meta["load"]
        # Jobs kept from earlier runs (step_cost.py --add-to): those runs' time and load too.
        earlier = {
            json.dumps(j["provenance"], sort_keys=True): j["provenance"]
            for j in results[job.name].get("jobs", {}).values()
            if isinstance(j, dict) and "provenance" in j and j["provenance"] != meta
        }
        if earlier:
            runs = list(earlier.values())
            took += sum(
                (parse(m["finished_utc"]) - parse(m["started_utc"])).total_seconds() for m in runs
            )
            mark = "*"
            load_ = {
                "during_mean": max(m["load"]["during_mean"] for m in runs),
                "during_max": max(m["load"]["during_max"] for m in runs),
            }
        total += took
        rows.append(
            [
                job.name,
                command,
                meta["started_utc"][:10],
                f"{took / 60:.1f} min{mark}",
                f"{load_['during_mean']:.1f} / {load_['during_max']:.1f}",
            ]
        )
    lines = _table(["job", "command", "last run", "took", "load mean / max"], rows)
    lines += ["", f"Sum of the recorded runs: {total / 60:.0f} min."]
    if any(row[3].endswith("*") for row in rows):
        lines[-1] += " \\* the script's own clock (start-up and imports excluded)."
    return lines


def coverage(results: Results) -> list[str]:
    """The coverage matrix: what ``Guard.coverage()`` says per layout (no results read)."""
    import coverage_matrix  # imports torch: only when a document holds the matrix

    return coverage_matrix.render()


TABLES: dict[str, Callable[[Results], list[str]]] = {
    "bench-runs": bench_runs,
    "fingerprint-cpu": fingerprint_cpu,
    "overhead-ddp": overhead("overhead-ddp"),
    "overhead-2nodes": overhead("overhead-2nodes"),
    "overhead-sensors": overhead("overhead-sensors"),
    "overhead-fsdp": overhead("overhead-fsdp"),
    "overhead-tp": overhead("overhead-tp"),
    "overhead-pp": overhead("overhead-pp"),
    "step-work": step_work,
    "finite-check": finite_check,
    "attention-cost": attention_cost,
    "collectives-model": collectives_model(None),
    "collectives-tp-model": collectives_model("tp"),
    "collectives-pp-model": collectives_model("pp"),
    "collectives-weights": collectives_weights,
    "collectives-gloo": collectives_gloo,
    "sensor-ratios": sensor_ratios,
    "campaign": campaign,
    "campaign-overhead": campaign_overhead,
    "sensor-soak": sensor_soak,
    "three-d": three_d,
    "mistakes": mistakes,
    "screen-campaign": screen_campaign,
    "publish": publish,
    "step-cost": step_cost,
    "sensor-calibration": sensor_calibration,
    "coverage": coverage,
}
"""Every table a document can hold, by marker name."""


def render_text(text: str, results: Results, where: str = "document") -> str:
    """``text`` with the body of every marked table replaced by its rendering."""

    def replace(match: re.Match[str]) -> str:
        name, indent = match["name"], match["indent"]
        if name not in TABLES:
            raise ValueError(f"{where}: unknown table marker {name!r}; known: {sorted(TABLES)}")
        body = "".join(f"{indent}{line}".rstrip() + "\n" for line in TABLES[name](results))
        return f"{indent}<!-- bench:{name} -->\n{body}{indent}<!-- /bench:{name} -->"

    # A marker is a line of its own (a marker quoted in prose, in backticks, is not one).
    opened = re.findall(r"^[ \t]*<!-- bench:([\w-]+) -->$", text, re.MULTILINE)
    closed = re.findall(r"^[ \t]*<!-- /bench:([\w-]+) -->$", text, re.MULTILINE)
    rendered, count = MARKER.subn(replace, text)
    if count != len(opened) or opened != closed:
        raise ValueError(f"{where}: unbalanced bench markers (opened {opened}, closed {closed})")
    return rendered


def main(argv: list[str] | None = None) -> int:
    """Rewrite the documents' tables, or with --check report whether they are up to date."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 on a diff")
    parser.add_argument("--results", type=Path, default=RESULTS_DIR, help="results directory")
    parser.add_argument(
        "docs", nargs="*", default=list(DOCS), help="documents (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    results = Results(args.results)
    stale = []
    for doc in args.docs:
        path = REPO / doc
        text = path.read_text()
        try:
            rendered = render_text(text, results, doc)
        except (MissingResults, ValueError, KeyError) as exc:
            print(f"{doc}: {exc}", file=sys.stderr)
            return 2
        if rendered == text:
            continue
        if args.check:
            stale.append(doc)
            diff = difflib.unified_diff(
                text.splitlines(), rendered.splitlines(), doc, f"{doc} (rendered)", lineterm=""
            )
            print("\n".join(diff))
        else:
            path.write_text(rendered)
            print(f"rendered {doc}")
    if stale:
        print(
            f"out of date with benchmarks/results/: {', '.join(stale)}; "
            "run `python benchmarks/render.py`",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
