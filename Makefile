# ordrec: `make demo` (set up, train the built-in sample, serve, query) and
# `make test` (set up, run the test suite) work on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: venv demo test test-slow test-all proto proto-check lint lint-imports deploy-check redis browser h2load \
	lock docker-base docker-smoke clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

# Regenerate ordrec/v1/ (the Python gRPC code, and copies of the .proto files to ship) from proto/.
proto: $(STAMP)
	PYTHON=$(BIN)/python scripts/gen_proto.sh

# Fails when the committed generated code is stale.
proto-check: $(STAMP)
	PYTHON=$(BIN)/python scripts/gen_proto.sh --check

# Format, lint, types, import contracts and no block of code in two modules: what CI checks
# before the tests.
lint: $(STAMP) lint-imports
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python scripts/check_duplicates.py

# The import contracts of docs/architecture.md, "The parts" ([tool.importlinter] in pyproject.toml).
lint-imports: $(STAMP)
	$(BIN)/python scripts/lint_imports.py

# Render deploy/ (kubectl kustomize, or a built-in renderer without kubectl) and validate every
# object offline against the Kubernetes schemas (kubernetes-validate) and deploy/'s own rules.
deploy-check: $(STAMP)
	$(BIN)/python scripts/deploy_check.py

# The Docker image's dependencies, pinned with hashes (docs/docker.md): run after changing
# pyproject.toml's dependencies or extras, and commit requirements/*.txt.
UV_VERSION := 0.13.9
LOCK := $(BIN)/uv pip compile --quiet --universal --python-version 3.11 --generate-hashes \
	--custom-compile-command "make lock" pyproject.toml requirements/build.in --extra s3
lock: $(STAMP)
	$(BIN)/pip install --quiet "uv==$(UV_VERSION)"
	$(LOCK) -o requirements/serve.txt
	$(LOCK) --extra train --extra distributed -o requirements/train.txt

# A Debian bookworm base image made with debootstrap (root), for when Docker Hub is out of reach:
# then `make docker-smoke BASE=ordrec-base:bookworm`.
docker-base:
	scripts/docker_base.sh

# Build the images, train the sample in a container, serve it, health check, query, stop (docs/docker.md).
# Slow (minutes): not part of `make test`. BASE=image overrides the pinned base; DOCKER_NETWORK=host
# where the daemon has no bridge.
docker-smoke:
	scripts/docker_smoke.sh

redis:
	@scripts/ensure_redis.sh

# Chromium for the map-report browser test (skipped where it cannot be installed).
browser:
	@scripts/ensure_chromium.sh

# h2load for the load generator's tests and the service benchmark.
h2load:
	@scripts/ensure_h2load.sh

demo: $(STAMP)
	$(BIN)/python scripts/demo.py

# The fast suite: unit, property, gradient, end-to-end (real server, real Redis), one worker
# process per core (pytest-xdist, a test module's tests on one worker: its fixtures start once);
# TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= auto
test: $(STAMP) redis browser h2load proto-check lint-imports deploy-check
	$(BIN)/python -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadscope

# Real-data quality tests (ORDREC_DATA points at the data sets; default ../shared/data).
test-slow: $(STAMP) redis
	$(BIN)/python -m pytest -q -m slow

test-all: $(STAMP) redis browser proto-check
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .demo .pytest_cache test-artifacts
