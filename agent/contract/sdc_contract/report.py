"""The agent's report, schema ``sdc.alarm/v1``: its keys, check names and verdict names.

The agent writes the report (``sdc_agent.alarm.Alarm.to_dict`` plus ``cluster``, ``job``,
``time``) to CloudWatch Logs; the remediation pipeline reads it, names suspects from it, and
puts its check and verdict into messages, metric dimensions, mode lookups and the ledger. Both
sides take the names from here. docs/CONTRACT.md ("Agent -> CloudWatch") says what each key
means.

Verdicts: a report's ``verdicts[].kind`` says how a confirmation settled a dispute
(:data:`VERDICT_KINDS`); a rank named without a confirmation gets the reason the check named it
(:data:`NAMING_REASONS`). A newer agent may send a kind this list does not know: the report keeps
it, but everything the pipeline derives from it (a subject line, a metric dimension, a mode
lookup, a ledger row) reads :data:`UNKNOWN_VERDICT` instead (:func:`verdict_name`), so a value
outside the list never becomes free text there.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal, get_args

ALARM_SCHEMA = "sdc.alarm/v1"
"""One alarm's report: a JSON log event in ``/sdc/<cluster>``, stream ``<job>``."""
RANKMAP_SCHEMA = "sdc.rankmap/v1"
"""Where every rank runs, written at job start in the same stream (possibly in several parts)."""
ALARM_RECORD_SCHEMA = "sdc.alarm-record/v1"
"""One file of the alarm log next to the checkpoints (``sdc_agent.recovery``)."""

Check = Literal["compute", "reduced_gradient", "weights"]
"""Which check fired: ``compute`` (non-finite local gradients, the ring replay audit, a
confirmed sensor flag), ``reduced_gradient`` (a non-finite reduced gradient, no rank named),
``weights`` (replicas' weights diverged)."""
CHECKS: tuple[Check, ...] = get_args(Check)

VerdictKind = Literal[
    "persistent",
    "transient",
    "replayer_wrong",
    "unclear",
    "unattributable",
    "reproducible",
    "setup",
]
"""How a confirmation (a replay on a third GPU) settled one dispute: the report's
``verdicts[].kind``. ``reproducible``: a non-finite gradient that the third GPU reproduces from
the same micro-batch (numerics or data, not a GPU). ``setup``: a finding no single GPU can
explain (the rebuilt batch differs from the one trained on, every comparison of a ring
mismatched, a failed preflight): the user's set-up, not hardware; it names nobody and the
report's ``setup`` entry says which check failed and how to fix it."""
SETUP_VERDICT: Literal["setup"] = "setup"
"""The verdict of a finding that is the job's set-up, not a GPU: localize refuses such a report."""
VERDICT_KINDS: tuple[VerdictKind, ...] = get_args(VerdictKind)

NamingReason = Literal["culprit", "nonfinite", "weights_minority", "named"]
"""Why a rank is a suspect when no confirmation names it: in two mismatching pairs
(``culprit``), a non-finite local gradient (``nonfinite``), in the minority of a weight
comparison (``weights_minority``), otherwise listed in ``suspects`` (``named``)."""
NAMING_REASONS: tuple[NamingReason, ...] = get_args(NamingReason)

UNKNOWN_VERDICT: Literal["unknown"] = "unknown"
"""What the pipeline reads for a verdict outside this list (a newer agent's)."""

SuspectVerdict = Literal[
    "persistent",
    "transient",
    "replayer_wrong",
    "unclear",
    "unattributable",
    "reproducible",
    "setup",
    "culprit",
    "nonfinite",
    "weights_minority",
    "named",
    "unknown",
]
"""A suspect's verdict in the pipeline: a confirmation's kind, a naming reason, or unknown."""
SUSPECT_VERDICTS: tuple[SuspectVerdict, ...] = get_args(SuspectVerdict)

REPORT_KEYS: tuple[str, ...] = (
    "schema",
    "step",
    "check",
    "nonfinite",
    "mismatched_pairs",
    "culprits",
    "verdicts",
    "suspects",
    "suspect_window",
    "last_audit_pass",
    "last_weight_check_pass",
    "divergent_tensors",
    "ranks",
    "diagnosis",
    "metric",
    "cluster",
    "job",
    "time",
)
"""The keys of every ``sdc.alarm/v1`` report."""
OPTIONAL_REPORT_KEYS: tuple[str, ...] = ("sensor_candidates", "canary_run", "setup", "workload")
"""Keys present only on some reports: a confirmed sensor candidate's alarm; a canary's report
(written by the canary function, never by the agent); a set-up finding's report (``setup``:
:data:`SETUP_KEYS`), which names nobody; the job's workload (``workload``: an
``sdc.workload/v1`` document, :mod:`sdc_contract.screen`), when the guard recorded one."""
SETUP_KEYS: tuple[str, ...] = ("cause", "detail", "fix", "audits")
"""The keys of a report's ``setup`` entry: ``cause`` (one of :data:`SETUP_CAUSES`), ``detail``
(what was seen, with ranks and steps), ``fix`` (what to change), ``audits`` (``off``: the guard
stopped its audits and trains on; ``stopped``: the guard stopped the job)."""
SetupCause = Literal[
    "rebuild_batch_mismatch",
    "rebuild_batch_failed",
    "compute_loss_ignores_model",
    "replay_differs_from_training",
    "nondeterministic_replay",
    "more_than_one_gpu",
    "heterogeneous_ranks",
]
"""Why a finding is the job's set-up: the rebuilt batch is not the trained one; rebuilding or
replaying keeps raising; ``compute_loss`` ran the training wrapper instead of the module it was
given; every rank's replay of its own batch differs from its training; two replays of one
batch on one GPU differ (kernels outside deterministic mode); a ring's comparisons mismatched
more than one faulty GPU can explain; the ranks do not compute alike (another GPU model or SM
count, another torch/CUDA build, another CPU thread count), found at construction."""
SETUP_CAUSES: tuple[SetupCause, ...] = get_args(SetupCause)
RANK_KEYS: tuple[str, ...] = ("node_name", "instance_id", "gpu_uuid", "local_rank", "pod_name")
"""The keys of one ``ranks`` entry (``pod_name`` where known), keyed by the global rank."""
VERDICT_ENTRY_KEYS: tuple[str, ...] = ("pair", "third", "suspect", "kind")
"""The keys of one ``verdicts`` entry."""


def verdict_name(value: object) -> SuspectVerdict:
    """``value`` when it is one of :data:`SUSPECT_VERDICTS`, else :data:`UNKNOWN_VERDICT`."""
    return value if value in SUSPECT_VERDICTS else UNKNOWN_VERDICT


def check_rank_keys(keys: Iterable[str]) -> None:
    """Rank maps are keyed by the global rank as a decimal string ("0", "17"); ValueError
    names the first keys that are not."""
    bad = [k for k in keys if not (k.isascii() and k.isdigit())]
    if bad:
        raise ValueError(f"rank keys must be non-negative integers, got {bad[:3]}")


def check_window(window: Sequence[int]) -> None:
    """``suspect_window`` is [first, last] step, 0 <= first <= last; ValueError otherwise."""
    if len(window) != 2 or not 0 <= window[0] <= window[1]:
        raise ValueError(
            f"suspect_window must be [first, last] with 0 <= first <= last, got {list(window)}"
        )


__all__ = [
    "ALARM_RECORD_SCHEMA",
    "ALARM_SCHEMA",
    "CHECKS",
    "NAMING_REASONS",
    "OPTIONAL_REPORT_KEYS",
    "RANKMAP_SCHEMA",
    "RANK_KEYS",
    "REPORT_KEYS",
    "SETUP_CAUSES",
    "SETUP_KEYS",
    "SETUP_VERDICT",
    "SUSPECT_VERDICTS",
    "UNKNOWN_VERDICT",
    "VERDICT_ENTRY_KEYS",
    "VERDICT_KINDS",
    "Check",
    "NamingReason",
    "SetupCause",
    "SuspectVerdict",
    "VerdictKind",
    "check_rank_keys",
    "check_window",
    "verdict_name",
]
