#!/usr/bin/env python3
"""CDK entry point (`npx cdk synth|deploy`): settings come from cdk.json context, `-c key=value`
or `SDC_*` environment variables; see docs/deploy.md."""

import sys

import aws_cdk as cdk

from infra.app import build_app
from infra.config import ConfigError

app = cdk.App()
try:
    build_app(app)
except ConfigError as error:
    # One line the user can act on, not a jsii traceback.
    sys.exit(f"sdc-guard: {error}")
app.synth()
