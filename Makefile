# Every target works from a fresh clone: .venv is created when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-test

BENCH_STAMP := $(VENV)/.installed-bench
LAB_STAMP := $(VENV)/.installed-lab

.PHONY: test lint typecheck pytest bench lab clean screenshot

$(BIN)/python:
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

$(BENCH_STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	touch $(BENCH_STAMP)

# Not part of `make test`: timings need a quiet machine. Writes docs/benchmarks.md.
bench: $(BENCH_STAMP)
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
