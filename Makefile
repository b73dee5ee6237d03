# Sluicegate: the two front-door commands are `make run` and `make test`.
# Both install what they need (Python venv, Debian packages) on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_PACKAGES := wamerican-insane postgresql
BENCH_PACKAGES := redis-server redis-tools nginx wrk gcc

export PYTHONDONTWRITEBYTECODE :=

.PHONY: run test lint format bench bench-import clean venv test-deps bench-deps
.PHONY: loadtest-deps experiment
.PHONY: bench-patterns
.PHONY: cdk-cli synth deploy destroy bootstrap

# Install Debian packages that are missing (sudo when not root).
define apt_install
	@missing=""; for p in $(1); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	  $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$missing >/dev/null; \
	fi
endef

$(STAMP): pyproject.toml sdk/python/pyproject.toml requirements.txt requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check uv
	$(BIN)/uv pip install -q --python $(BIN)/python --compile-bytecode -r requirements-dev.txt -e . -e sdk/python
	touch $(STAMP)

venv: $(STAMP)

test-deps:
	$(call apt_install,$(TEST_PACKAGES))

bench-deps:
	$(call apt_install,$(BENCH_PACKAGES))

run: venv
	$(BIN)/sluicegate local

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

test: venv test-deps loadtest-deps cdk-cli lint
	$(BIN)/python -m pytest -q

bench: venv bench-deps
	$(BIN)/python bench/run.py

# Pattern resolution: mean PatternIndex.match time with 10, 1,000 and 100,000 patterns (about 10 s, CPU only).
bench-patterns: venv
	$(BIN)/python bench/patterns.py

# 1,000,000 rules into SQLite and PostgreSQL: time and peak memory (about 2 minutes).
bench-import: venv test-deps
	$(BIN)/python bench/import_rules.py

# Policy change (QED Fig. 9/10): rule write to enforcement with 100, 10,000 and 1,000,000 rules stored (about 2 minutes).
.PHONY: bench-policy
bench-policy: venv
	$(BIN)/python bench/policy_change.py

# Adaptive concurrency limit (OpenStack Algorithm 1) in a discrete-event simulation: sweep, trace of L (about 5 s, CPU only).
.PHONY: bench-adaptive
bench-adaptive: venv
	$(BIN)/python bench/adaptive_limit.py

# The same Algorithm 1 against a real upstream app behind `sluicegate proxy` (acquire): fixed-limit sweep, trace of L (~40 s).
.PHONY: bench-adaptive-upstream
bench-adaptive-upstream: venv
	$(BIN)/python bench/adaptive_upstream.py

# `sluicegate proxy` overhead: wrk against nginx directly vs through the proxy (pass, check, acquire); about 1 minute.
.PHONY: bench-proxy
bench-proxy: venv bench-deps
	$(BIN)/python bench/proxy_overhead.py

# Artillery for loadtest/ (about 590 MB, a minute the first time; nothing when installed): exactly
# the committed lock, no install scripts (a Playwright dependency would try to download a browser).
LOADTEST_STAMP := loadtest/node_modules/.installed
$(LOADTEST_STAMP): loadtest/package.json loadtest/package-lock.json
	cd loadtest && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	touch $(LOADTEST_STAMP)

loadtest-deps: $(LOADTEST_STAMP)

# The paper's application-integration experiment (Janus Fig. 13): two 60 s runs, about 2.5 minutes.
experiment: venv loadtest-deps
	$(BIN)/python -m loadtest.experiment.run

# AWS deployment (infra/): the CDK CLI pinned by package-lock.json, run with the app in cdk.json.
# Settings are CDK context: `make deploy CDK_CONTEXT="-c partitions=16 -c front=route53 ..."`.
CDK_STAMP := node_modules/.installed
CDK_QUIET := CDK_DISABLE_CLI_TELEMETRY=true CDK_DISABLE_VERSION_CHECK=1 JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20
CDK := $(CDK_QUIET) npx --no-install cdk
CDK_CONTEXT ?=
$(CDK_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $(CDK_STAMP)

cdk-cli: $(CDK_STAMP)

# Offline: no AWS account or credentials needed (and no EC2 metadata probe); writes cdk.out/.
synth: venv cdk-cli
	AWS_EC2_METADATA_DISABLED=true $(CDK) synth --quiet $(CDK_CONTEXT)

# Once per account and region, before the first deploy.
bootstrap: venv cdk-cli
	$(CDK) bootstrap $(CDK_CONTEXT)

# Needs AWS credentials and Docker (or Finch) able to build linux/arm64 images.
deploy: venv cdk-cli
	$(CDK) deploy $(CDK_CONTEXT)

destroy: venv cdk-cli
	$(CDK) destroy $(CDK_CONTEXT)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache bench/build build cdk.out
