"""sdc_agent.integrations without processes: the import stays free of frameworks, the shared
pieces (AlarmStop, tags, the accumulation setting), what each integration refuses before
anything trains, the Trainer's rebuildable sampler and the clean-checkpoint helpers.

The 6-process runs of each framework are tests/agent/test_integration_*.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import sdc_agent as sdc
from sdc_agent.integrations import TAGS_FILE, AlarmStop, read_tags, write_tags
from sdc_agent.integrations.hooks import check_on_alarm, stop, with_accumulation
from sdc_agent.recovery import write_alarm_record

FRAMEWORKS = ("accelerate", "lightning", "pytorch_lightning", "transformers", "torchtitan")


def test_importing_the_agent_and_the_integrations_imports_no_framework():
    # Given a fresh interpreter
    code = (
        "import sys, json, sdc_agent, sdc_agent.integrations; "
        f"print(json.dumps([m for m in {FRAMEWORKS!r} if m in sys.modules]))"
    )
    # When it imports sdc_agent and sdc_agent.integrations
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # Then none of the frameworks was imported
    assert json.loads(out.stdout) == []


def alarm(step: int = 10) -> sdc.Alarm:
    return sdc.Alarm(step=step, check="compute", culprits=[3], suspects=[3])


def test_stop_calls_on_alarm_then_raises_alarm_stop_with_the_alarm():
    seen = []
    with pytest.raises(AlarmStop, match="step 10") as raised:
        stop(alarm(), seen.append)
    assert raised.value.alarm.step == 10 and [a.step for a in seen] == [10]
    with pytest.raises(AlarmStop):
        stop(alarm(), None)  # None: only raise


def test_on_alarm_must_be_callable():
    with pytest.raises(TypeError, match="on_alarm must be a callable"):
        check_on_alarm("exit")


def test_tags_round_trip_and_bad_tags_are_named(tmp_path):
    tags = {"step": 9, "weights_verified": True, "weights_digest": "ab"}
    write_tags(tmp_path / "ckpt", tags)
    assert read_tags(tmp_path / "ckpt") == tags
    assert read_tags(tmp_path / "none") is None
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / TAGS_FILE).write_text('{"step": "nine"}')
    with pytest.raises(ValueError, match="no integer 'step'"):
        read_tags(tmp_path / "bad")


def test_the_framework_sets_the_accumulation_and_a_different_one_is_refused():
    assert with_accumulation(None, 4, "x.steps").grad_accum == 4
    assert with_accumulation(sdc.Schedule(audit_every=7), 2, "x.steps").audit_every == 7
    with pytest.raises(ValueError, match=r"Schedule.grad_accum=3 but x.steps=2"):
        with_accumulation(sdc.Schedule(grad_accum=3), 2, "x.steps")
    with pytest.raises(TypeError, match=r"sdc_agent\.Schedule"):
        with_accumulation({"grad_accum": 2}, 2, "x.steps")


# ---------------------------------------------------------------------------- Lightning
def lightning_setup(strategy: object, automatic: bool = True) -> None:
    from sdc_agent.integrations.lightning import SDCGuardCallback

    callback = SDCGuardCallback(rebuild_batch=lambda s, r: None, on_alarm=None)
    module = SimpleNamespace(automatic_optimization=automatic)
    callback.setup(SimpleNamespace(strategy=strategy), module, "fit")


def test_lightning_refuses_fsdp1_deepspeed_and_manual_optimization():
    from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy

    with pytest.raises(ValueError, match=r"FSDP1.*ModelParallelStrategy"):
        lightning_setup(FSDPStrategy.__new__(FSDPStrategy))
    with pytest.raises(ValueError, match="DeepSpeedStrategy is not supported"):
        lightning_setup(DeepSpeedStrategy.__new__(DeepSpeedStrategy))
    with pytest.raises(ValueError, match="manual optimization"):
        lightning_setup(DDPStrategy.__new__(DDPStrategy), automatic=False)
    lightning_setup(DDPStrategy.__new__(DDPStrategy))  # accepted


# ---------------------------------------------------------------------------- Accelerate
def test_accelerate_refuses_deepspeed_fsdp1_and_an_unprepared_model():
    from accelerate.utils import DistributedType

    from sdc_agent.integrations.accelerate import AcceleratorGuard

    def build(kind, plugin=None, prepared=True):
        accelerator = SimpleNamespace(
            distributed_type=kind, state=SimpleNamespace(fsdp_plugin=plugin)
        )
        model = SimpleNamespace(_is_accelerate_prepared=prepared)
        AcceleratorGuard(accelerator, model, None, compute_loss=None, rebuild_batch=None)

    with pytest.raises(ValueError, match="DEEPSPEED is not supported"):
        build(DistributedType.DEEPSPEED)
    with pytest.raises(ValueError, match=r"FSDP1.*fsdp_version=2"):
        build(DistributedType.FSDP, SimpleNamespace(fsdp_version=1))
    with pytest.raises(ValueError, match=r"accelerator\.prepare"):
        build(DistributedType.MULTI_CPU, prepared=False)


# ---------------------------------------------------------------------------- Trainer
def test_the_trainer_sampler_is_a_pure_function_of_step_and_rank():
    from sdc_agent.integrations.transformers import RankBatchSampler

    def sampler(rank: int) -> RankBatchSampler:
        return RankBatchSampler(
            50, batch=2, world=3, rank=rank, accumulation=2, seed=7, shuffle=True
        )

    # Given 50 samples, 3 ranks, 2 micro-batches of 2 per step: 4 whole steps, 2 left over
    assert sampler(0).steps_per_epoch == 4 and len(sampler(0)) == 8
    for epoch in (0, 1):
        iterated = {}
        for rank in range(3):
            s = sampler(rank)
            s.set_epoch(epoch)
            iterated[rank] = list(s)
        # Then any rank rebuilds any rank's micro-batches of any step from (step, rank)
        for step in range(4):
            for rank in range(3):
                rebuilt = sampler(0).indices(epoch * 4 + step, rank)
                assert rebuilt == iterated[rank][2 * step : 2 * step + 2]
        # And within an epoch no sample is used twice
        used = [i for batches in iterated.values() for b in batches for i in b]
        assert len(used) == len(set(used)) == 48
    with pytest.raises(ValueError, match="no whole step"):
        RankBatchSampler(5, batch=2, world=3, rank=0, accumulation=1, seed=0, shuffle=False)


# ---------------------------------------------------------------------------- resume helpers
def record(alarm_dir: Path, step: int, window: list[int]) -> None:
    report = {
        **alarm(step).to_dict(),
        "suspect_window": window,
        "last_audit_pass": window[0],
    }
    write_alarm_record(alarm_dir, report, writer_rank=0)


def test_transformers_clean_checkpoint_skips_the_covered_folders(tmp_path):
    from sdc_agent.integrations.transformers import clean_checkpoint

    assert clean_checkpoint(tmp_path / "nothing-yet", tmp_path / "nothing-yet") is None
    for n in (5, 10):
        (tmp_path / f"checkpoint-{n}").mkdir()
    assert clean_checkpoint(tmp_path, tmp_path) == str(tmp_path / "checkpoint-10")
    # Given an alarm of step 10 with window [5, 10]: checkpoint-10 (weights after step 9) is
    # covered
    record(tmp_path, 10, [5, 10])
    assert clean_checkpoint(tmp_path, tmp_path) == str(tmp_path / "checkpoint-5")


def test_lightning_clean_checkpoint_reads_model_checkpoint_names(tmp_path):
    from sdc_agent.integrations.lightning import clean_checkpoint

    for name in ("epoch=0-step=5.ckpt", "epoch=1-step=10.ckpt", "last.ckpt"):
        (tmp_path / name).write_text("")
    record(tmp_path, 10, [5, 10])
    assert clean_checkpoint(tmp_path, tmp_path) == tmp_path / "epoch=0-step=5.ckpt"
