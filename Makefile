# The two commands users need: `make demo` and `make test`. Each bootstraps its own .venv.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export PYTHONUNBUFFERED := 1

CDK_CLI := node_modules/.bin/cdk

.PHONY: demo deploy-local test test-fast lint format synth bench clean cdk-cli

# Python: the venv with the pipeline, the agent and the test tools. No npm here: unit, agent and
# Lambda tests, the demo and Python synth (aws-cdk-lib needs Node.js, not the npm registry) run
# without the CDK CLI.
$(STAMP): requirements.txt requirements-dev.txt agent/pyproject.toml agent/contract/pyproject.toml lambdas/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $(STAMP)

# The pinned CDK CLI (package.json / package-lock.json), only for `cdk synth|deploy` and the
# deploy rehearsal.
$(CDK_CLI): package.json package-lock.json
	npm ci --no-audit --no-fund --silent
	touch $(CDK_CLI)

cdk-cli: $(CDK_CLI)

## demo: run the local end-to-end demo (CPU DDP job with an injected fault, embedded stand-ins)
demo: $(STAMP)
	$(PY) -m tests.e2e.demo $(ARGS)

## deploy-local: rehearse `cdk deploy` with the pinned CDK CLI on an embedded AWS (moto);
## ARGS=--update redeploys one changed context key, ARGS=--destroy tears down (docs/deploy.md)
deploy-local: $(STAMP) $(CDK_CLI)
	$(PY) -m tests.e2e.deploy_local $(ARGS)

## test: lint, then every test (unit, agent DDP, lambdas, infra, e2e). The CDK CLI is installed
## first when npm can reach its registry; without it every test runs except the deploy
## rehearsal, which fails with a message saying how to install the CLI.
test: $(STAMP) lint
	@$(MAKE) --no-print-directory $(CDK_CLI) || echo "warning: the pinned CDK CLI could not be installed (npm ci failed): the deploy rehearsal test will fail; every other test runs"
	$(PY) -m pytest $(PYTEST_ARGS)

## test-fast: lint, then every test not marked slow (no multi-process job, no synth, no e2e):
## a few minutes, for local iteration; CI runs `make test`
test-fast: $(STAMP) lint
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

## lint: ruff, then mypy (the agent, the contract, the Lambdas, the CDK app: pyproject.toml's
## [tool.mypy]); its cache is .mypy_cache (about 2 minutes cold, seconds warm)
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

synth: $(STAMP) $(CDK_CLI)
	npx cdk synth --quiet

## bench: every benchmark behind a figure of docs/performance.md, one at a time, with the flags
## the figures were measured with; raw results (with the command, machine, load and versions) in
## benchmarks/results/, then the doc's tables rendered from them (benchmarks/render.py).
## BENCH=job,job runs a subset (`python benchmarks/bench.py --list` names them and their last
## run times); ARGS passes bench.py's options (e.g. ARGS="--skip campaign").
bench: $(STAMP)
	$(PY) benchmarks/bench.py $(if $(BENCH),--only $(BENCH)) $(ARGS)

clean:
	rm -rf $(VENV) node_modules cdk.out .deploy-local .pytest_cache .mypy_cache
