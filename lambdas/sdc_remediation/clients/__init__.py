"""Every call out of the process, one module per service: HyperPod (SageMaker), the Kubernetes
API, CloudWatch metrics and Logs, SNS, Step Functions, Lambda, and the approve function's URL
(the operator CLI's side). Built on ``sdc_remediation.aws`` (lazy boto3 clients, AWS errors
turned into typed ones); DynamoDB tables are ``sdc_remediation.dal``'s."""
