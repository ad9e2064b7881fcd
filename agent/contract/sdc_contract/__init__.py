"""sdc_contract: the names and rules that cross between sdc-guard's parts, defined once.

The agent (in the training job), the remediation Lambdas, infra (the CDK app) and the operator
CLI all import this package; nothing else keeps a copy of what it defines. Standard library
only, Python 3.10+ (the agent's floor). How it ships: in the agent's wheel (``pip install
./agent``), alone for deploying and the CLI (``pip install -e ./agent/contract``, listed in
requirements.txt), and copied into the Lambda code asset by ``infra/bundling.py``
(docs/CONTRACT.md, "How the contract ships").

Modules, by what they fix:

- ``report``: the ``sdc.alarm/v1`` report (schemas, keys), check names, verdict names and how a
  verdict outside the list is read (``verdict_name`` -> ``unknown``).
- ``metrics``: metric names, their series (dimensions), the report log group, the functions'
  own Powertools service and namespace.
- ``environment``: environment variable names (the functions', the agent's).
- ``names``: Kubernetes names, HyperPod node names, instance ids, health-check types, replace
  modes: validated the same way by infra, the functions and localize.
- ``modes``: per check x verdict ``enforce`` / ``shadow`` (``checkModes`` / ``CHECK_MODES``).
- ``autoapprove``: the auto-approval policy's shape (``autoApprove`` / ``AUTO_APPROVE``).
- ``resume``: where a job may resume after an alarm (the agent's alarm log and every message of
  the pipeline state the same rule).
- ``canary``: the live canary's reserved job, node and metric names, and its runs' ledger key.
- ``errors``: the remediation errors' names, retried or caught by the workflow.
- ``screen``: the node screen's workload (``sdc.workload/v1``) and result (``sdc.screen/v1``),
  its verdicts and exit codes.
- ``idle_screen``: screening idle and standby nodes: the reserved job, the metric and alarm a
  reproduced idle screen raises, the screener's settings and metrics, its ledger key.

The constants are also importable from the package itself (``sdc_contract.CANARY_JOB``).
"""

from __future__ import annotations

from . import (
    autoapprove,
    canary,
    environment,
    errors,
    idle_screen,
    metrics,
    modes,
    names,
    report,
    resume,
    screen,
)
from .canary import *  # noqa: F403  (each module's __all__ is its public surface)
from .environment import *  # noqa: F403
from .idle_screen import *  # noqa: F403
from .metrics import *  # noqa: F403
from .report import *  # noqa: F403

__all__ = [
    *canary.__all__,
    *environment.__all__,
    *idle_screen.__all__,
    *metrics.__all__,
    *report.__all__,
    "autoapprove",
    "canary",
    "environment",
    "errors",
    "idle_screen",
    "metrics",
    "modes",
    "names",
    "report",
    "resume",
    "screen",
]
