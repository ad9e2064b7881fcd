"""The sdc-guard CDK app: the remediation pipeline (alarms -> EventBridge -> Step Functions ->
Lambdas -> ledger, notifications, dashboard) as one stack. See docs/deploy.md."""
