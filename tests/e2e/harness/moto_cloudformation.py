"""CloudFormation on moto for this stack: the resource models moto lacks and the CLI-path fixes.

moto 5.2.5's CloudFormation engine creates most of what ``cdk synth`` emits, but not all of it,
and the CDK CLI's deploy path (change sets, ``UsePreviousValue``, waiting on change sets) meets
a few gaps of its own. :func:`install` closes each one with a small, named patch of moto's
models. Every patch says the gap it fills; none changes what moto does for a template that did
not hit the gap. The patches target exactly the pinned moto (requirements-dev.txt) and refuse
any other version: a newer moto may have filled a gap differently.

What the models do is record, not enforce: an alarm is stored in moto's CloudWatch (moto never
evaluates it), a topic or queue policy is stored as the resource's Policy attribute (never
checked), and an EKS access entry is kept in :data:`ACCESS_ENTRIES` (moto has no EKS access
entries at all).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable
from typing import Any

import moto

PINNED_MOTO = "5.2.5"

ACCESS_ENTRIES: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
"""(account, region) -> principal ARN -> the access entry's properties, as CloudFormation got
them (moto has no EKS access-entry API; the rehearsal's test reads them here)."""

_INSTALLED: list[str] = []
_LOCK = threading.Lock()


def _require_pinned_moto() -> None:
    if moto.__version__ != PINNED_MOTO:
        raise RuntimeError(
            f"tests/e2e/harness/moto_cloudformation.py patches moto {PINNED_MOTO} (pinned in "
            f"requirements-dev.txt); this environment has moto {moto.__version__}. Reinstall the "
            f"pinned version (make clean; make deploy-local) or re-verify each patch against it."
        )


# ---------------------------------------------------------------------------- resource models
class _Recorded:
    """Shared plumbing (a mixin: moto lists only *direct* subclasses of CloudFormationModel
    as models): update is delete-then-create (none of these keeps an identity a template
    could observe changing); deletion goes through each instance's ``delete``."""

    physical_id: str
    CFN_TYPE: str
    """The CloudFormation type the model creates."""
    NAME_TYPE = ""
    """The property that names the resource, "" where CloudFormation makes up the name."""

    @classmethod
    def cloudformation_type(cls) -> str:
        return cls.CFN_TYPE

    @classmethod
    def cloudformation_name_type(cls) -> str:
        return cls.NAME_TYPE

    @property
    def physical_resource_id(self) -> str:
        return self.physical_id

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return False

    @classmethod
    def update_from_cloudformation_json(  # type: ignore[override]
        cls,
        original_resource: Any,
        new_resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
    ) -> Any:
        original_resource.delete(account_id, region_name)
        return cls.create_from_cloudformation_json(
            new_resource_name, cloudformation_json, account_id, region_name
        )

    @classmethod
    def delete_from_cloudformation_json(  # type: ignore[override]
        cls,
        resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
    ) -> None:
        """Unused: ResourceMap deletes through the instance's ``delete``."""


def _resource_models() -> list[type]:
    """The CloudFormation models for the types this stack uses that moto 5.2.5 skips.

    Defined inside a function so that importing this module registers nothing: moto finds
    models by subclassing CloudFormationModel, so defining them is registering them.
    """
    from moto.awslambda.exceptions import UnknownFunctionException
    from moto.awslambda.models import get_backend as lambda_backend
    from moto.cloudwatch.models import (
        Dimension,
        Metric,
        MetricDataQuery,
        MetricStat,
        cloudwatch_backends,
    )
    from moto.core.common_models import CloudFormationModel
    from moto.scheduler.models import scheduler_backends
    from moto.sns.models import sns_backends
    from moto.sqs.models import sqs_backends

    class CloudWatchAlarm(_Recorded, CloudFormationModel):
        """AWS::CloudWatch::Alarm -> moto's PutMetricAlarm (single metric or metric math)."""

        CFN_TYPE = "AWS::CloudWatch::Alarm"
        NAME_TYPE = "AlarmName"

        def __init__(self, name: str, arn: str) -> None:
            self.physical_id, self.arn = name, arn

        @classmethod
        def has_cfn_attr(cls, attr: str) -> bool:
            return attr == "Arn"

        def get_cfn_attribute(self, attribute_name: str) -> str:
            return self.arn

        @classmethod
        def create_from_cloudformation_json(  # type: ignore[override]
            cls,
            resource_name: str,
            cloudformation_json: dict[str, Any],
            account_id: str,
            region_name: str,
            **kwargs: Any,
        ) -> CloudWatchAlarm:
            p = cloudformation_json["Properties"]
            queries = [_metric_query(m) for m in p.get("Metrics", [])] or None
            alarm = cloudwatch_backends[account_id][region_name].put_metric_alarm(
                name=resource_name,
                namespace=p.get("Namespace"),
                metric_name=p.get("MetricName"),
                comparison_operator=p["ComparisonOperator"],
                evaluation_periods=int(p["EvaluationPeriods"]),
                period=int(p["Period"]) if "Period" in p else None,
                threshold=float(p["Threshold"]),
                statistic=p.get("Statistic"),
                description=p.get("AlarmDescription", ""),
                dimensions=[
                    {"Name": d["Name"], "Value": d["Value"]} for d in p.get("Dimensions", [])
                ],
                alarm_actions=p.get("AlarmActions", []),
                metric_data_queries=queries,
                datapoints_to_alarm=(
                    int(p["DatapointsToAlarm"]) if "DatapointsToAlarm" in p else None
                ),
                ok_actions=p.get("OKActions", []),
                insufficient_data_actions=p.get("InsufficientDataActions", []),
                treat_missing_data=p.get("TreatMissingData"),
            )
            return cls(resource_name, alarm.alarm_arn)

        def delete(self, account_id: str, region_name: str) -> None:
            cloudwatch_backends[account_id][region_name].delete_alarms([self.physical_id])

    def _metric_query(m: dict[str, Any]) -> MetricDataQuery:
        stat = m.get("MetricStat")
        metric_stat = None
        if stat:
            metric = stat["Metric"]
            metric_stat = MetricStat(
                metric=Metric(
                    metric_name=metric["MetricName"],
                    namespace=metric["Namespace"],
                    dimensions=[
                        Dimension(name=d["Name"], value=d["Value"])
                        for d in metric.get("Dimensions", [])
                    ],
                ),
                period=stat.get("Period"),
                stat=stat.get("Stat"),
                unit=stat.get("Unit"),
            )
        return MetricDataQuery(
            query_id=m["Id"],
            label=m.get("Label"),
            period=m.get("Period"),
            return_data=m.get("ReturnData"),
            expression=m.get("Expression"),
            metric_stat=metric_stat,
        )

    class SnsSubscription(_Recorded, CloudFormationModel):
        """AWS::SNS::Subscription -> moto's Subscribe (email ones stay pending, as in AWS)."""

        CFN_TYPE = "AWS::SNS::Subscription"

        def __init__(self, arn: str) -> None:
            self.physical_id = arn

        @classmethod
        def create_from_cloudformation_json(  # type: ignore[override]
            cls,
            resource_name: str,
            cloudformation_json: dict[str, Any],
            account_id: str,
            region_name: str,
            **kwargs: Any,
        ) -> SnsSubscription:
            p = cloudformation_json["Properties"]
            backend = sns_backends[account_id][region_name]
            subscription = backend.subscribe(p["TopicArn"], p["Endpoint"], p["Protocol"])
            return cls(subscription.arn)

        def delete(self, account_id: str, region_name: str) -> None:
            sns_backends[account_id][region_name].unsubscribe(self.physical_id)

    class SnsTopicPolicy(_Recorded, CloudFormationModel):
        """AWS::SNS::TopicPolicy -> the topics' Policy attribute (stored, never enforced)."""

        CFN_TYPE = "AWS::SNS::TopicPolicy"

        def __init__(self, topics: list[str], name: str) -> None:
            self.topics, self.physical_id = topics, name

        @classmethod
        def create_from_cloudformation_json(  # type: ignore[override]
            cls,
            resource_name: str,
            cloudformation_json: dict[str, Any],
            account_id: str,
            region_name: str,
            **kwargs: Any,
        ) -> SnsTopicPolicy:
            p = cloudformation_json["Properties"]
            backend = sns_backends[account_id][region_name]
            for topic in p["Topics"]:
                backend.set_topic_attribute(topic, "policy", json.dumps(p["PolicyDocument"]))
            return cls(list(p["Topics"]), resource_name)

        def delete(self, account_id: str, region_name: str) -> None:
            """Nothing to undo here: the policy goes with its resource, an update overwrites it."""

    class SqsQueuePolicy(_Recorded, CloudFormationModel):
        """AWS::SQS::QueuePolicy -> the queues' Policy attribute (stored, never enforced)."""

        CFN_TYPE = "AWS::SQS::QueuePolicy"

        def __init__(self, queues: list[str], name: str) -> None:
            self.queues, self.physical_id = queues, name

        @classmethod
        def create_from_cloudformation_json(  # type: ignore[override]
            cls,
            resource_name: str,
            cloudformation_json: dict[str, Any],
            account_id: str,
            region_name: str,
            **kwargs: Any,
        ) -> SqsQueuePolicy:
            p = cloudformation_json["Properties"]
            backend = sqs_backends[account_id][region_name]
            names = [url.rstrip("/").rsplit("/", 1)[-1] for url in p["Queues"]]
            for name in names:
                backend.set_queue_attributes(name, {"Policy": json.dumps(p["PolicyDocument"])})
            return cls(names, resource_name)

        def delete(self, account_id: str, region_name: str) -> None:
            """Nothing to undo here: the policy goes with its resource, an update overwrites it."""

    class EksAccessEntry(_Recorded, CloudFormationModel):
        """AWS::EKS::AccessEntry -> :data:`ACCESS_ENTRIES` (moto has no access-entry API)."""

        CFN_TYPE = "AWS::EKS::AccessEntry"

        def __init__(self, key: tuple[str, str], principal: str) -> None:
            self.key, self.physical_id = key, principal

        @classmethod
        def create_from_cloudformation_json(  # type: ignore[override]
            cls,
            resource_name: str,
            cloudformation_json: dict[str, Any],
            account_id: str,
            region_name: str,
            **kwargs: Any,
        ) -> EksAccessEntry:
            p = cloudformation_json["Properties"]
            key = (account_id, region_name)
            ACCESS_ENTRIES.setdefault(key, {})[p["PrincipalArn"]] = dict(p)
            return cls(key, p["PrincipalArn"])

        def delete(self, account_id: str, region_name: str) -> None:
            ACCESS_ENTRIES.get(self.key, {}).pop(self.physical_id, None)

    class LambdaUrl(_Recorded, CloudFormationModel):
        """AWS::Lambda::Url -> moto's CreateFunctionUrlConfig; GetAtt FunctionUrl/FunctionArn.

        Through moto's ``get_backend``: with ``use_docker`` off the functions live in the
        in-process Lambda backend, not in ``lambda_backends``."""

        CFN_TYPE = "AWS::Lambda::Url"

        def __init__(self, function_arn: str, url: str) -> None:
            self.physical_id, self.url = function_arn, url

        @classmethod
        def has_cfn_attr(cls, attr: str) -> bool:
            return attr in ("FunctionUrl", "FunctionArn")

        def get_cfn_attribute(self, attribute_name: str) -> str:
            return self.url if attribute_name == "FunctionUrl" else self.physical_id

        @classmethod
        def create_from_cloudformation_json(  # type: ignore[override]
            cls,
            resource_name: str,
            cloudformation_json: dict[str, Any],
            account_id: str,
            region_name: str,
            **kwargs: Any,
        ) -> LambdaUrl:
            p = cloudformation_json["Properties"]
            config = {k: v for k, v in p.items() if k in ("AuthType", "Cors", "InvokeMode")}
            url = lambda_backend(account_id, region_name).create_function_url_config(
                p["TargetFunctionArn"], config
            )
            return cls(p["TargetFunctionArn"], url.url)

        def delete(self, account_id: str, region_name: str) -> None:
            # The function may have gone first; its URL went with it.
            with contextlib.suppress(UnknownFunctionException):
                lambda_backend(account_id, region_name).delete_function_url_config(self.physical_id)

    class SchedulerSchedule(_Recorded, CloudFormationModel):
        """AWS::Scheduler::Schedule -> moto's CreateSchedule (stored; moto never fires it)."""

        CFN_TYPE = "AWS::Scheduler::Schedule"
        NAME_TYPE = "Name"

        def __init__(self, name: str, group: str | None, arn: str) -> None:
            self.physical_id, self.group, self.arn = name, group, arn

        @classmethod
        def has_cfn_attr(cls, attr: str) -> bool:
            return attr == "Arn"

        def get_cfn_attribute(self, attribute_name: str) -> str:
            return self.arn

        @classmethod
        def create_from_cloudformation_json(  # type: ignore[override]
            cls,
            resource_name: str,
            cloudformation_json: dict[str, Any],
            account_id: str,
            region_name: str,
            **kwargs: Any,
        ) -> SchedulerSchedule:
            p = cloudformation_json["Properties"]
            schedule = scheduler_backends[account_id][region_name].create_schedule(
                description=p.get("Description", ""),
                end_date=p.get("EndDate"),
                flexible_time_window=p["FlexibleTimeWindow"],
                group_name=p.get("GroupName"),
                kms_key_arn=p.get("KmsKeyArn"),
                name=resource_name,
                schedule_expression=p["ScheduleExpression"],
                schedule_expression_timezone=p.get("ScheduleExpressionTimezone"),
                start_date=p.get("StartDate"),
                state=p.get("State", "ENABLED"),
                target=p["Target"],
                action_after_completion=None,
            )
            return cls(resource_name, p.get("GroupName"), schedule.arn)

        def delete(self, account_id: str, region_name: str) -> None:
            scheduler_backends[account_id][region_name].delete_schedule(
                self.group, self.physical_id
            )

    class LambdaPermission(_Recorded, CloudFormationModel):
        """AWS::Lambda::Permission (the canary alarm's Lambda action) -> the function's resource
        policy, as moto's own model does, but with a physical id: moto's has none, and
        DescribeStackResources then lists the resource without one."""

        def __init__(self, name: str, function: str, sid: str) -> None:
            self.physical_id, self.function, self.sid = name, function, sid

        @staticmethod
        def cloudformation_type() -> str:
            return "AWS::Lambda::Permission"

        @staticmethod
        def cloudformation_name_type() -> str:
            return ""

        @classmethod
        def create_from_cloudformation_json(  # type: ignore[override]
            cls,
            resource_name: str,
            cloudformation_json: dict[str, Any],
            account_id: str,
            region_name: str,
            **kwargs: Any,
        ) -> LambdaPermission:
            p = dict(cloudformation_json["Properties"])
            p.setdefault("StatementId", resource_name)
            lambda_backend(account_id, region_name).add_permission(
                p["FunctionName"], None, json.dumps(p)
            )
            return cls(resource_name, p["FunctionName"], p["StatementId"])

        def delete(self, account_id: str, region_name: str) -> None:
            # The function may have gone first; its policy went with it.
            with contextlib.suppress(UnknownFunctionException):
                lambda_backend(account_id, region_name).remove_permission(self.function, self.sid)

    return [
        CloudWatchAlarm,
        SnsSubscription,
        SnsTopicPolicy,
        SqsQueuePolicy,
        EksAccessEntry,
        LambdaUrl,
        SchedulerSchedule,
        LambdaPermission,
    ]


def register_missing_resource_models() -> list[str]:
    """Gap: moto 5.2.5 skips (with a warning) AWS::CloudWatch::Alarm, AWS::EKS::AccessEntry,
    AWS::SNS::Subscription, AWS::SNS::TopicPolicy, AWS::SQS::QueuePolicy, AWS::Lambda::Url and
    AWS::Scheduler::Schedule, so every ``Fn::GetAtt`` on them (the rule's alarm ARNs, the
    dashboard, the ApprovalUrl output) fails the stack; its AWS::Lambda::Permission has no
    physical id. Registers a model for each."""
    from moto.cloudformation import parsing

    models = _resource_models()
    for cache in (parsing.get_model_list, parsing.get_model_map, parsing.get_name_type_map):
        cache.cache_clear()  # moto caches the model list on first use
    return [m.cloudformation_type() for m in models]


# ---------------------------------------------------------------------------- CLI-path patches
def _patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    setattr(owner, name, make(getattr(owner, name)))


def _patch_create(
    model: Any,
    before: Callable[[dict[str, Any]], dict[str, Any]] = lambda template: template,
    after: Callable[[Any, dict[str, Any], str, str], Any] = lambda made, props, acct, region: made,
) -> None:
    """Wrap a moto model's ``create_from_cloudformation_json``: ``before`` may rewrite the
    resource's template, ``after(resource, properties, account, region)`` finishes what moto
    skipped and returns the resource."""
    create = model.create_from_cloudformation_json.__func__

    def create_from_cloudformation_json(
        cls: Any,
        resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
        **kwargs: Any,
    ) -> Any:
        template = before(cloudformation_json)
        made = create(cls, resource_name, template, account_id, region_name, **kwargs)
        return after(made, template["Properties"], account_id, region_name)

    model.create_from_cloudformation_json = classmethod(create_from_cloudformation_json)


def keep_outputs_of_change_set_stacks() -> None:
    """Gap: a stack created or updated by ExecuteChangeSet (how the CDK CLI deploys) keeps the
    Outputs of its empty placeholder template: moto rebuilds the output map only in
    CreateStack/UpdateStack. Re-read the template and rebuild the outputs after execution."""
    from moto.cloudformation.models import CloudFormationBackend

    def make(original: Callable[..., None]) -> Callable[..., None]:
        def execute_change_set(
            self: CloudFormationBackend, change_set_name: str, stack_name: str | None = None
        ) -> None:
            original(self, change_set_name, stack_name)
            change_set = self.describe_change_set(change_set_name)
            stack = self.stacks[change_set.stack_id]
            stack.template_dict = change_set.template_dict
            stack.description = stack.template_dict.get("Description")
            stack.parameters = change_set.parameters
            stack.output_map = stack._create_output_map()

        return execute_change_set

    _patch(CloudFormationBackend, "execute_change_set", make)


def answer_unknown_change_sets_as_not_found() -> None:
    """Gap: DeleteChangeSet of an unknown name raises a bare KeyError inside moto (the CLI gets
    an HTML 500 and fails on the XML), and DescribeChangeSet answers ValidationError where the
    CLI waits for ChangeSetNotFound (404). Both now answer ChangeSetNotFound, as AWS does."""
    from moto.cloudformation.exceptions import CloudFormationError
    from moto.cloudformation.models import CloudFormationBackend

    class ChangeSetNotFound(CloudFormationError):
        # The service model's shape: error code ChangeSetNotFound, HTTP 404.
        code = "ChangeSetNotFoundException"

        def __init__(self, name: str) -> None:
            super().__init__(f"ChangeSet [{name}] does not exist")

    def find(self: CloudFormationBackend, name: str) -> str | None:
        if name in self.change_sets:
            return name
        return next((k for k, c in self.change_sets.items() if c.change_set_name == name), None)

    def delete_change_set(self: CloudFormationBackend, change_set_name: str) -> None:
        key = find(self, change_set_name)
        if key is None:
            raise ChangeSetNotFound(change_set_name)
        del self.change_sets[key]

    def describe_change_set(self: CloudFormationBackend, change_set_name: str) -> Any:
        key = find(self, change_set_name)
        if key is None:
            raise ChangeSetNotFound(change_set_name)
        return self.change_sets[key]

    CloudFormationBackend.delete_change_set = delete_change_set  # type: ignore[method-assign]
    CloudFormationBackend.describe_change_set = describe_change_set  # type: ignore[method-assign]


def reuse_raw_previous_parameter_values() -> None:
    """Gap: CreateChangeSet with ``UsePreviousValue`` takes the previous *resolved* value; for an
    SSM-typed parameter (CDK's BootstrapVersion, ``/cdk-bootstrap/.../version``) that is the
    parameter's content ("30"), which moto then looks up as an SSM name and fails. Substitute
    the previous *given* value (the SSM name), or, when the previous deploy used the template's
    default, let the default apply again, as CloudFormation does."""
    from moto.cloudformation.responses import CloudFormationResponse

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def create_change_set(self: CloudFormationResponse) -> Any:
            if self._get_param("ChangeSetType", "CREATE") == "UPDATE":
                stack = self.cloudformation_backend.get_stack(self._get_param("StackName"))
                params = self._get_param("Parameters", [])
                given = []
                for param in params:
                    key = param.get("ParameterKey")
                    if not param.get("UsePreviousValue"):
                        given.append(param)
                    elif key in stack.parameters:
                        given.append({"ParameterKey": key, "ParameterValue": stack.parameters[key]})
                    # else: the previous deploy used the template's default; it applies again.
                params[:] = given  # the parsed request moto's handler reads next
            return original(self)

        return create_change_set

    _patch(CloudFormationResponse, "create_change_set", make)


def keep_lambda_layers_architectures_tracing() -> None:
    """Gap: moto's AWS::Lambda::Function model drops ``Layers``, ``Architectures`` and
    ``TracingConfig`` (GetFunctionConfiguration then shows none, x86_64, PassThrough), and a
    ``Ref`` to an AWS::Lambda::LayerVersion gives its name, not its version ARN. Apply the three
    properties on create and update, and make the layer version's Ref its ARN."""
    from moto.awslambda.models import LambdaFunction, LayerVersion

    def apply(fn: Any, props: dict[str, Any]) -> Any:
        if "Layers" in props:
            fn.layers = fn._get_layers_data(props["Layers"])
        if "Architectures" in props:
            fn.architectures = list(props["Architectures"])
        if "TracingConfig" in props:
            fn.tracing_config = dict(props["TracingConfig"])
        return fn

    update = LambdaFunction.update_from_cloudformation_json.__func__  # type: ignore[attr-defined]

    def update_from_cloudformation_json(
        cls: Any,
        original_resource: Any,
        new_resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
    ) -> Any:
        fn = update(
            cls, original_resource, new_resource_name, cloudformation_json, account_id, region_name
        )
        return apply(fn, cloudformation_json["Properties"])

    _patch_create(LambdaFunction, after=lambda fn, props, _account, _region: apply(fn, props))
    LambdaFunction.update_from_cloudformation_json = classmethod(update_from_cloudformation_json)  # type: ignore[method-assign,assignment]
    LayerVersion.physical_resource_id = property(lambda self: self.arn)  # type: ignore[attr-defined]


def keep_dynamodb_time_to_live() -> None:
    """Gap: moto's AWS::DynamoDB::Table model drops ``TimeToLiveSpecification`` (DescribeTimeToLive
    then says DISABLED, and expired approvals would never go). Apply it after the table exists."""
    from moto.dynamodb.models import dynamodb_backends
    from moto.dynamodb.models.table import Table

    def set_time_to_live(table: Any, props: dict[str, Any], account_id: str, region: str) -> Any:
        ttl = props.get("TimeToLiveSpecification")
        if ttl:
            dynamodb_backends[account_id][region].update_time_to_live(table.name, ttl)
        return table

    _patch_create(Table, after=set_time_to_live)


def store_kms_key_policy_as_json() -> None:
    """Gap: moto's AWS::KMS::Key model stores ``KeyPolicy`` as the template's object, while its
    API expects a JSON string: DescribeKey and GetKeyPolicy then fail with an HTML 500. Store the
    policy as JSON text, as CreateKey does."""
    from moto.kms.models import Key

    def policy_as_text(template: dict[str, Any]) -> dict[str, Any]:
        props = dict(template["Properties"])
        if not isinstance(props.get("KeyPolicy"), str):
            props["KeyPolicy"] = json.dumps(props.get("KeyPolicy"))
        return {**template, "Properties": props}

    _patch_create(Key, before=policy_as_text)


def create_state_machines_in_the_executing_backend() -> None:
    """Gap: moto's AWS::StepFunctions::StateMachine model always uses the plain Step Functions
    backend, while the API answers from the executing one when ``execute_state_machine`` is on:
    StartExecution then says StateMachineDoesNotExist. Route the model to the backend the API
    uses (chosen by moto's config at each call)."""
    from moto.stepfunctions import models as sfn_models
    from moto.stepfunctions.responses import get_backend

    class BackendChosenByConfig:
        """``[account][region]`` like a BackendDict, resolved through moto's config."""

        def __getitem__(self, account: str) -> Any:
            class Regions:
                def __getitem__(self, region: str) -> Any:
                    return get_backend(account, region)

            return Regions()

    sfn_models.stepfunctions_backends = BackendChosenByConfig()  # type: ignore[assignment]


CLUSTER_ARN_LOOKUP = "Custom::HyperPodClusterArn"
"""infra/constructs/hyperpod.py's deploy-time lookup of the HyperPod cluster's ARN."""


def look_up_the_cluster_arn_in_moto() -> None:
    """Gap: moto runs every ``Custom::`` resource through its provider Lambda, here CDK's
    Node.js AwsCustomResource provider, which only a container could run (and its SDK call
    would need moto's endpoint). The stack's one custom resource, the cluster-ARN lookup, makes
    the provider's one SDK call instead: SageMaker DescribeCluster on moto's backend, with the
    parameters the template gives the provider, and answers its output path (``ClusterArn``).
    A cluster that does not exist fails the stack, as the provider would."""
    from moto.cloudformation import parsing
    from moto.core.common_models import CloudFormationModel
    from moto.sagemaker.models import sagemaker_backends

    class HyperPodClusterArnLookup(_Recorded, CloudFormationModel):
        CFN_TYPE = CLUSTER_ARN_LOOKUP

        def __init__(self, physical_id: str, attributes: dict[str, str]) -> None:
            self.physical_id, self.attributes = physical_id, attributes

        @classmethod
        def has_cfn_attr(cls, attr: str) -> bool:
            return attr == "ClusterArn"

        def get_cfn_attribute(self, attribute_name: str) -> str:
            return self.attributes[attribute_name]

        @classmethod
        def create_from_cloudformation_json(  # type: ignore[override]
            cls,
            resource_name: str,
            cloudformation_json: dict[str, Any],
            account_id: str,
            region_name: str,
            **kwargs: Any,
        ) -> Any:
            call = json.loads(cloudformation_json["Properties"]["Create"])
            if (call["service"], call["action"]) != ("SageMaker", "describeCluster"):
                raise ValueError(f"the cluster-ARN lookup makes no {call['action']!r} call here")
            described = sagemaker_backends[account_id][region_name].describe_cluster(
                call["parameters"]["ClusterName"]
            )
            attributes = {path: described[path] for path in call["outputPaths"]}
            return cls(call["physicalResourceId"]["id"], attributes)

        def delete(self, account_id: str, region_name: str) -> None:
            """Nothing to delete: the lookup created nothing (so an update is a new lookup)."""

    def make(original: Callable[[str], Any]) -> Callable[[str], Any]:
        def resource_class_from_type(resource_type: str) -> Any:
            if resource_type == CLUSTER_ARN_LOOKUP:
                return HyperPodClusterArnLookup
            return original(resource_type)

        return resource_class_from_type

    _patch(parsing, "resource_class_from_type", make)


PATCHES: tuple[Callable[[], Any], ...] = (
    register_missing_resource_models,
    look_up_the_cluster_arn_in_moto,
    keep_outputs_of_change_set_stacks,
    answer_unknown_change_sets_as_not_found,
    reuse_raw_previous_parameter_values,
    keep_lambda_layers_architectures_tracing,
    keep_dynamodb_time_to_live,
    store_kms_key_policy_as_json,
    create_state_machines_in_the_executing_backend,
)


def install() -> list[str]:
    """Apply every patch once per process (idempotent); returns their names.

    The patches live for the process: moto's models are process globals, and the embedded AWS
    they serve runs in this process's threads.
    """
    with _LOCK:
        if not _INSTALLED:
            _require_pinned_moto()
            for patch in PATCHES:
                patch()
                _INSTALLED.append(patch.__name__)
        return list(_INSTALLED)
