"""The coverage matrix of docs/usage/coverage.md, generated from the agent's own code.

``Guard.coverage()`` computes what the guard checks for one job with
:func:`sdc_agent.coverage.describe`, from the schedule and the parallelism adapter's layout facts
(``coverage_facts()``). This module asks the same function about one example job per layout
(3 nodes; the layouts the drills run) and writes its answers as tables, so the docs show what
the code says rather than a retyped copy. ``benchmarks/render.py`` places them between the
``<!-- bench:coverage -->`` markers and ``tests/unit/test_bench_render.py`` fails when the
document differs from what this renders now.

The layout facts come from the functions the adapters' ``coverage_facts()`` return
(``sharded_coverage_facts``, ``tp_coverage_facts``, ``pipeline_coverage_facts``), asked of the
example mesh's :class:`~sdc_agent.parallel.mesh.ShardedLayout` (no process group), so a change
to an adapter's wording shows here too.

    python benchmarks/coverage_matrix.py      # print the tables
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sdc_agent.coverage import LayoutFacts, ddp_facts, describe
from sdc_agent.parallel.fsdp import sharded_coverage_facts
from sdc_agent.parallel.mesh import REPLICATE, SHARD, TP, ShardedLayout
from sdc_agent.parallel.pp import pipeline_coverage_facts
from sdc_agent.parallel.tp import tp_coverage_facts
from sdc_agent.schedule import Schedule

EVERY = 10
"""The example jobs' ``audit_every`` and ``check_every``."""


def _layout(
    kind: str, roles: tuple[str, ...], sizes: tuple[int, ...], ranks: list[list[int]]
) -> ShardedLayout:
    """The layout of rank 0 on a mesh whose ``ranks`` are [replica][position in the replica]."""
    replicas = sizes[0] if roles[0] == REPLICATE else 1
    tp = sizes[-1] if roles[-1] == TP else 1
    flat = [r for replica in ranks for r in replica]
    return ShardedLayout(
        kind=kind,
        replicas=replicas,
        shards=len(ranks[0]),
        replica_index=0,
        shard_index=0,
        replicas_of_shard=tuple(
            tuple(replica[s] for replica in ranks) for s in range(len(ranks[0]))
        ),
        roles=roles,
        sizes=sizes,
        tp=tp,
        tp_groups=tuple(tuple(flat[i : i + tp]) for i in range(0, len(flat), tp)) if tp > 1 else (),
    )


@dataclass(frozen=True)
class Job:
    """One example job: its layout facts and what ``describe`` needs besides."""

    name: str
    mesh: str
    world: int
    peer_offset: int
    facts: LayoutFacts
    columns: list[list[int]] | None = None
    pipeline: dict[str, Any] | None = None
    grad_accum: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    def coverage(self, *, scaler: Any | None = None, grad_accum: int | None = None) -> dict:
        schedule = Schedule(
            audit_every=EVERY,
            check_every=EVERY,
            peer_offset=self.peer_offset,
            grad_accum=grad_accum or self.grad_accum,
        )
        return describe(
            schedule,
            global_ranks=list(range(self.world)),
            can_confirm=True,
            scaler=scaler,
            param_dtypes=["float32"],
            layout=self.facts,
            replica_columns=self.columns,
            pipeline=self.pipeline,
        )


def _pipeline(stages: int, columns: list[list[int]], tp_groups: list[list[int]]) -> dict:
    """The pipeline's shape as ``PipelineAdapter.pipeline_facts()`` gives it."""
    facts: dict[str, Any] = {
        "stages": stages,
        "schedule": "ScheduleGPipe",
        "micro_batches": 4,
        "replicas": len(columns[0]),
        "stage_ranks": columns,
    }
    if tp_groups:
        facts["tp_groups"] = tp_groups
    return facts


def jobs() -> list[Job]:
    """The example jobs, one per layout: 3 nodes of 2 ranks (4 for TP x PP x HSDP)."""
    six = list(range(6))
    fsdp = _layout("fsdp", (SHARD,), (6,), [six])
    hsdp = _layout("hsdp", (REPLICATE, SHARD), (3, 2), [[0, 1], [2, 3], [4, 5]])
    fsdp_tp = _layout("fsdp+tp", (SHARD, TP), (3, 2), [six])
    hsdp_tp = _layout("hsdp+tp", (REPLICATE, SHARD, TP), (3, 1, 2), [[0, 1], [2, 3], [4, 5]])
    # Pipelines of 2 stages, one per node (stage = rank % 2); a stage sharded over the replicas.
    stage_fsdp = _layout("fsdp", (SHARD,), (3,), [[0, 2, 4]])
    stage_hsdp = _layout("hsdp", (REPLICATE, SHARD), (3, 1), [[0], [2], [4]])
    pp_columns = [[0, 2, 4], [1, 3, 5]]
    # TP x PP x HSDP on 12 ranks, 4 a node: rank = 4 * replica + 2 * stage + tp.
    stage_hsdp_tp = _layout("hsdp+tp", (REPLICATE, SHARD, TP), (3, 1, 2), [[0, 1], [4, 5], [8, 9]])
    three_d_columns = [[0, 1, 4, 5, 8, 9], [2, 3, 6, 7, 10, 11]]
    return [
        Job("DDP", "6 replicas", 6, 2, ddp_facts(six)),
        Job("FSDP2 full sharding", "`(6,)`", 6, 2, sharded_coverage_facts(fsdp)),
        Job("HSDP", '`("replicate", "shard")` (3, 2)', 6, 2, sharded_coverage_facts(hsdp)),
        Job("FSDP2 x TP", '`("dp", "tp")` (3, 2)', 6, 2, tp_coverage_facts(fsdp_tp)),
        Job(
            "HSDP x TP",
            '`("replicate", "shard", "tp")` (3, 1, 2)',
            6,
            2,
            tp_coverage_facts(hsdp_tp),
        ),
        Job(
            "PP x FSDP2",
            '`("dp", "pp")` (3, 2)',
            6,
            1,
            pipeline_coverage_facts(stage_fsdp, 2, ((0,), (2,), (4,), (1,), (3,), (5,))),
            pp_columns,
            _pipeline(2, pp_columns, []),
        ),
        Job(
            "PP x HSDP",
            '`("replicate", "shard", "pp")` (3, 1, 2)',
            6,
            1,
            pipeline_coverage_facts(stage_hsdp, 2, ((0, 2, 4), (1, 3, 5))),
            pp_columns,
            _pipeline(2, pp_columns, []),
        ),
        Job(
            "TP x PP x HSDP",
            '`("replicate", "shard", "pp", "tp")` (3, 1, 2, 2)',
            12,
            2,
            pipeline_coverage_facts(
                stage_hsdp_tp, 2, ((0, 4, 8), (1, 5, 9), (2, 6, 10), (3, 7, 11))
            ),
            three_d_columns,
            # Every stage's TP groups, the job's (PipelineAdapter gathers them).
            _pipeline(2, three_d_columns, [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]),
        ),
    ]


# ------------------------------------------------------------------------------ rendering
def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _grouped(head: list[str], rows: list[tuple[str, list[str]]]) -> list[str]:
    """A table whose first column names every layout whose other cells are the same."""
    merged: dict[tuple[str, ...], list[str]] = {}
    for name, cells in rows:
        merged.setdefault(tuple(cells), []).append(name)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cells, names in merged.items():
        lines.append("| " + " | ".join([", ".join(names), *map(_cell, cells)]) + " |")
    return lines


def _on(check: dict[str, Any], text: str) -> str:
    return text if check["on"] else f"**off**: {check['why']}"


def render() -> list[str]:
    """The matrix: each check's answer per layout, precision, and what no check covers."""
    examples = jobs()
    covs = [(job, job.coverage()) for job in examples]
    lines = _grouped(
        ["layout", "mesh of the example (3 nodes)", "`parallelism`"],
        [(job.name, [job.mesh, f"`{cov['parallelism']}`"]) for job, cov in covs],
    )
    checks = [
        (
            "**1. Non-finite gradients**",
            ["what is checked", "confirmation"],
            lambda c: [
                c["checks"]["nonfinite_gradients"]["why"],
                c["checks"]["nonfinite_gradients"]["confirmation"]["why"],
            ],
        ),
        (
            f"**2. Ring replay audit** (`audit_every={EVERY}`, deterministic audits)",
            ["how it replays", "what it compares"],
            lambda c: [c["checks"]["replay_audit"]["why"], c["checks"]["replay_audit"]["compares"]],
        ),
        (
            f"**3. Weight fingerprints** (`check_every={EVERY}`)",
            ["what is compared", "who is named"],
            lambda c: [
                _on(c["checks"]["weight_fingerprints"], c["checks"]["weight_fingerprints"]["why"]),
                c["checks"]["weight_fingerprints"]["attribution"] or "-",
            ],
        ),
    ]
    for title, head, cells in checks:
        lines += ["", title, ""]
        lines += _grouped(["layout", *head], [(job.name, cells(cov)) for job, cov in covs])
    accumulated = [(job, job.coverage(grad_accum=4)) for job in examples]
    lines += ["", "**2. ... with `grad_accum=4`**", ""]
    lines += _grouped(
        ["layout", "micro-batches audited", "what it compares"],
        [
            (
                job.name,
                [
                    "one per audit, {rotation}; every position within {n} audits "
                    "(the first audits: positions {first})".format(
                        rotation=(mb := cov["checks"]["replay_audit"]["micro_batches"])["rotation"],
                        n=mb["every_position_within_audits"],
                        first=mb["positions_of_first_audits"],
                    ),
                    cov["checks"]["replay_audit"]["compares"],
                ],
            )
            for job, cov in accumulated
        ],
    )
    scaled = [job for job in examples if job.pipeline is None]  # a pipeline refuses a scaler
    lines += ["", "**Precision**: a non-finite gradient, without and with a `GradScaler`", ""]
    rows = []
    for job in scaled:
        plain = job.coverage()["precision"]
        fp16 = job.coverage(scaler=_GradScaler())["precision"]
        rows.append(
            (
                job.name,
                [
                    plain["non_finite"],
                    fp16["non_finite"]
                    + ("; " + fp16["sharded_skip"] if "sharded_skip" in fp16 else ""),
                ],
            )
        )
    lines += _grouped(["layout", "bf16 autocast or fp32", "fp16 + `GradScaler` (`scaler=`)"], rows)
    lines += ["", "Under a pipeline a `GradScaler` is refused.", ""]
    common = list(covs[0][1]["not_covered"])
    lines += ["**Not covered** by any check, under every layout:", ""]
    lines += [f"- {line}" for line in common]
    extra: dict[str, list[str]] = {}
    for job, cov in covs:
        for line in cov["not_covered"]:
            if line not in common:
                extra.setdefault(line, []).append(job.name)
    lines += ["", "and, beyond those, under the layouts named:", ""]
    lines += [f"- **{', '.join(names)}**: {line}" for line, names in extra.items()]
    lines += [
        "",
        "_Generated by `python benchmarks/render.py` (`benchmarks/coverage_matrix.py`) from "
        "`sdc_agent.coverage.describe` and the adapters' `coverage_facts()` for these example "
        "jobs, without online sensors; `guard.coverage()` gives the same for your job, with the "
        "sensors' `online_sensors` section._",
    ]
    return lines


class _GradScaler:
    """Stands for ``torch.amp.GradScaler``: ``describe`` reads only its class name."""


_GradScaler.__name__ = "GradScaler"


if __name__ == "__main__":
    print("\n".join(render()))
