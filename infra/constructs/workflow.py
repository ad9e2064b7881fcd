"""The remediation workflow (docs/architecture.md, "The workflow"): a Standard state machine of Lambda steps.

    Localize -> refused claims? RecordRefused -> any suspects or pending nodes? -> in parallel:
        Map over suspects:
            Admit -> Cordon -> StartHealthCheck -> (Wait -> PollHealthCheck)*
                  -> Screen -> (Wait -> Screen)* (the node screen; its failure goes on)
                  -> RequestApproval -> Replace | Uncordon (rejected with release) | stay cordoned
            Admit (shadow: the check x verdict is not enforced) -> RecordShadow, nothing touched
                  (with `shadowHealthCheck` and room in the shadow guard: the deep health check
                  first, on the uncordoned node)
        Map over pending nodes (a series, no visible report yet):
            LocalizeLate (retried while ReportNotYetVisible) -> the same chain, states "Late..."
    The two Maps run side by side: a node whose report is late never holds the others up.

Contracts this file keeps (docs/CONTRACT.md):
- Each Map item's state starts as {alarm, suspect, execution}; each step's result is added under
  its own key ($.admission, $.cordon, $.health, $.screen, $.approval, $.replacement,
  $.uncordon).
- Retry/Catch match the exception class names the Lambdas raise. Transient ones are retried with
  backoff; anything else is caught, recorded as `failed` with a notification, and the item ends
  where it is: the workflow never uncordons or replaces on an error path.
- An item ends alone, whatever happens in it: no Fail state inside a Map (one would stop every
  sibling, one waiting for approval too). An item whose failure cannot even be recorded answers
  ITEM_UNRECORDED; once all items ended, the execution records that at the alarm's level and
  ends FAILED, and the sweeper closes the item's open remediation as abandoned.
- Plain JSONPath ASL (lambda:invoke, Wait, Choice, Map, Parallel, Pass, Succeed, Fail; one
  intrinsic, States.ArrayContains) so the end-to-end tests can
  run the synthesized definition on moto's executor.

A `lambda:invoke` task returns {Payload, StatusCode, ...}; JSONPath cannot put just the Payload at
a ResultPath in one state, so every step task is followed by a Pass that moves
`$.<key>.Payload` up to `$.<key>`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from infra import nag
from infra.constructs.approval import request_approval_task
from infra.grants import allow
from sdc_contract.errors import (
    REPORT_NOT_YET_VISIBLE,
    TERMINAL_ERROR_NAMES,
    TRANSIENT_ERROR_NAMES,
)

# ---- the error contract (sdc_contract.errors) -------------------------------------
TRANSIENT_ERRORS: tuple[str, ...] = (
    *TRANSIENT_ERROR_NAMES,
    # Throttling of our own functions (account concurrency under a storm).
    "Lambda.TooManyRequestsException",
)
"""Retried with exponential, fully jittered backoff (ReportNotYetVisible: without jitter, see
REPORT_WAIT_SECONDS)."""

LAMBDA_SERVICE_ERRORS: tuple[str, ...] = (
    "Lambda.ClientExecutionTimeoutException",
    "Lambda.ServiceException",
    "Lambda.AWSLambdaException",
    "Lambda.SdkClientException",
)
"""What CDK's LambdaInvoke would retry by itself (without jitter); retried by `_retry_transient`
instead, with the same jittered backoff (`retry_on_service_exceptions=False` on every task)."""

TERMINAL_ERRORS: tuple[str, ...] = TERMINAL_ERROR_NAMES
"""Never retried: caught, recorded as `failed`, humans notified."""

# 5 s doubling to 6 attempts: up to about 5 minutes, enough for a Kubernetes API server restart,
# short next to a training job's hour.
RETRY_INTERVAL = cdk.Duration.seconds(5)
RETRY_MAX_ATTEMPTS = 6
RETRY_BACKOFF_RATE = 2.0
# Full jitter: the items of one storm that lost the guard's transaction race retry at random
# times within the backoff instead of all together again.
RETRY_JITTER = sfn.JitterType.FULL

# The wait for a report CloudWatch Logs does not show yet (ReportNotYetVisible) is a wait, not
# a race: retried without jitter, so its length is exact. 5 s doubling, 6 retries:
# 5 + 10 + 20 + 40 + 80 + 160 = 315 s after the first look, never less (full jitter would make
# "about 5 minutes" anything down to ~0 s). Log ingestion is usually visible within seconds.
REPORT_WAIT_INTERVAL = cdk.Duration.seconds(5)
REPORT_WAIT_MAX_ATTEMPTS = 6
REPORT_WAIT_BACKOFF_RATE = 2.0
REPORT_WAIT_SECONDS = sum(
    REPORT_WAIT_INTERVAL.to_seconds() * REPORT_WAIT_BACKOFF_RATE**attempt
    for attempt in range(REPORT_WAIT_MAX_ATTEMPTS)
)
"""The total of the report-visibility retries' waits: the floor and the ceiling of the wait."""

MAP_MAX_CONCURRENCY = 10
"""Suspects of one alarm remediated at once. The guard admits few nodes anyway (its transaction
serialises the admissions); this bounds the Lambda concurrency a 64-node alarm can cause."""

ITEM_RECORDED = "recorded"
"""What a Map item answers when its outcome is in the ledger (whatever the outcome)."""
ITEM_UNRECORDED = "unrecorded"
"""What a Map item answers when recording its failure failed too: it ends alone, the others go
on, and the execution ends FAILED once they have."""

ERROR_PATH = "$.error"
"""Where a Catch puts {Error, Cause}; the record step reads it."""

REFUSAL_ERROR_PATH = "$.refusal_error"
"""Where RecordRefused's failure waits while the suspects are handled (never $.error: the
items' record steps would take it for their own)."""


def state_machine_arn(scope: Construct, state_machine_name: str) -> str:
    """The ARN the state machine named `state_machine_name` will have, known before it exists.

    The functions name it in their environment and their grants, and the state machine depends
    on the functions: its `Ref` there would be a dependency cycle.
    """
    return cdk.Stack.of(scope).format_arn(
        service="states",
        resource="stateMachine",
        resource_name=state_machine_name,
        arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
    )


def log_group_name(state_machine_name: str) -> str:
    """The state machine's log group: the /aws/vendedlogs/ prefix keeps the account's CloudWatch
    Logs resource policy small (AWS guidance for Step Functions logging); the stack's log key
    names it (infra/constructs/encryption.py)."""
    return f"/aws/vendedlogs/states/{state_machine_name}"


class Workflow(Construct):
    """The state machine and its log group, and every grant on the state machine.

    `functions` maps the docs/CONTRACT.md folder names to the functions that implement them.
    The grants name the state machine by its ARN (`state_machine_arn`), never by reference.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        functions: Mapping[str, lambda_.IFunction],
        state_machine_name: str,
        approval_timeout: cdk.Duration,
        health_check_poll: cdk.Duration,
        execution_timeout: cdk.Duration,
        log_retention: logs.RetentionDays,
        logs_key: kms.IKey | None = None,
        shadow_health_check: bool = False,
    ) -> None:
        super().__init__(scope, construct_id)
        self._functions = functions
        self.arn = state_machine_arn(self, state_machine_name)
        self.executions_arn = cdk.Stack.of(self).format_arn(
            service="states",
            resource="execution",
            resource_name=f"{state_machine_name}:*",
            arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
        )
        self._shadow_health_check = shadow_health_check
        self._unrecorded: list[sfn.State] = []
        """The items' ends for a failure that could not be recorded (`_item_failed`)."""

        self._approval_timeout = approval_timeout
        self._health_check_poll = health_check_poll
        definition = self._definition()
        self.log_group = logs.LogGroup(
            self,
            "Logs",
            log_group_name=log_group_name(state_machine_name),
            retention=log_retention,
            encryption_key=logs_key,
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )
        self.state_machine = sfn.StateMachine(
            self,
            "StateMachine",
            state_machine_name=state_machine_name,
            state_machine_type=sfn.StateMachineType.STANDARD,
            definition_body=sfn.DefinitionBody.from_chainable(definition),
            timeout=execution_timeout,
            tracing_enabled=True,
            logs=sfn.LogOptions(
                destination=self.log_group,
                level=sfn.LogLevel.ALL,
                # Every transition is logged, without payloads: RequestApproval's input holds
                # the task token, and whoever reads the logs must not be able to approve. The
                # payloads stay in the execution history (states:GetExecutionHistory).
                include_execution_data=False,
            ),
            comment="sdc-guard: localize, admit, cordon, health-check, approve and replace suspect GPU nodes",
        )
        role = self.state_machine.role
        nag.acknowledge(
            role,
            nag.ANY_RESOURCE,
            "X-Ray tracing and CloudWatch Logs delivery (logs:*LogDelivery*, DescribeResourcePolicies, "
            "DescribeLogGroups) have no resource-level permissions; CDK grants exactly those",
        )
        for function in functions.values():
            nag.acknowledge(
                role,
                nag.wildcard_resource_finding(self, f"{function.function_arn}:*"),
                "lambda:InvokeFunction on this step's function and its versions/aliases (`:*`), as "
                "LambdaInvoke grants; no other function",
            )

    # ---- grants ------------------------------------------------------------------------------
    def grant_send_decision(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Resume an execution waiting for approval with a person's decision (approve: the only
        role that sends task results unless autoApprove is on)."""
        return allow(
            grantee, sid="SendDecision", actions=["states:SendTaskSuccess"], resources=[self.arn]
        )

    def grant_auto_approve(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Resume an execution with the auto-approval policy's decision (request_approval, only
        with `autoApprove` on)."""
        return allow(
            grantee, sid="AutoApprove", actions=["states:SendTaskSuccess"], resources=[self.arn]
        )

    def grant_list_executions(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """List this state machine's executions, nothing of their content (the canary, to find
        the execution its run started)."""
        return allow(
            grantee,
            sid="CanaryExecutions",
            actions=["states:ListExecutions"],
            resources=[self.arn],
        )

    def grant_start_backstop(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Start this state machine for a report no remediation took up (the sweeper's
        backstop: the same workflow as an alarm, for a report a flood crowded out)."""
        return allow(
            grantee,
            sid="StartWorkflowForUntakenReports",
            actions=["states:StartExecution"],
            resources=[self.arn],
        )

    def grant_describe_executions(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Read whether an execution still runs (the sweeper)."""
        return allow(
            grantee,
            sid="DescribeWorkflowExecutions",
            actions=["states:DescribeExecution"],
            resources=[self.executions_arn],
            wildcard_reason=(
                "DescribeExecution (read only) on the executions of this stack's state machine; "
                "execution names are made at run time"
            ),
        )

    # ---- building blocks -----------------------------------------------------------------------

    def _step(self, name: str, folder: str, result_key: str) -> tuple[tasks.LambdaInvoke, sfn.Pass]:
        """A step task that passes the whole state and stores the step's result at `$.<key>`.

        Returns (task, unwrap); chain from `unwrap`, attach Catch to `task`.
        """
        task = tasks.LambdaInvoke(
            self,
            name,
            lambda_function=self._functions[folder],
            payload=sfn.TaskInput.from_json_path_at("$"),
            result_selector={"Payload": sfn.JsonPath.object_at("$.Payload")},
            result_path=f"$.{result_key}",
            retry_on_service_exceptions=False,
        )
        _retry_transient(task)
        unwrap = sfn.Pass(
            self,
            f"{name}Result",
            input_path=f"$.{result_key}.Payload",
            result_path=f"$.{result_key}",
        )
        task.next(unwrap)
        return task, unwrap

    def _record(
        self, name: str, transition: str, *, notify: bool, with_error: bool = False
    ) -> tasks.LambdaInvoke:
        """A Record task: {transition, notify, state: <the whole state>, error?}; result dropped."""
        payload: dict[str, object] = {
            "transition": transition,
            "notify": notify,
            "state": sfn.JsonPath.object_at("$"),
            # What the execution itself knows: the recorder closes this execution's own
            # remediation by it even when the state lost a step's output.
            "execution": sfn.JsonPath.string_at("$$.Execution.Id"),
        }
        if with_error:
            payload["error"] = sfn.JsonPath.object_at(ERROR_PATH)
        task = tasks.LambdaInvoke(
            self,
            name,
            lambda_function=self._functions["record"],
            payload=sfn.TaskInput.from_object(payload),
            result_path=sfn.JsonPath.DISCARD,
            retry_on_service_exceptions=False,
        )
        _retry_transient(task)
        return task

    def _unexpected(self, name: str, cause: str) -> sfn.Pass:
        """A Choice's default: describe the surprise as an error so it is recorded as failed."""
        return sfn.Pass(
            self,
            name,
            result=sfn.Result.from_object({"Error": "UnexpectedStepResult", "Cause": cause}),
            result_path=ERROR_PATH,
        )

    def _health_check_loop(
        self,
        name: Callable[[str], str],
        label: str,
        step: Callable[[str, str, str], tuple[tasks.LambdaInvoke, sfn.Pass]],
        record_failed: sfn.IChainable,
    ) -> tuple[tasks.LambdaInvoke, sfn.Pass, sfn.Wait]:
        """The deep health check's start and poll loop, as both the enforced and the shadowed
        path run it: StartHealthCheck, then (a status came back) WaitForHealthCheck ->
        PollHealthCheck. Each state is ``label`` + its name (``Shadow`` on the shadow path),
        with the Map's prefix: ``step`` adds it to its tasks, ``name`` to the other states.
        Returns (start, polled, wait): the caller chains ``polled`` into its own verdict
        Choice, opened with ``_health_status_choice``."""
        start, started = step(f"{label}StartHealthCheck", "start_health_check", "health")
        poll, polled = step(f"{label}PollHealthCheck", "poll_health_check", "health")
        wait = sfn.Wait(
            self,
            name(f"{label}WaitForHealthCheck"),
            time=sfn.WaitTime.duration(self._health_check_poll),
        )
        started.next(
            sfn.Choice(self, name(f"{label}HealthCheckStarted"))
            .when(sfn.Condition.is_present("$.health.status"), wait)
            .otherwise(
                self._unexpected(
                    name(f"{label}NoStartStatus"), "start_health_check returned no status"
                ).next(record_failed)
            )
        )
        wait.next(poll)
        return start, polled, wait

    def _health_status_choice(
        self, name: Callable[[str], str], label: str, wait: sfn.Wait, record_failed: sfn.IChainable
    ) -> sfn.Choice:
        """The poll's verdict Choice, with what both paths do first: no status is unexpected,
        ``in_progress`` polls again; the caller adds the verdicts."""
        return (
            sfn.Choice(self, name(f"{label}HealthCheckStatus"))
            .when(
                sfn.Condition.is_not_present("$.health.status"),
                self._unexpected(
                    name(f"{label}NoHealthStatus"), "poll_health_check returned no status"
                ).next(record_failed),
            )
            .when(sfn.Condition.string_equals("$.health.status", "in_progress"), wait)
        )

    # ---- the definition ------------------------------------------------------------------------

    def _definition(self) -> sfn.IChainable:
        execution_failed = sfn.Fail(
            self,
            "RemediationFailed",
            error="RemediationFailed",
            cause="A step failed; the failure is in the ledger and was notified. No node was uncordoned or replaced.",
        )
        record_failed = self._record("RecordFailed", "failed", notify=True, with_error=True)
        record_failed.add_catch(execution_failed, errors=[sfn.Errors.ALL], result_path=ERROR_PATH)
        record_failed.next(execution_failed)

        localize = tasks.LambdaInvoke(
            self,
            "Localize",
            lambda_function=self._functions["localize"],
            payload=sfn.TaskInput.from_json_path_at("$"),
            # The state becomes {alarm, suspects, pending, suspect_count, refused, ambiguous,
            # reports}.
            output_path="$.Payload",
            retry_on_service_exceptions=False,
        )
        _retry_transient(localize)
        _catch_terminal(localize, record_failed)

        # Each item's outcome is in the ledger and in the execution history; the Maps keep only
        # whether an item's failure went unrecorded (`_map`, `_item`).
        remediate = self._map(
            "RemediateSuspects",
            "suspect",
            "$.suspects",
            "One remediation per suspect node, independent of the others",
        )
        remediate.item_processor(self._item(self._remediate_one("")))
        late = self._map(
            "RemediateLateNodes",
            "pending",
            "$.pending",
            "A node with a series but no visible report yet: its report is looked for again "
            "(retried as localize is), then it is remediated like any suspect",
        )
        late.item_processor(self._item(self._late_node(), "Late"))
        both = sfn.Parallel(
            self,
            "RemediateInParallel",
            # Each branch (a Map) answers {unrecorded: whether one of its items' outcomes is
            # not in the ledger}; the Parallel keeps whether either does. (Written out: CDK's
            # intrinsic helpers take no boolean literal. `$[*]` rather than `$[0]`/`$[1]`,
            # which moto's executor reads as one-element lists.)
            result_selector={"unrecorded.$": "States.ArrayContains($[*].unrecorded, true)"},
            result_path="$.items",
            comment="The suspects and the late nodes side by side: neither waits for the other",
        )
        both.branch(remediate)
        both.branch(late)
        both.add_catch(record_failed, errors=[sfn.Errors.ALL], result_path=ERROR_PATH)
        # An item whose failure could not be recorded ended alone (its siblings went on); once
        # they all have, the execution records the loss once more at the alarm's level and
        # ends FAILED (the item's remediation stays open, so the sweeper closes it as
        # abandoned and notifies: the node stays cordoned).
        # A refusal notice that could not be recorded did not hold the suspects up
        # (RefusalUnrecorded); it ends the execution recorded as failed once they are handled.
        refusal_unrecorded = sfn.Pass(
            self,
            "RefusalNoticeFailed",
            input_path=REFUSAL_ERROR_PATH,
            result_path=ERROR_PATH,
        ).next(record_failed)
        both.next(
            sfn.Choice(self, "AnyItemUnrecorded")
            .when(sfn.Condition.is_present(REFUSAL_ERROR_PATH), refusal_unrecorded)
            .when(
                sfn.Condition.boolean_equals("$.items.unrecorded", True),
                sfn.Pass(
                    self,
                    "ItemsUnrecorded",
                    result=sfn.Result.from_object(
                        {
                            "Error": "ItemFailureUnrecorded",
                            "Cause": "An item's failure could not be recorded; that item ended "
                            "where it was (the node left as it was) and the other items went on. "
                            "The sweeper closes its remediation as abandoned.",
                        }
                    ),
                    result_path=ERROR_PATH,
                ).next(record_failed),
            )
            .otherwise(sfn.Succeed(self, "Remediated"))
        )

        record_ambiguous = self._record("RecordAmbiguous", "ambiguous", notify=True)
        record_no_suspects = self._record("RecordNoSuspects", "no_suspects", notify=True)
        record_refused = self._record("RecordRefused", "refused", notify=True)
        for task in (record_ambiguous, record_no_suspects):
            _catch_terminal(task, record_failed)
        # The refusal notice must never block the corroborated suspects: its failure is kept
        # apart (not at $.error, which the items' record steps read) and the suspects go on.
        # The failure is recorded once they are handled (RefusalNoticeFailed).
        refusal_failed = sfn.Pass(
            self,
            "RefusalUnrecorded",
            comment="Recording or notifying the refusals failed; the suspects are handled anyway",
            input_path=ERROR_PATH,
            result_path=REFUSAL_ERROR_PATH,
        )
        _catch_terminal(record_refused, refusal_failed)
        refused_only = sfn.Succeed(
            self,
            "NothingElse",
            comment="Every claim of the alarm was refused; the refusals are recorded and notified",
        )
        suspects = (
            sfn.Choice(self, "AnySuspects")
            .when(sfn.Condition.boolean_equals("$.ambiguous", True), record_ambiguous)
            .when(
                sfn.Condition.or_(
                    sfn.Condition.is_present("$.suspects[0]"),
                    sfn.Condition.is_present("$.pending[0]"),
                ),
                both,
            )
            .when(
                sfn.Condition.and_(
                    sfn.Condition.is_present("$.refused[0]"),
                    sfn.Condition.is_present(REFUSAL_ERROR_PATH),
                ),
                refusal_unrecorded,
            )
            .when(sfn.Condition.is_present("$.refused[0]"), refused_only)
            .otherwise(record_no_suspects)
        )
        refusals = (
            sfn.Choice(self, "AnyRefused")
            # A Choice on a missing path is a States.Runtime error no Catch sees: every path
            # the definition reads is checked for presence first.
            .when(
                sfn.Condition.or_(
                    sfn.Condition.is_not_present("$.ambiguous"),
                    sfn.Condition.is_not_present("$.alarm"),
                    sfn.Condition.is_not_present("$.suspect_count"),
                ),
                self._unexpected(
                    "UnknownLocalization", "localize returned no ambiguous/alarm/suspect_count"
                ).next(record_failed),
            )
            .when(sfn.Condition.is_present("$.refused[0]"), record_refused)
            .otherwise(suspects)
        )
        record_refused.next(suspects)
        refusal_failed.next(suspects)
        return localize.next(refusals)

    def _map(self, construct_id: str, key: str, items_path: str, comment: str) -> sfn.Map:
        """A Map over localize's ``items_path``, each item's state starting as {alarm, <key>:
        the item, execution, item, suspects_in_alarm}."""
        return sfn.Map(
            self,
            construct_id,
            items_path=items_path,
            item_selector={
                "alarm": sfn.JsonPath.object_at("$.alarm"),
                key: sfn.JsonPath.object_at("$$.Map.Item.Value"),
                "execution": sfn.JsonPath.string_at("$$.Execution.Id"),
                # With the execution id, what keys this remediation whatever the steps return
                # (one admission per instance per alarm; closing a remediation on any path).
                "item": sfn.JsonPath.number_at("$$.Map.Item.Index"),
                # admit refuses a whole alarm that names more nodes than the blast radius
                # allows: the alarm's nodes, all of them.
                "suspects_in_alarm": sfn.JsonPath.number_at("$.suspect_count"),
            },
            # Each item answers only whether its outcome is recorded (`_item`): the items'
            # whole states, 64 of them beside localize's output, would pass Step Functions'
            # 256 KiB (States.DataLimitExceeded cannot be caught). The Map answers only
            # whether one of them is ITEM_UNRECORDED.
            result_selector={
                "unrecorded": sfn.JsonPath.array_contains(
                    sfn.JsonPath.object_at("$"), ITEM_UNRECORDED
                )
            },
            result_path="$.items",
            output_path="$.items",
            max_concurrency=MAP_MAX_CONCURRENCY,
            comment=comment,
        )

    def _item(self, start: sfn.State, prefix: str = "") -> sfn.State:
        """End every path of a Map item in one of two Pass states, so that one item never stops
        its siblings: `<prefix>ItemDone` (ITEM_RECORDED: the item's outcome is in the ledger) or
        a `..Failed` Pass of `_item_failed` (ITEM_UNRECORDED: recording its failure failed too). A Fail
        state in an inline Map fails the whole Map, and the siblings with it (one waiting for
        approval would be abandoned until the sweeper)."""
        done = sfn.Pass(
            self,
            f"{prefix}ItemDone",
            comment="The item's outcome is in the ledger",
            result=sfn.Result.from_string(ITEM_RECORDED),
            result_path="$",
        )
        # find_reachable_end_states counts a task with a Catch as going on: look at each
        # state's own rendering instead (a Pass or Task without Next ends the item).
        for state in sfn.State.find_reachable_states(start, include_error_handlers=True):
            rendered = state.to_state_json()
            if rendered.get("End") and state not in self._unrecorded:
                state.next(done)  # type: ignore[attr-defined]  # a state that ends has next(); State declares none
        return start

    def _item_failed(self, name: str) -> sfn.Pass:
        """The end of an item whose failure could not be recorded: it answers ITEM_UNRECORDED to its Map
        and ends alone (the workflow then ends FAILED, see `AnyItemUnrecorded`)."""
        state = sfn.Pass(
            self,
            name,
            comment="Recording a failure failed; the node was left as it was. The sweeper "
            "closes the remediation once the execution ends.",
            result=sfn.Result.from_string(ITEM_UNRECORDED),
            result_path="$",
        )
        self._unrecorded.append(state)
        return state

    def _late_node(self) -> tasks.LambdaInvoke:
        """A pending node's item: look for its report again (retried while it is not visible,
        as localize is), then the per-suspect chain; recorded as failed when it never shows."""
        item_failed = self._item_failed("LateNodeFailed")
        record_failed = self._record("RecordLateNodeFailed", "failed", notify=True, with_error=True)
        record_failed.add_catch(item_failed, errors=[sfn.Errors.ALL], result_path=ERROR_PATH)
        task, found = self._step("LocalizeLate", "localize", "suspect")
        _catch_terminal(task, record_failed)
        found.next(self._remediate_one("Late"))
        return task

    def _remediate_one(self, prefix: str) -> tasks.LambdaInvoke:
        """The per-suspect chain (a Map item); its states' names start with `prefix` (the late
        nodes' Map has its own copy of the chain: a state belongs to one Map only)."""
        approval_timeout = self._approval_timeout

        def n(name: str) -> str:
            return f"{prefix}{name}"

        item_failed = self._item_failed(n("ItemFailed"))
        record_failed = self._record(n("RecordItemFailed"), "failed", notify=True, with_error=True)
        record_failed.add_catch(item_failed, errors=[sfn.Errors.ALL], result_path=ERROR_PATH)

        def record(name: str, transition: str, *, notify: bool) -> tasks.LambdaInvoke:
            task = self._record(n(name), transition, notify=notify)
            _catch_terminal(task, record_failed)
            return task

        def step(name: str, folder: str, key: str) -> tuple[tasks.LambdaInvoke, sfn.Pass]:
            task, unwrap = self._step(n(name), folder, key)
            _catch_terminal(task, record_failed)
            return task, unwrap

        def unexpected(name: str, cause: str) -> sfn.Pass:
            return self._unexpected(n(name), cause)

        # Admit: dedupe and the blast-radius guard, before anything touches the node.
        admit, admitted = step("Admit", "admit", "admission")
        cordon, cordoned = step("Cordon", "cordon", "cordon")
        start_check, polled, wait = self._health_check_loop(n, "", step, record_failed)
        replace, replaced = step("Replace", "replace", "replacement")
        uncordon, uncordoned = step("Uncordon", "uncordon", "uncordon")

        admitted.next(
            sfn.Choice(self, n("AdmissionDecision"))
            .when(
                sfn.Condition.is_not_present("$.admission.decision"),
                unexpected("NoAdmission", "admit returned no decision").next(record_failed),
            )
            .when(
                sfn.Condition.string_equals("$.admission.decision", "duplicate"),
                record("RecordDuplicate", "duplicate", notify=False),
            )
            .when(
                sfn.Condition.string_equals("$.admission.decision", "circuit_open"),
                record("RecordCircuitOpen", "circuit_open", notify=True),
            )
            .when(
                sfn.Condition.string_equals("$.admission.decision", "admitted"),
                # Per check x verdict modes (CHECK_MODES): a shadowed alarm is recorded and
                # notified ("would have cordoned"), and nothing touches the node. Choices
                # stop at the first match, so `mode` is read only when present (an admit
                # from before modes existed returns none: enforced).
                sfn.Choice(self, n("AdmissionMode"))
                .when(sfn.Condition.is_not_present("$.admission.mode"), cordon)
                .when(
                    sfn.Condition.string_equals("$.admission.mode", "shadow"),
                    self._shadow(
                        prefix,
                        record("RecordShadow", "shadow", notify=True),
                        step,
                        record_failed,
                    ),
                )
                .when(sfn.Condition.string_equals("$.admission.mode", "enforce"), cordon)
                .otherwise(
                    unexpected("UnknownMode", "admit returned an unknown mode").next(record_failed)
                ),
            )
            .otherwise(
                unexpected("UnknownAdmission", "admit returned an unknown decision").next(
                    record_failed
                )
            )
        )

        # Cordon, then the deep health check and its poll loop.
        cordoned.next(record("RecordCordoned", "cordoned", notify=True)).next(start_check)

        # Approval: the decision comes back as the task's output at $.approval.
        approval = request_approval_task(
            self,
            self._functions["request_approval"],
            timeout=approval_timeout,
            name=n("RequestApproval"),
        )
        _retry_transient(approval)
        approval.add_catch(
            record("RecordApprovalTimedOut", "approval_timed_out", notify=True),
            errors=[sfn.Errors.TIMEOUT],
            result_path=ERROR_PATH,
        )
        _catch_terminal(approval, record_failed)
        awaiting = record("RecordAwaitingApproval", "awaiting_approval", notify=False).next(
            approval
        )
        # After the health check's verdict, the node screen; whatever it gives (or a failure
        # of the step itself) the item goes on to the approval.
        screen = self._screen(n, awaiting)

        polled.next(
            self._health_status_choice(n, "", wait, record_failed)
            .when(
                # HyperPod's automatic node recovery already replaced the node: nothing to
                # approve.
                sfn.Condition.string_equals("$.health.status", "replaced_by_hyperpod"),
                record("RecordReplacedByHyperPod", "replaced_by_hyperpod", notify=True),
            )
            .when(
                sfn.Condition.string_equals("$.health.status", "passed"),
                # A passed check does not clear an SDC suspect (deep health checks rarely
                # reproduce silent corruption): a human still decides.
                record("RecordHealthCheckPassed", "health_check_passed", notify=False).next(screen),
            )
            .when(
                sfn.Condition.string_equals("$.health.status", "failed"),
                record("RecordHealthCheckFailed", "health_check_failed", notify=False).next(screen),
            )
            .when(
                sfn.Condition.string_equals("$.health.status", "timed_out"),
                record("RecordHealthCheckTimedOut", "health_check_timed_out", notify=False).next(
                    screen
                ),
            )
            .otherwise(
                unexpected(
                    "UnknownHealthStatus", "poll_health_check returned an unknown status"
                ).next(record_failed)
            )
        )

        record_rejected = record("RecordRejected", "rejected", notify=True)
        approval.next(
            sfn.Choice(self, n("ApprovalDecision"))
            .when(
                sfn.Condition.or_(
                    sfn.Condition.is_not_present("$.approval.decision"),
                    sfn.Condition.is_not_present("$.approval.approver"),
                ),
                unexpected(
                    "IncompleteDecision", "the approval carried no decision or no approver"
                ).next(record_failed),
            )
            .when(
                sfn.Condition.string_equals("$.approval.decision", "approve"),
                record("RecordApproved", "approved", notify=False).next(replace),
            )
            # Conditions are tried in order; `release` is checked for presence before its value
            # so a decision without it reads as "stay cordoned", never as a runtime error.
            .when(
                sfn.Condition.and_(
                    sfn.Condition.string_equals("$.approval.decision", "reject"),
                    sfn.Condition.is_not_present("$.approval.release"),
                ),
                record_rejected,
            )
            .when(
                sfn.Condition.and_(
                    sfn.Condition.string_equals("$.approval.decision", "reject"),
                    sfn.Condition.boolean_equals("$.approval.release", True),
                ),
                uncordon,
            )
            .when(sfn.Condition.string_equals("$.approval.decision", "reject"), record_rejected)
            .otherwise(
                unexpected("UnknownDecision", "the approval carried an unknown decision").next(
                    record_failed
                )
            )
        )
        replaced.next(record("RecordReplaced", "replaced", notify=True))
        uncordoned.next(record("RecordReleased", "released", notify=True))
        return admit

    def _screen(self, n: Callable[[str], str], then: sfn.IChainable) -> tasks.LambdaInvoke:
        """The node screen (issue 35): Screen creates its Job on the cordoned node, then
        (``in_progress``) WaitForScreen -> Screen polls it until an outcome, then ``then`` (the
        approval). It runs after the deep health check, not beside it: both would want the
        node's GPUs at once, and HyperPod may taint the node during its check.

        A failure never fails the item: the Catch puts the step's {Error, Cause} at
        ``$.screen``, which the functions read as a ``failed`` screen (``models.ScreenResult``),
        and the item goes on to ``then`` as it would have. Transient errors are retried first,
        as every step's are. A step that answers no status is a ``failed`` screen too."""
        task, unwrap = self._step(n("Screen"), "screen", "screen")
        task.add_catch(then, errors=[sfn.Errors.ALL], result_path="$.screen")
        wait = sfn.Wait(
            self, n("WaitForScreen"), time=sfn.WaitTime.duration(self._health_check_poll)
        )
        wait.next(task)
        no_status = sfn.Pass(
            self,
            n("ScreenNoStatus"),
            result=sfn.Result.from_object(
                {"status": "failed", "reason": "the Screen step returned no status"}
            ),
            result_path="$.screen",
        )
        no_status.next(then)
        unwrap.next(
            sfn.Choice(self, n("ScreenStatus"))
            .when(sfn.Condition.is_not_present("$.screen.status"), no_status)
            .when(sfn.Condition.string_equals("$.screen.status", "in_progress"), wait)
            .otherwise(then)
        )
        return task

    def _shadow(
        self,
        prefix: str,
        record_shadow: sfn.IChainable,
        step: Callable[[str, str, str], tuple[tasks.LambdaInvoke, sfn.Pass]],
        record_failed: sfn.IChainable,
    ) -> sfn.IChainable:
        """A shadowed alarm's path: straight to RecordShadow, or (`shadowHealthCheck`, when the
        shadow guard admitted the check: `$.admission.shadow_health_check`) the deep health
        check and its poll loop first, so the shadow record and message carry its verdict (the
        "health check optional" of shadow mode). Nothing is cordoned either way."""
        if not self._shadow_health_check:
            return record_shadow

        def n(name: str) -> str:
            return f"{prefix}{name}"

        start, polled, wait = self._health_check_loop(n, "Shadow", step, record_failed)
        polled.next(
            self._health_status_choice(n, "Shadow", wait, record_failed)
            # Any verdict (passed, failed, timed out, replaced by HyperPod) is the shadow's
            # evidence: recorded and notified with it, never acted on.
            .otherwise(record_shadow)
        )
        # The shadow guard decides whether this alarm's check may run (a fraction of the
        # cluster, its own budget): without room it is recorded with no health check.
        return (
            sfn.Choice(self, n("ShadowHealthCheckAdmitted"))
            .when(
                sfn.Condition.and_(
                    sfn.Condition.is_present("$.admission.shadow_health_check"),
                    sfn.Condition.boolean_equals("$.admission.shadow_health_check", True),
                ),
                start,
            )
            .otherwise(record_shadow)
        )


def _retry_transient(task: sfn.TaskStateBase) -> None:
    # The first retrier that names an error is the one used: the report wait comes first.
    task.add_retry(
        errors=[REPORT_NOT_YET_VISIBLE],
        interval=REPORT_WAIT_INTERVAL,
        max_attempts=REPORT_WAIT_MAX_ATTEMPTS,
        backoff_rate=REPORT_WAIT_BACKOFF_RATE,
        jitter_strategy=sfn.JitterType.NONE,
    )
    task.add_retry(
        errors=[
            *LAMBDA_SERVICE_ERRORS,
            *(e for e in TRANSIENT_ERRORS if e != REPORT_NOT_YET_VISIBLE),
        ],
        interval=RETRY_INTERVAL,
        max_attempts=RETRY_MAX_ATTEMPTS,
        backoff_rate=RETRY_BACKOFF_RATE,
        jitter_strategy=RETRY_JITTER,
    )


def _catch_terminal(task: sfn.TaskStateBase, handler: sfn.IChainable) -> None:
    """Terminal errors by name, then States.ALL as the last resort (a bug, a timeout)."""
    task.add_catch(handler, errors=list(TERMINAL_ERRORS), result_path=ERROR_PATH)
    task.add_catch(handler, errors=[sfn.Errors.ALL], result_path=ERROR_PATH)
