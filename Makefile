# The two commands users need: `make demo` and `make test`. Each bootstraps its own .venv.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export PYTHONUNBUFFERED := 1

.PHONY: demo deploy-local test lint format synth bench clean

$(STAMP): requirements.txt requirements-dev.txt agent/pyproject.toml agent/contract/pyproject.toml lambdas/pyproject.toml package.json
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	npm install --no-audit --no-fund --silent
	touch $(STAMP)

## demo: run the local end-to-end demo (CPU DDP job with an injected fault, embedded stand-ins)
demo: $(STAMP)
	$(PY) -m tests.e2e.demo $(ARGS)

## deploy-local: rehearse `cdk deploy` with the pinned CDK CLI on an embedded AWS (moto);
## ARGS=--update redeploys one changed context key, ARGS=--destroy tears down (docs/deploy.md)
deploy-local: $(STAMP)
	$(PY) -m tests.e2e.deploy_local $(ARGS)

## test: lint, then every test (unit, agent DDP, lambdas, infra, e2e)
test: $(STAMP) lint
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

synth: $(STAMP)
	npx cdk synth --quiet

bench: $(STAMP)
	$(PY) benchmarks/fingerprint.py
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/publish.py
	$(PY) benchmarks/collectives.py --model
	$(PY) benchmarks/collectives.py

clean:
	rm -rf $(VENV) node_modules cdk.out .deploy-local .pytest_cache
