"""Hugging Face Trainer jobs: a Llama built from a config (no download), synthetic token data,
Trainer.train under GuardedTrainer (DDP through the Trainer's own Accelerate)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import sdc_agent as sdc
from tests.agent.frameworks.common import (
    SCHEDULE,
    CountingPublisher,
    UpdateRecord,
    alarm_dict,
    attach,
    quiet_environment,
    report,
    run_docs_example,
    sink_for,
    use_cloudwatch,
)

ACCUMULATION = 2
BATCH = 2
SEQ = 16
VOCAB = 128
WEIGHT = "model.layers.0.mlp.up_proj.weight"
"""The parameter the weight fault flips a bit of (layer 0's MLP up projection)."""


class TokenDataset(torch.utils.data.Dataset):
    """Seeded random token sequences; the labels are the inputs (causal LM)."""

    def __init__(self, size: int = 240) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, VOCAB, (SEQ,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": ids.clone()}


def llama() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config)


def arguments(output_dir: str, steps: int, save_steps: int) -> Any:
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=output_dir,
        use_cpu=True,
        ddp_backend="gloo",
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=ACCUMULATION,
        max_steps=steps,
        learning_rate=1e-3,
        max_grad_norm=1.0,
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        logging_steps=5,
        report_to=[],
        disable_tqdm=True,
        seed=0,
    )


def train(
    *,
    steps: int,
    run_dir: str,
    faults: tuple[str, ...] = (),
    ckpt_every: int = 0,
    resume: bool = False,
    publish: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Trainer.train for ``steps`` steps under GuardedTrainer; ``faults``: "forward" x1000 on
    layer 0's MLP output of rank R from step 7, "weight" a bit flip on rank 0 after step 6;
    ``ckpt_every``: ``save_steps`` (checkpoints in ``run_dir``); ``resume``: from the newest checkpoint first
    (refused when an alarm covers it), then from the one clean_checkpoint chooses; ``publish``:
    CloudWatch (moto) instead of counting."""
    from transformers import TrainerCallback

    from sdc_agent.integrations import AlarmStop, read_tags
    from sdc_agent.integrations.transformers import GuardedTrainer, clean_checkpoint

    quiet_environment()
    counting = CountingPublisher()
    sink = sink_for(publish, counting)
    on_alarm_calls: list[int] = []
    observed: dict[str, Any] = {}

    def trainer_for() -> GuardedTrainer:
        trainer = GuardedTrainer(
            model=llama(),
            args=arguments(run_dir, steps, ckpt_every),
            train_dataset=TokenDataset(),
            schedule=sdc.Schedule(**SCHEDULE),
            publisher=sink,
            alarm_dir=run_dir,
            on_alarm=lambda alarm: on_alarm_calls.append(alarm.step),
        )

        class Observe(TrainerCallback):
            """Attaches the faults and the update record once the guard exists."""

            def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                guard = trainer.sdc_guard
                layer = guard.module.model.layers[0].mlp
                attach(guard, faults, forward=layer.down_proj, weight=WEIGHT)
                observed["record"] = UpdateRecord(guard.optimizer, guard.params).counting(
                    lambda: trainer.state.global_step
                )
                observed["start"] = trainer.state.global_step

        trainer.add_callback(Observe())  # after the guard's callback: the guard exists
        observed["trainer"] = trainer
        return trainer

    refused = stopped = None
    try:
        checkpoint = None
        if resume:
            newest = max(Path(run_dir).glob("checkpoint-*"), key=lambda p: int(p.name[11:]))
            try:
                trainer_for().train(resume_from_checkpoint=str(newest))
            except sdc.UnsafeResumeError as err:
                refused = f"{newest.name}: {err}"
            checkpoint = clean_checkpoint(run_dir, run_dir)
        trainer_for().train(resume_from_checkpoint=checkpoint)
    except AlarmStop as err:
        stopped = err.alarm
    trainer = observed["trainer"]
    saved = sorted(int(p.name[11:]) - 1 for p in Path(run_dir).glob("checkpoint-*"))
    return report(
        alarm=stopped or trainer.sdc_alarm,
        record=observed["record"],
        optimizers=[trainer.sdc_guard.optimizer],
        framework_step=trainer.state.global_step,
        counting=counting,
        sink=sink,
        on_alarm_calls=on_alarm_calls,
        refused=refused,
        start=observed.get("start"),
        saved=saved,
        tags={s: read_tags(Path(run_dir, f"checkpoint-{s + 1}")) for s in saved},
    )


def docs_example(*, steps: int, run_dir: str, publish: dict[str, str]) -> dict[str, Any]:
    """docs/integrations.md's Trainer example, as written, for ``steps`` steps."""
    quiet_environment()
    use_cloudwatch(**publish)
    namespace = run_docs_example(
        "transformers",
        {"model": llama(), "args": arguments(run_dir, steps, 0), "dataset": TokenDataset()},
    )
    trainer = namespace["trainer"]
    return {
        "alarm": alarm_dict(trainer.sdc_alarm),
        "steps_applied": trainer.state.global_step,
        "last_audit_pass": trainer.sdc_guard.last_audit_pass,
        "delivered": trainer.sdc_guard.flush(30.0),
    }
