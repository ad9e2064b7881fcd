"""sdc_remediation: the remediation workflow's domain layer and the operator CLI.

Layers, each importing only those below it (lambdas/README.md, "Layout"):

- the handlers: one folder per step beside this package (``<step>/handler.py``), thin;
- ``logic/steps.py``: one function per step, what the handlers call;
- ``targets/``: what a per-node step acts on, resolved once from the suspect: a HyperPod node,
  or the live canary's reserved node;
- ``logic/``: the domain, one module per concern (``localize/``, ``admission``, ``cordon``,
  ``health``, ``approval``, ``replace``, ``recording``, ``notify``, ``shadow``,
  ``autoapprove``, ``outcomes``, ``stats``, ``sweeper``, ``operator_api``, ``canary/``);
- ``dal/``: the DynamoDB tables (ledger, approvals, canary runs);
- ``clients/``: every call out of the process (HyperPod, Kubernetes, CloudWatch, Logs, SNS,
  Step Functions, Lambda, the approve function's URL);
- ``models/``: the pydantic models of everything that crosses the workflow, and the plain data
  admission passes to the ledger (``models.admission``; the rule itself, ``logic.admission``,
  reaches the ledger as an argument);
- shared: ``config`` (the environment), ``errors`` (class names are the workflow's contract),
  ``aws`` (lazy boto3 clients, AWS errors typed), ``observability``, ``clock``;
- ``cli/``: the operator CLI over ``dal``, ``logic`` and ``clients``.

Names that cross to the agent, infra or the CLI (report schema, check and verdict names,
metrics, environment, modes, the resume rule, the canary's reserved names) are the contract's
(``sdc_contract``), never defined here.
"""
