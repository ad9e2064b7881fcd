"""Where a canary run stopped: the canary alarm's action.

The canary alarm fires when no ``canary_completed`` arrived in its window. It notifies the topic
and invokes the canary function again (``check``), which reads the newest run, observes what the
run cannot record itself (did the canary alarm fire? did the rule start an execution?), and
publishes which step the canary stopped at.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ... import clock
from ...clients import cloudwatch, sns, stepfunctions
from ...config import Settings
from ...dal.canary_runs import RunStore
from ...models.canary import HINTS, STEP_NAMES, STEPS, Run
from ...observability import logger
from ..notify import subject_prefix


@dataclass(frozen=True)
class Stop:
    """Where a canary run stopped: the first step it did not reach, and why that matters."""

    run_id: str | None
    step: str
    last_reached: str | None
    error: str | None = None

    def sentence(self) -> str:
        """One line for the on-call."""
        what = dict(STEPS)[self.step]
        hint = HINTS.get(self.step, "see the canary execution's history and its step's logs")
        run = f"canary run {self.run_id}" if self.run_id else "the canary"
        text = (
            f"{run} stopped at step '{self.step}' (never: {what}); last step reached: "
            f"{self.last_reached or 'none'}. {hint}"
        )
        if self.error:
            text += f" Error recorded: {self.error}"
        return text


def stopped_at(run: Run | None, *, alarm_fired: bool, execution_started: bool) -> Stop:
    """The step after the furthest one the run reached (recorded, or observed: the alarm and
    the execution leave no record of their own). A run that completed, or none at all, means no
    new run was started: stopped at ``scheduled``."""
    if run is None or run.completed:
        return Stop(run_id=None, step="scheduled", last_reached=run.run_id if run else None)
    reached = set(run.reached)
    if alarm_fired:
        reached.add("alarm")
    if execution_started:
        reached.add("workflow")
    furthest = max((STEP_NAMES.index(s) for s in reached if s in STEP_NAMES), default=-1)
    step = STEP_NAMES[min(furthest + 1, len(STEP_NAMES) - 1)]
    return Stop(
        run_id=run.run_id,
        step=step,
        last_reached=STEP_NAMES[furthest] if furthest >= 0 else None,
        error=run.error,
    )


def check(settings: Settings) -> Stop:
    """The canary alarm's action: find where the newest run stopped, write it on the run, and
    publish it to the topic."""
    store = RunStore(settings.ledger_table, settings.hyperpod_cluster_name)
    run = store.latest()
    fired = started = False
    if run is not None and not run.completed:
        since = clock.parse_iso(run.started_at)
        # An ALARM entered since the run started, or a change back to OK since then (which only
        # follows an ALARM of this run).
        fired = cloudwatch.changed_since(settings.canary_alarm_name, since, ("ALARM", "OK"))
        arn = settings.state_machine_arn
        started = arn is not None and stepfunctions.started_since(arn, since)
    stop = stopped_at(run, alarm_fired=fired, execution_started=started)
    if stop.run_id is not None:
        store.mark_stopped(stop.run_id, stop.step)
    subject = f"{subject_prefix(False)} canary stopped at {stop.step}"
    body = json.dumps(
        {
            "summary": stop.sentence(),
            "cluster": settings.hyperpod_cluster_name,
            "run": stop.run_id,
            "stopped_at": stop.step,
            "last_reached": stop.last_reached,
            "steps": run.steps if run else [],
        },
        indent=2,
    )
    sns.publish(settings.topic_arn, subject[:100], body)
    logger.warning("canary stopped", extra={"run": stop.run_id, "step": stop.step})
    return stop


__all__ = ["Stop", "check", "stopped_at"]
