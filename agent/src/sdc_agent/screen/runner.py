"""Run a screen: every op on every device, repeated with new seeds within a time budget, judged
by comparison (:mod:`sdc_agent.screen.compare`).

The plan: the fixed suite (:func:`sdc_agent.screen.ops.fixed_suite`), then the job's workload
(duplicates of a label run once), then, with two devices or more, the collective. Repetition
``r`` runs every op with seed ``seed + r``: new inputs each time, so a fault that depends on the
data, or fires on a fraction of calls, gets fresh chances. Repetitions stop at
``repetitions`` or, after the first, once ``budget_s`` has passed (checked between repetitions,
so one repetition may run over).

**When a device is named.** A device *mismatched* an observation (an op at one seed) when its
digest differs from the observation's reference. It is ``reproduced`` when it mismatched at
least :data:`~sdc_contract.screen.REPRODUCED_MIN_MISMATCHES` (2) observations (one op at two
seeds, or two ops): a persistent fault mismatches every repetition; an intermittent one that
fires on a fraction p of the calls it targets, over c calls, is reproduced with probability
1 - (1-p)^c - c p (1-p)^(c-1); at p = 0.1 and the default 16 repetitions, a fault on every
op of the 14-op suite (c = 224) is missed with probability below 1e-8, one on the six GEMMs
(c = 96) below 5e-4. A device with exactly one mismatch is ``suspect``: named, the screen
``inconclusive`` (a second screen decides).

**Verdict.** ``reproduced`` when a device is; else ``inconclusive`` when a device is suspect,
an observation had no reference (no strict majority and no golden, or the majority differs from
the golden), or nothing could be judged at all (one device, no golden); else ``clean``.
``failed`` when the screen could not run (the error is in the result).

**Golden digests.** Read from the store under this screen's environment key only
(:mod:`sdc_agent.screen.golden`); learned after a ``clean`` screen on two devices or more in
which every device agreed on every observation. The key's ``workload`` is the digest of the
per-device ops (suite and workload), not of the collective: whether the collective runs depends
on the number of devices, and a single-GPU node (which can only be judged against golden
digests) must find the digests that a screen of several GPUs of the same model learned. The
collective is never filed nor looked up: its sum depends on how many devices contribute.

**The collective.** Each device contributes a seeded tensor of its own; every device receives
every contribution (a device-to-device copy) and adds them in one fixed order (device 0 first),
so all devices must compute the same bits. A device whose sum differs is named; a device whose
outgoing copies are corrupted makes every receiver disagree with its own (local) sum, and is
the minority itself. This is not NCCL: no NCCL kernel, ring or tree, no NVLink/NVSwitch
reduction runs, and the result says so.

**Determinism.** ``torch.use_deterministic_algorithms(True)`` and ``cudnn.benchmark = False``
for the whole screen (restored afterwards); on CUDA ``CUBLAS_WORKSPACE_CONFIG`` defaults to
``:4096:8``, which deterministic cuBLAS needs. On CUDA each op first runs twice on the first
device with the first seed; an op whose two runs differ is not screened (a nondeterministic
kernel on this stack cannot be judged by comparison), and the result lists it.
It runs twice on *every* device and an op is excluded only when more than half of them gave
two different digests: a kernel that is nondeterministic on this stack is so on every device,
while an intermittent fault is on one, and checking the first device alone would let a fault
there exclude the very op it corrupts.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from sdc_contract.screen import (
    REPRODUCED_MIN_MISMATCHES,
    DeviceStatus,
    OpSpec,
    ScreenVerdict,
    shape_list_digest,
)

from .compare import Judgement, judge
from .devices import EnvironmentKey, ScreenDevice, environment_key
from .golden import GoldenStore, observation_id
from .ops import (
    OutputHook,
    Size,
    collective_spec,
    digest,
    error_digest,
    fixed_suite,
    make_inputs,
    run_on,
)

DEFAULT_REPETITIONS = 16
"""Repetitions (seeds) by default: enough for an intermittent fault (module docstring)."""
DEFAULT_BUDGET_S = 600.0
"""The time budget by default, in seconds (a Kubernetes Job's patience, not a GPU's need)."""
NOT_NCCL = (
    "nccl: the collective is device-to-device copies added in a fixed order, "
    "not an NCCL kernel or an NVLink/NVSwitch reduction"
)
NOT_EVERYTHING = (
    "everything else the job runs: other kernels and shapes, its data, "
    "communication under load, a real job's power and thermal state"
)


@dataclass(frozen=True)
class ScreenConfig:
    """What a screen runs and for how long."""

    workload: tuple[OpSpec, ...] = ()
    """The job's own ops (``sdc.workload/v1``), run after the fixed suite."""
    size: Size | None = None
    """The fixed suite's size; None: ``training`` on GPUs, ``small`` on the CPU."""
    repetitions: int = DEFAULT_REPETITIONS
    """How many seeds at most."""
    budget_s: float = DEFAULT_BUDGET_S
    """No new repetition starts after this many seconds (the first always runs)."""
    seed: int = 0
    """Repetition r uses seed ``seed + r``."""
    learn_golden: bool = True
    """File the digests of a clean screen in the golden store (when one is given)."""
    check_repeatable: bool | None = None
    """Run each op twice on the first device first; None: on CUDA only."""

    def __post_init__(self) -> None:
        """Refuse values that cannot run."""
        if self.repetitions < 1:
            raise ValueError(f"repetitions must be at least 1, got {self.repetitions}")
        if not self.budget_s > 0:
            raise ValueError(f"budget_s must be positive, got {self.budget_s}")
        if self.seed < 0:
            raise ValueError(f"seed must be non-negative, got {self.seed}")


@dataclass(frozen=True)
class Observation:
    """One op at one seed on every device."""

    op: OpSpec
    seed: int
    digests: dict[int, str]
    """Each device's digest, by index."""
    golden: str | None
    """The golden digest used (None: none filed)."""
    judgement: Judgement


@dataclass(frozen=True)
class DeviceResult:
    """One device's part of the result."""

    device: ScreenDevice
    status: DeviceStatus
    mismatches: int
    """How many observations it mismatched."""
    ops: tuple[str, ...]
    """The labels of the ops it mismatched, in the order first seen."""
    digest: str
    """A 16-hex digest of all its digests in order: equal on devices (and runs) that agree."""


@dataclass(frozen=True)
class ScreenResult:
    """A screen's result; :func:`sdc_agent.screen.report.document` makes its JSON."""

    verdict: ScreenVerdict
    summary: str
    devices: tuple[DeviceResult, ...] = ()
    observations: tuple[Observation, ...] = ()
    ops: tuple[OpSpec, ...] = ()
    """The ops run (suite, workload without duplicates, collective), minus those excluded."""
    exercised: dict[str, Any] = field(default_factory=dict)
    not_exercised: tuple[str, ...] = ()
    inconclusive_ops: tuple[str, ...] = ()
    golden: dict[str, Any] = field(default_factory=dict)
    environment: EnvironmentKey | None = None
    durations_s: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    def device(self, index: int) -> DeviceResult:
        """The result of the device with this index (KeyError when there is none)."""
        for result in self.devices:
            if result.device.index == index:
                return result
        raise KeyError(index)


def _fileable(op: OpSpec) -> bool:
    """Whether the op's digests are golden material (not the collective: module docstring)."""
    return op.kind != "collective"


def _plan(devices: Sequence[ScreenDevice], config: ScreenConfig) -> tuple[Size, list[OpSpec]]:
    size: Size = config.size or ("training" if devices[0].device.type == "cuda" else "small")
    ops: list[OpSpec] = []
    seen: set[str] = set()
    for op in (*fixed_suite(size), *config.workload):
        if op.label() not in seen:
            seen.add(op.label())
            ops.append(op)
    if len(devices) >= 2:
        ops.append(collective_spec(size))
    return size, ops


def _collective(
    spec: OpSpec,
    seed: int,
    devices: Sequence[ScreenDevice],
    hooks: Mapping[int, OutputHook],
) -> dict[int, str]:
    """Each device's digest of the all-sum (module docstring)."""
    try:
        parts = [make_inputs(spec, seed, part=i)[0].to(d.device) for i, d in enumerate(devices)]
    except Exception as exc:
        return {d.index: error_digest(exc) for d in devices}
    digests = {}
    for receiver, d in enumerate(devices):
        try:
            with torch.no_grad():
                total = parts[receiver].clone()
                total.zero_()
                for part in parts:  # the same order on every device
                    total += part.to(d.device)
            outputs = [total]
            hook = hooks.get(d.index)
            if hook is not None:
                outputs = hook(spec, outputs)
            digests[d.index] = digest(outputs)
        except Exception as exc:
            digests[d.index] = error_digest(exc)
    return digests


def _observe(
    op: OpSpec, seed: int, devices: Sequence[ScreenDevice], hooks: Mapping[int, OutputHook]
) -> dict[int, str]:
    if op.kind == "collective":
        return _collective(op, seed, devices, hooks)
    inputs = make_inputs(op, seed)
    return {d.index: run_on(op, inputs, d.device, hooks.get(d.index)) for d in devices}


def _failed(error: str, started: float, clock: Callable[[], float]) -> ScreenResult:
    return ScreenResult(
        verdict="failed",
        summary=f"failed: {error}",
        error=error,
        durations_s={"total": round(clock() - started, 3)},
    )


def run_screen(
    devices: Sequence[ScreenDevice],
    config: ScreenConfig | None = None,
    golden: GoldenStore | None = None,
    hooks: Mapping[int, OutputHook] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> ScreenResult:
    """Screen ``devices`` (module docstring). ``golden``: the store to compare with and learn
    into (None: no golden digests). ``hooks``: output hooks by device index, for fault
    injection in tests and demos only. Never raises for what the screen finds or for an op
    that fails; a screen that cannot run returns a ``failed`` result."""
    config = config or ScreenConfig()
    hooks = dict(hooks or {})
    started = clock()
    if not devices:
        return _failed("no device to screen", started, clock)
    models = sorted({d.model for d in devices})
    if len(models) > 1:
        return _failed(f"the devices are not alike: {models}", started, clock)
    unknown = sorted(set(hooks) - {d.index for d in devices})
    if unknown:
        return _failed(f"a fault on device(s) {unknown}, which are not screened", started, clock)
    on_cuda = devices[0].device.type == "cuda"
    if on_cuda:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    benchmark = torch.backends.cudnn.benchmark
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    try:
        return _run(devices, config, golden, hooks, clock, started, on_cuda)
    except Exception as exc:  # the result must still be written
        return _failed(f"{type(exc).__name__}: {exc}", started, clock)
    finally:
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        torch.backends.cudnn.benchmark = benchmark


def _run(
    devices: Sequence[ScreenDevice],
    config: ScreenConfig,
    store: GoldenStore | None,
    hooks: Mapping[int, OutputHook],
    clock: Callable[[], float],
    started: float,
    on_cuda: bool,
) -> ScreenResult:
    size, ops = _plan(devices, config)
    # Not the collective: see the module docstring ("Golden digests").
    key = environment_key(list(devices), shape_list_digest([o for o in ops if _fileable(o)]))
    golden = store.digests(key) if store is not None else {}
    not_exercised: list[str] = [NOT_NCCL]
    if len(devices) == 1:
        not_exercised += [
            "collective: a single device",
            "peers: a single device, judged against golden digests only",
        ]

    check_repeatable = on_cuda if config.check_repeatable is None else config.check_repeatable
    if check_repeatable:
        kept = []
        for op in ops:
            if op.kind == "collective":
                kept.append(op)
                continue
            inputs = make_inputs(op, config.seed)
            unrepeatable = [
                d.index
                for d in devices
                if len({run_on(op, inputs, d.device, hooks.get(d.index)) for _ in range(2)}) > 1
            ]
            # More than half: the kernel, not a device (module docstring, "Determinism").
            if len(unrepeatable) * 2 > len(devices):
                not_exercised.append(
                    f"{op.label()}: not repeatable on devices {unrepeatable} (nondeterministic)"
                )
            else:
                kept.append(op)
        ops = kept
    setup_s = clock() - started

    observations: list[Observation] = []
    done = 0
    for r in range(config.repetitions):
        if r > 0 and clock() - started > config.budget_s:
            break
        seed = config.seed + r
        for op in ops:
            digests = _observe(op, seed, devices, hooks)
            filed = golden.get(observation_id(op.label(), seed)) if _fileable(op) else None
            observations.append(Observation(op, seed, digests, filed, judge(digests, filed)))
        done += 1
    if done < config.repetitions:
        not_exercised.append(
            f"repetitions: {done} of {config.repetitions} within {config.budget_s:g} s"
        )

    errored = []
    for obs in observations:
        if obs.judgement.errored and obs.op.label() not in errored:
            errored.append(obs.op.label())
    not_exercised += [f"{label}: raised on most devices" for label in errored]
    inconclusive = list(
        dict.fromkeys(o.op.label() for o in observations if o.judgement.reference is None)
    )
    judged = any(
        o.judgement.reference is not None and not o.judgement.errored for o in observations
    )

    results = []
    for d in devices:
        mismatched = [o for o in observations if d.index in o.judgement.mismatched]
        status: DeviceStatus
        if len(mismatched) >= REPRODUCED_MIN_MISMATCHES:
            status = "reproduced"
        elif mismatched:
            status = "suspect"
        elif judged:
            status = "agrees"
        else:
            status = "unjudged"
        own = "\n".join(o.digests[d.index] for o in observations)
        results.append(
            DeviceResult(
                device=d,
                status=status,
                mismatches=len(mismatched),
                ops=tuple(dict.fromkeys(o.op.label() for o in mismatched)),
                digest=hashlib.sha256(own.encode()).hexdigest()[:16],
            )
        )

    verdict: ScreenVerdict
    if any(r.status == "reproduced" for r in results):
        verdict = "reproduced"
    elif any(r.status == "suspect" for r in results) or inconclusive or not judged:
        verdict = "inconclusive"
    else:
        verdict = "clean"

    learned = 0
    if (
        store is not None
        and config.learn_golden
        and verdict == "clean"
        and len(devices) >= 2
        and all(o.judgement.unanimous or o.judgement.errored for o in observations)
    ):
        learned = store.learn(
            key,
            {
                observation_id(o.op.label(), o.seed): o.digests[devices[0].index]
                for o in observations
                if o.judgement.unanimous and _fileable(o.op)
            },
        )
        if learned:
            store.save()
    if not golden:
        foreign = store.foreign_keys(key) if store is not None else 0
        not_exercised.append(
            "golden: none for this environment key"
            + (f" ({foreign} entries under other keys, not used)" if foreign else "")
        )

    total_s = clock() - started
    exercised = {
        "ops": [op.label() for op in ops],
        "kinds": dict(Counter(op.kind for op in ops)),
        "suite_ops": len(fixed_suite(size)),
        "workload_ops": len(config.workload),
        "devices": len(devices),
        "repetitions": done,
        "planned_repetitions": config.repetitions,
        "seeds": [config.seed, config.seed + max(done - 1, 0)],
        "observations": len(observations),
        "size": size,
        "deterministic_algorithms": True,
    }
    return ScreenResult(
        verdict=verdict,
        summary=_summary(verdict, results, observations, ops, inconclusive),
        devices=tuple(results),
        observations=tuple(observations),
        ops=tuple(ops),
        exercised=exercised,
        not_exercised=tuple(not_exercised),
        inconclusive_ops=tuple(inconclusive),
        golden={
            "store": store is not None,
            "entries_for_key": len(golden),
            "compared": sum(1 for o in observations if o.golden is not None),
            "learned": learned,
            "foreign_keys": store.foreign_keys(key) if store is not None else 0,
        },
        environment=key,
        durations_s={
            "total": round(total_s, 3),
            "setup": round(setup_s, 3),
            "repetitions": round(total_s - setup_s, 3),
        },
    )


def _summary(
    verdict: ScreenVerdict,
    results: Sequence[DeviceResult],
    observations: Sequence[Observation],
    ops: Sequence[OpSpec],
    inconclusive: Sequence[str],
) -> str:
    n = len(observations)
    named = [r for r in results if r.status in ("reproduced", "suspect")]
    who = "; ".join(
        f"device {r.device.index} ({r.device.uuid}) {r.status}: {r.mismatches} of {n} "
        f"observations mismatched"
        for r in named
    )
    if verdict == "reproduced":
        return f"reproduced: {who}"
    if verdict == "clean":
        return (
            f"clean: {len(results)} devices agreed on {n} observations of {len(ops)} ops "
            "(not an exoneration: see not_exercised)"
        )
    parts = [who] if who else []
    if inconclusive:
        parts.append(f"{len(inconclusive)} ops without a reference")
    if not parts:
        if len(results) == 1:
            parts.append("nothing could be compared (a single device and no golden digests)")
        else:
            parts.append("nothing could be judged (every op raised on most devices)")
    return "inconclusive: " + "; ".join(parts)


__all__ = [
    "DEFAULT_BUDGET_S",
    "DEFAULT_REPETITIONS",
    "DeviceResult",
    "Observation",
    "ScreenConfig",
    "ScreenResult",
    "run_screen",
]
