# Every target works from a fresh clone: .venv is created when missing, and
# made again when it runs another Python than $(PYTHON) (an upgrade, or
# PYTHON=python3.12): a Python is its version and its base installation.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-test

# The benchmarks have a virtualenv of their own: arq pins redis-py below 6,
# which must not change the redis-py the tests run on.
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed-bench
LAB_STAMP := $(VENV)/.installed-lab

.PHONY: test lint typecheck pytest bench lab clean screenshot

PYTHON_ID := import sys; print(sys.version.split()[0], sys.base_prefix)
WANT_PYTHON := $(shell $(PYTHON) -c '$(PYTHON_ID)' 2>/dev/null)
VENV_PYTHON := $(shell $(BIN)/python -c '$(PYTHON_ID)' 2>/dev/null)
ifneq ($(VENV_PYTHON),$(WANT_PYTHON))
.PHONY: $(BIN)/python
endif

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "keyqueue needs Python >= 3.11 and '$(PYTHON)' is not; try: make PYTHON=python3.11 $(MAKECMDGOALS)" >&2; \
	  exit 1; }
	@if [ -d $(VENV) ]; then \
	  echo "$(VENV) runs another Python ($(or $(VENV_PYTHON),none that starts)); making it again with $(PYTHON) ($(WANT_PYTHON))"; \
	fi
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

$(LAB_STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[lab]'
	touch $(LAB_STAMP)

# The project's main command: the firehose lab with its defaults.
lab: $(LAB_STAMP)
	$(BIN)/keyqueue lab firehose

test: $(STAMP) lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy --strict src/keyqueue

pytest: $(STAMP)
	$(BIN)/python -m pytest -q

# Re-make docs/lab-web.png, the README's picture of `keyqueue lab web`, in the
# test run's browser (Debian's chromium: apt-get install chromium).
screenshot: $(STAMP)
	KEYQUEUE_UPDATE_SCREENSHOT=1 KEYQUEUE_REQUIRE_BROWSER=1 \
		$(BIN)/python -m pytest -q tests/test_web.py -k screenshot

$(BENCH_STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "keyqueue needs Python >= 3.11 and '$(PYTHON)' is not; try: make PYTHON=python3.11 bench" >&2; \
	  exit 1; }
	test -x $(BENCH_VENV)/bin/python || { $(PYTHON) -m venv $(BENCH_VENV) && \
	  $(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip; }
	$(BENCH_VENV)/bin/python -m pip install --quiet -e '.[bench]'
	touch $(BENCH_STAMP)

# Not part of `make test`: timings need a quiet machine. Writes docs/benchmarks.md
# (the distributed section runs arq, SAQ and rq beside keyqueue.redis on one
# private valkey-server).
bench: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python benchmarks/run.py

clean:
	rm -rf $(VENV) $(BENCH_VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
