"""A single-fault campaign on a Hugging Face Llama: which one-step faults does the guard name?

Six gloo ranks on the CPU (3 simulated nodes x 2 ranks, ``peer_offset`` 2), a Llama built from a
config (tests/support/llama.py: RMSNorm, SwiGLU, SDPA attention with rotary embeddings and
grouped-query attention, the loss computed by the model), ``sdc.protect(model,
attention="checked")`` before DDP, AdamW. Each trial starts every rank from the same state,
corrupts ONE element (uniformly at random) of ONE op's result (a random site of the family, a
random call of it) on ONE random rank, once (x1.1, or a flip of one random bit in 20-30 of an
fp32 value, 4-14 of a 16-bit one), and asks:

* effective: did the fault change the weights? The same step is run with the same fault on an
  unguarded twin of the model (same weights, same batch) and its weights after AdamW are compared
  bit for bit with the fault-free step's.
* named: did the guard (every check, audits off) name the faulty rank at that step, and never
  another rank? With ``Schedule(sensor_budget=math.inf)`` every sensor checks every step ("full
  coverage"). At the default budget (1%) the guard checks every sensor on one step in
  ``period`` (its plan, in bursts) and none between, so a one-step fault is named with the same
  chance as at full coverage on a sensor step and not at all otherwise: ``named at full coverage
  x 1 / period``.

Then the overhead: the same training loop unguarded (the plain Llama in DDP, no ``protect``),
guarded without sensors (checks 1-3 only), guarded at the default budget and at full coverage,
in interleaved rounds on the same six ranks.

    python benchmarks/campaign.py                      # 12 trials per family, fp32 and bf16
    python benchmarks/campaign.py --trials 30 --json campaign.json
"""

from __future__ import annotations

import argparse
import copy
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

from results import Recorder

# The Llama comes from the tests' support package (transformers is a development dependency).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist
from torch import nn

import sdc_agent as sdc
from sdc_agent.drills.faults import _flip_bit_
from sdc_agent.drills.launch import launch
from sdc_agent.sensors import SensorConfig
from sdc_agent.sensors.ops.linear import find_board
from sdc_agent.sensors.ops.sites import find_sites
from tests.support.llama import causal_lm_loss, llama, tokens

WORLD, PER_NODE, PEER_OFFSET = 6, 2, 2
WARMUP_STEPS = 6  # guarded steps before the trials: the sites found, the sensors warm
BATCHES = 4  # distinct batches the trials draw from (each has its fault-free reference)

# family: (sensor kind[:part] whose result the fault corrupts, the results' tap labels)
FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "GEMM forward": ("linear", ("forward",)),
    "GEMM input gradient": ("linear", ("dgrad",)),
    "GEMM weight gradient": ("linear", ("wgrad",)),
    "RMSNorm forward": ("rms_norm", ("forward",)),
    "RMSNorm input gradient": ("rms_norm", ("dgrad",)),
    "SiLU forward": ("activation", ("forward",)),
    "SiLU input gradient": ("activation", ("dgrad",)),
    "gating product forward": ("mul:gating", ("forward",)),
    "gating product gradients": ("mul:gating", ("dgrad",)),
    "residual adds": ("add:residual", ("forward",)),
    "rotary adds": ("add:rotary", ("forward",)),
    "rotary products": ("mul:rotary", ("forward", "dgrad")),
    "attention forward (QKᵀ, softmax, PV)": ("attention", ("scores", "probs", "forward")),
    "attention backward": ("attention", ("dgrad", "dgrad_k", "dgrad_v", "dprobs", "dscores")),
    "loss forward (log-softmax)": ("cross_entropy", ("forward",)),
    "loss gradient": ("cross_entropy", ("dlogp", "dgrad")),
    "embedding lookup": ("embedding", ("forward",)),
    "embedding weight gradient": ("embedding", ("wgrad",)),
    "RMSNorm weight gradients": ("rms_norm", ("wgrad",)),
}
"""Every computing op family of the Llama's training step; a fault corrupts one element of the
op's result before the sensor reads it, as a faulty GPU would. Not in the campaign: ops that only
move data (reshapes, transposes, the concatenation and negation of ``rotate_half``, dtype casts),
the loss's reduction to a scalar (which no gradient reads), the fused attention kernel (the
campaign runs ``attention="checked"``; the fused kernel is seen only by recompute comparisons under
activation checkpointing: tests/agent/test_sensors_llama_ddp.py), and the optimizer's own
arithmetic (audits and weight checks cover those)."""


# ---------------------------------------------------------------- faults, on any rank's model
def corrupt(flat: torch.Tensor, spec: dict[str, Any]) -> None:
    """Apply the trial's fault to one element of ``flat`` (a flat view), in place."""
    index = min(flat.numel() - 1, int(spec["where"] * flat.numel()))
    if spec["fault"] == "x1.1":
        flat[index] *= 1.1
    else:
        bit = spec["bit"] - 16 if flat.element_size() == 2 else spec["bit"]
        _flip_bit_(flat, index, bit)


def tap_target(model: nn.Module, name: str) -> Any:
    """What carries the taps of sensor ``name``: a protected module or a function site."""
    if "/" in name:
        return find_sites(model).lookup(name)
    return model.get_submodule(name)


class Injection:
    """One trial's fault on one model: a tap on the sensor's result, before its check, as a
    faulty GPU would corrupt it (installed only on the faulty rank)."""

    def __init__(self, spec: dict[str, Any], model: nn.Module) -> None:
        self.spec, self.model = spec, model
        self.fired = False
        self._undo: list[Any] = []

    def install(self) -> Injection:
        spec = self.spec
        if dist.get_rank() != spec["rank"]:
            return self
        target = tap_target(self.model, spec["target"])
        seen = [0]

        def tap(label: str, value: torch.Tensor) -> None:
            if label != spec["label"] or self.fired:
                return
            seen[0] += 1
            if seen[0] - 1 != spec["occurrence"]:
                return
            flat = value.view(-1) if value.is_contiguous() else value.reshape(-1)
            corrupt(flat, spec)
            if not value.is_contiguous():
                value.copy_(flat.view_as(value))
            self.fired = True

        target.gemm_taps.append(tap)
        self._undo.append(lambda: target.gemm_taps.remove(tap))
        return self

    def remove(self) -> bool:
        """Uninstall; whether the fault fired."""
        for undo in self._undo:
            undo()
        return self.fired


# ---------------------------------------------------------------- the job, on every rank
def _weights(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])


def _plain_step(ddp: nn.Module, optimizer: torch.optim.Optimizer, batch: Any, bf16: bool) -> None:
    causal_lm_loss(ddp, batch, bf16=bf16).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _guarded_step(
    guard: sdc.Guard, ddp: nn.Module, optimizer: Any, step: int, batch: Any, bf16: bool
) -> sdc.Alarm | None:
    with guard.step(step) as guarded:
        loss = causal_lm_loss(ddp, batch, bf16=bf16)
        loss.backward()
        alarm = guarded.check_gradients(loss)
        if alarm is None and guarded.update_allowed:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if alarm is None:
            alarm = guarded.after_update()
    return alarm or guard.finish()


class _Quiet:
    """A publisher that keeps nothing (the campaign reads the alarms the guard returns)."""

    def publish_rank_map(self, ranks: dict) -> None:
        pass

    def publish_alarm(self, alarm: Any) -> None:
        pass

    def publish_liveness(self, *args: Any) -> None:
        pass

    def publish_unconfirmed_sensor_flags(self, step: int, count: int) -> None:
        pass

    def flush(self, timeout: float | None = None) -> bool:
        return True


def _build(bf16: bool, budget: float, attention: str) -> dict[str, Any]:
    """The guarded model and its unguarded twin, both protected, trained alike to one state."""
    guarded_model, twin = llama(), llama()
    for model in (guarded_model, twin):
        # A short warm-up (the campaign's few steps) so that every sensor checks from the
        # first trial on.
        sdc.protect(model, attention=attention, config=SensorConfig(warmup_checks=WARMUP_STEPS))
    # The twin computes with the kernels the guarded model's sensors put on the checked path:
    # at full coverage every sensor, every step. A 16-bit protected GEMM on that path (an fp32
    # accumulator rounded once) is not bit-identical to the plain kernel an unarmed layer runs,
    # so an unarmed twin would not be the guarded model's fault-free reference. Armed, then
    # told to check nothing: the twin's board never flags.
    twin_board = find_board(twin)
    if twin_board is None:
        raise RuntimeError("campaign: the twin has no protected layer")
    twin_board.arm(frozenset(range(len(twin_board))))
    twin_board.stop_checking()
    ddp, twin_ddp = (nn.parallel.DistributedDataParallel(m) for m in (guarded_model, twin))
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    twin_optimizer = torch.optim.AdamW(twin_ddp.parameters(), lr=1e-3)
    batches: dict[int, int] = {}  # guard step -> batch id, for replays
    guard = sdc.Guard(
        ddp,
        optimizer,
        compute_loss=lambda model, batch: causal_lm_loss(model, batch, bf16=bf16),
        rebuild_batch=lambda step, rank: tokens(batches.get(step, step), rank, seed=1),
        schedule=sdc.Schedule(
            audit_every=0,
            check_every=0,
            peer_offset=PEER_OFFSET,
            sensor_budget=budget,
            check_on_start=False,
        ),
        publisher=_Quiet(),
    )
    for step in range(WARMUP_STEPS):
        batches[step] = step
        _guarded_step(guard, ddp, optimizer, step, tokens(step, dist.get_rank(), seed=1), bf16)
        _plain_step(twin_ddp, twin_optimizer, tokens(step, dist.get_rank(), seed=1), bf16)
    if not torch.equal(_weights(guarded_model), _weights(twin)):
        raise RuntimeError("campaign: the guarded model and its twin diverged in the warm-up")
    return {
        "model": guarded_model,
        "ddp": ddp,
        "optimizer": optimizer,
        "twin": twin,
        "twin_ddp": twin_ddp,
        "twin_optimizer": twin_optimizer,
        "guard": guard,
        "batches": batches,
        "state": (copy.deepcopy(guarded_model.state_dict()), copy.deepcopy(optimizer.state_dict())),
    }


def _restore(model: nn.Module, optimizer: Any, state: tuple[dict, dict]) -> None:
    model.load_state_dict(state[0])
    optimizer.load_state_dict(copy.deepcopy(state[1]))


def _targets(run: dict[str, Any]) -> dict[str, list[tuple[str, str, int]]]:
    """Per family, its sites: (target, label, occurrences per step), counted on a clean step of
    the twin."""
    twin = run["twin"]
    board = find_sites(run["model"]).board
    kinds = dict(board.layers)
    found: dict[str, list[tuple[str, str, int]]] = {}
    counts: dict[tuple[str, str], int] = {}
    taps = []
    for name in kinds:
        target = tap_target(twin, name)

        def count(label: str, value: torch.Tensor, name: str = name) -> None:
            counts[(name, label)] = counts.get((name, label), 0) + 1

        target.gemm_taps.append(count)
        taps.append((target, count))
    _restore(twin, run["twin_optimizer"], run["state"])
    _plain_step(run["twin_ddp"], run["twin_optimizer"], tokens(0, dist.get_rank(), seed=1), False)
    for target, count in taps:
        target.gemm_taps.remove(count)
    for family, (where, labels) in FAMILIES.items():
        kind, _, part = where.partition(":")
        sites: list[tuple[str, str, int]] = []
        for name, got in kinds.items():
            if got != kind:
                continue
            # Adds and products in the attention's own forward are the rotary embedding's;
            # the decoder layer's adds are the residuals, the MLP's product the gating.
            rotary = ".self_attn/" in name
            if (part == "rotary" and not rotary) or (part in ("residual", "gating") and rotary):
                continue
            sites += [(name, label, counts.get((name, label), 0)) for label in labels]
        found[family] = [s for s in sites if s[2] > 0]
    return found


def campaign_job(
    *, trials: int, bf16: bool, attention: str, seed: int, families: list[str]
) -> dict[str, Any]:
    """Run the campaign on this rank (collective: every rank runs the same trials)."""
    logging.getLogger("sdc_agent").setLevel(logging.CRITICAL)  # every trial's alarm is logged
    torch.manual_seed(0)
    run = _build(bf16, math.inf, attention)
    guard, batches = run["guard"], run["batches"]
    targets = _targets(run)
    gen = torch.Generator().manual_seed(seed)
    references: dict[int, torch.Tensor] = {}
    for b in range(BATCHES):
        _restore(run["twin"], run["twin_optimizer"], run["state"])
        batch = tokens(1000 + b, dist.get_rank(), seed=1)
        _plain_step(run["twin_ddp"], run["twin_optimizer"], batch, bf16)
        references[b] = _weights(run["twin"])

    def draw(family: str) -> dict[str, Any]:
        sites = targets[family]
        target, label, calls = sites[int(torch.randint(len(sites), (1,), generator=gen))]
        return {
            "family": family,
            "target": target,
            "label": label,
            "occurrence": int(torch.randint(calls, (1,), generator=gen)),
            "where": float(torch.rand((), generator=gen)),
            "fault": "x1.1" if float(torch.rand((), generator=gen)) < 0.5 else "bit",
            "bit": int(torch.randint(20, 31, (1,), generator=gen)),
            "rank": int(torch.randint(WORLD, (1,), generator=gen)),
            "batch": int(torch.randint(BATCHES, (1,), generator=gen)),
        }

    rows = []
    step = WARMUP_STEPS
    for family in families:
        for _ in range(trials if targets[family] else 0):
            spec = draw(family)
            batch = tokens(1000 + spec["batch"], dist.get_rank(), seed=1)
            # Effective? The unguarded twin takes the same step with the same fault.
            _restore(run["twin"], run["twin_optimizer"], run["state"])
            injection = Injection(spec, run["twin"]).install()
            _plain_step(run["twin_ddp"], run["twin_optimizer"], batch, bf16)
            fired_twin = injection.remove()
            effective = not torch.equal(_weights(run["twin"]), references[spec["batch"]])
            # Named? The guarded model takes it under the guard.
            _restore(run["model"], run["optimizer"], run["state"])
            batches[step] = 1000 + spec["batch"]
            injection = Injection(spec, run["model"]).install()
            alarm = _guarded_step(guard, run["ddp"], run["optimizer"], step, batch, bf16)
            fired = injection.remove()
            rows.append(_row(spec, alarm, effective, fired_twin or fired))
            step += 1
    return {"rows": rows}


def _row(spec: dict[str, Any], alarm: sdc.Alarm | None, effective: bool, fired: bool) -> dict:
    """One trial's outcome (every rank computes the same)."""
    suspects = list(alarm.suspects) if alarm is not None else []
    candidates = [c.to_dict() for c in alarm.sensor_candidates] if alarm is not None else []
    fired_any = torch.tensor([int(fired)])
    dist.all_reduce(fired_any, op=dist.ReduceOp.MAX)
    return {
        "family": spec["family"],
        "spec": spec,
        "fired": bool(fired_any.item()),
        "effective": effective,
        "named": suspects == [spec["rank"]],
        "by_sensor": bool(candidates) and suspects == [spec["rank"]],
        "wrong": bool(set(suspects) - {spec["rank"]}),
        "check": alarm.check if alarm is not None else None,
        "kinds": sorted({c["kind"] for c in candidates}),
    }


# ---------------------------------------------------------------- overhead
def overhead_job(*, steps: int, rounds: int, bf16: bool, attention: str) -> dict[str, Any]:
    """Seconds per step (CPU time of this process, and wall) of the same loop: unguarded (no
    protect), guarded without sensors, at the default budget, at full coverage."""
    torch.manual_seed(0)
    rank = dist.get_rank()
    variants: dict[str, dict[str, Any]] = {}

    def build(kind: str) -> dict[str, Any]:
        model = llama()
        if kind != "unguarded":
            sdc.protect(model, attention=attention)
        ddp = nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
        guard = None
        if kind != "unguarded":
            budget = {"checks": 0.01, "default": 0.01, "full": math.inf}[kind]
            guard = sdc.Guard(
                ddp,
                optimizer,
                compute_loss=lambda m, b: causal_lm_loss(m, b, bf16=bf16),
                rebuild_batch=lambda step, r: tokens(step, r, seed=2),
                schedule=sdc.Schedule(
                    audit_every=0,
                    check_every=0,
                    peer_offset=PEER_OFFSET,
                    sensor_budget=budget,
                    sensors=kind != "checks",
                    check_on_start=False,
                    # The steady state is timed: the start-up burn-in (every sensor, every step)
                    # would make the default budget read as full coverage.
                    sensor_burn_in=0,
                ),
                publisher=_Quiet(),
            )
        return {"ddp": ddp, "optimizer": optimizer, "guard": guard, "step": 0}

    for kind in ("unguarded", "checks", "default", "full"):
        variants[kind] = build(kind)

    def one(v: dict[str, Any]) -> None:
        batch = tokens(v["step"], rank, seed=2)
        if v["guard"] is None:
            _plain_step(v["ddp"], v["optimizer"], batch, bf16)
        else:
            _guarded_step(v["guard"], v["ddp"], v["optimizer"], v["step"], batch, bf16)
        v["step"] += 1

    for v in variants.values():  # warm-up: plans made, sites found, kernels warm
        for _ in range(3):
            one(v)
    timing = {k: {"cpu": 0.0, "wall": 0.0, "steps": 0} for k in variants}
    for _ in range(rounds):
        for kind, v in variants.items():
            dist.barrier()
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(steps):
                one(v)
            dist.barrier()
            timing[kind]["cpu"] += time.process_time() - cpu
            timing[kind]["wall"] += time.perf_counter() - wall
            timing[kind]["steps"] += steps
    plan = variants["default"]["guard"].sensors.plan
    return {
        "timing": timing,
        "period": plan.period if plan is not None else None,
        "estimated_cost": plan.mean_cost if plan is not None else None,
    }


# ---------------------------------------------------------------- the report
def summarise(rows: list[dict[str, Any]], period: int | None) -> dict[str, Any]:
    """Per family and overall: trials, effective, named (of the effective), wrong names."""
    table: dict[str, dict[str, Any]] = {}
    for family in [*FAMILIES, "all"]:
        mine = [r for r in rows if family == "all" or r["family"] == family]
        effective = [r for r in mine if r["effective"]]
        named = sum(r["named"] for r in effective)
        table[family] = {
            "trials": len(mine),
            "fired": sum(r["fired"] for r in mine),
            "effective": len(effective),
            "named": named,
            "by_sensor": sum(r["by_sensor"] for r in effective),
            "share": named / len(effective) if effective else None,
            "share_default": named / len(effective) / period if effective and period else None,
            "wrong": sum(r["wrong"] for r in mine),
            "named_ineffective": sum(r["named"] for r in mine if not r["effective"]),
        }
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=12, help="trials per family and dtype")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the trials")
    parser.add_argument("--dtypes", default="fp32,bf16", help="fp32, bf16 or both")
    parser.add_argument(
        "--families", default="", help="comma-separated op families (default: every family)"
    )
    parser.add_argument("--overhead-steps", type=int, default=20, help="steps per timed round")
    parser.add_argument("--overhead-rounds", type=int, default=3, help="timed rounds")
    parser.add_argument("--json", type=Path, help="write the rows and tables here")
    args = parser.parse_args(argv)
    recorder = Recorder(__file__, argv)
    if args.trials < 1:
        parser.error("--trials must be >= 1")
    families = [f.strip() for f in args.families.split(",") if f.strip()] or list(FAMILIES)
    if set(families) - set(FAMILIES):
        parser.error(f"--families: unknown {sorted(set(families) - set(FAMILIES))}")
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if not dtypes or set(dtypes) - {"fp32", "bf16"}:
        parser.error("--dtypes: fp32, bf16 or fp32,bf16")
    jobs = [
        (
            "campaign:campaign_job",
            {
                "trials": args.trials,
                "bf16": dtype == "bf16",
                "attention": "checked",
                "seed": args.seed,
                "families": families,
            },
        )
        for dtype in dtypes
    ]
    jobs += [
        (
            "campaign:overhead_job",
            {
                "steps": args.overhead_steps,
                "rounds": args.overhead_rounds,
                "bf16": dtype == "bf16",
                "attention": "checked",
            },
        )
        for dtype in dtypes
    ]
    started = time.monotonic()
    results = launch(jobs, world=WORLD, ranks_per_node=PER_NODE, timeout_s=3 * 3600)
    for per_rank in results:
        errors = [r["trace"] for r in per_rank if "error" in r]
        if errors:
            print(errors[0], file=sys.stderr)
            return 1
    report: dict[str, Any] = {"seconds": time.monotonic() - started, "args": vars(args)}
    overheads = results[len(dtypes) :]
    for dtype, per_rank, timed in zip(dtypes, results[: len(dtypes)], overheads, strict=True):
        first = per_rank[0]
        period = timed[0]["period"]  # the default budget's plan, made by the overhead job
        table = summarise(first["rows"], period)
        report[dtype] = {"rows": first["rows"], "table": table, "period": period}
        print(f"\n{dtype}: default budget period {period} steps")
        print(
            f"{'op family':<40}{'trials':>7}{'eff.':>6}{'named':>7}{'share':>8}"
            f"{'@1%':>8}{'wrong':>7}"
        )
        for family, row in table.items():
            share = f"{row['share']:.0%}" if row["share"] is not None else "-"
            default = f"{row['share_default']:.1%}" if row["share_default"] is not None else "-"
            print(
                f"{family:<40}{row['trials']:>7}{row['effective']:>6}{row['named']:>7}"
                f"{share:>8}{default:>8}{row['wrong']:>7}"
            )
    for dtype, per_rank in zip(dtypes, results[len(dtypes) :], strict=True):
        timing = per_rank[0]["timing"]
        base = timing["unguarded"]
        report[f"overhead_{dtype}"] = per_rank[0]
        print(f"\noverhead, {dtype} (rank 0, {base['steps']} steps per variant):")
        for kind, t in timing.items():
            cpu = t["cpu"] / t["steps"] * 1e3
            wall = t["wall"] / t["steps"] * 1e3
            over = (t["cpu"] / base["cpu"] - 1) * 100 if kind != "unguarded" else 0.0
            over_wall = (t["wall"] / base["wall"] - 1) * 100 if kind != "unguarded" else 0.0
            print(
                f"  {kind:<10} cpu {cpu:7.1f} ms/step ({over:+6.1f}%)   "
                f"wall {wall:7.1f} ms/step ({over_wall:+6.1f}%)"
            )
    print(f"\n{report['seconds']:.0f} s")
    if args.json:
        recorder.write(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
