"""Reading the synthesized template: what the end-to-end harness needs to run the real
workflow definition outside CloudFormation (e.g. on moto's Step Functions executor).

    template = infra.app.synthesize_template({"healthCheckPollInterval": "1s"})
    arns = {folder: create_function(folder) for folder in function_logical_ids(template)}
    definition = state_machine_definition(template, arns)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

STATE_MACHINE_TYPE = "AWS::StepFunctions::StateMachine"


STEP_HANDLER_SUFFIX = ".handler.handler"


def function_logical_ids(template: Mapping[str, Any]) -> dict[str, str]:
    """Step folder (docs/CONTRACT.md, from the handler string) -> the function's logical id.

    Only the project's functions (`<folder>.handler.handler`); a function CDK brings along (the
    cluster-ARN lookup's provider, `index.handler`) is no step.
    """
    return {
        handler.removesuffix(STEP_HANDLER_SUFFIX): logical_id
        for logical_id, resource in template["Resources"].items()
        if resource["Type"] == "AWS::Lambda::Function"
        and (handler := resource["Properties"].get("Handler", "")).endswith(STEP_HANDLER_SUFFIX)
    }


def state_machine_definition(
    template: Mapping[str, Any], function_arns: Mapping[str, str], *, partition: str = "aws"
) -> str:
    """The workflow's ASL (a JSON string) with its references resolved.

    `function_arns` maps each step folder to the ARN to invoke. The definition references only
    the functions' ARNs and the partition; anything else is a change this helper must learn
    about, so it raises instead of guessing.
    """
    (machine,) = [r for r in template["Resources"].values() if r["Type"] == STATE_MACHINE_TYPE]
    by_logical_id = {
        logical_id: function_arns[folder]
        for folder, logical_id in function_logical_ids(template).items()
    }

    def resolve(part: Any) -> str:
        if isinstance(part, str):
            return part
        if isinstance(part, dict) and "Fn::GetAtt" in part and part["Fn::GetAtt"][1] == "Arn":
            return by_logical_id[part["Fn::GetAtt"][0]]
        if part == {"Ref": "AWS::Partition"}:
            return partition
        raise ValueError(f"unexpected reference in the state machine definition: {part!r}")

    body = machine["Properties"]["DefinitionString"]
    if isinstance(body, str):
        return body
    delimiter, parts = body["Fn::Join"]
    return delimiter.join(resolve(part) for part in parts)
