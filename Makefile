# The two commands of the README: `make demo` and `make test`.
# Each creates .venv with $(PYTHON) (3.10+) if needed and installs the project into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-bounds bench venv clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/dkmeans demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -ra --durations=10

# `make test-bounds`: the kernel and default-path tests again with numba's bounds checks on
# (NUMBA_BOUNDSCHECK=1, compiled afresh in a scratch cache): an out-of-range index in a compiled
# loop raises IndexError there instead of corrupting memory. About 5 minutes on 2 cores.
BOUNDS_TESTS := tests/test_kernels.py tests/test_kernels_targets.py tests/test_default_path.py \
	tests/test_local_search.py tests/test_hartigan.py tests/test_minibatch.py

test-bounds: $(STAMP)
	cache=$$(mktemp -d) && NUMBA_BOUNDSCHECK=1 NUMBA_CACHE_DIR=$$cache $(BIN)/python -m pytest -q -ra \
		-p no:cacheprovider -k "not demo" $(BOUNDS_TESTS); status=$$?; rm -rf $$cache; exit $$status

# A smoke run by default (fewer rows); `make bench BENCH_ARGS=` runs the full sizes.
BENCH_ARGS ?= --quick

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	$(BIN)/python benchmarks/lloyd.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .venv-oldest dkmeans-demo-output .pytest_cache

# `make test-oldest`: the tests again in a separate .venv-oldest holding exactly the oldest
# versions pyproject.toml allows (the pins of .ci/oldest-constraints.txt, wheels only), on a
# subset of the suite: fit, predict and scikit-learn's estimator checks, the functional API,
# the CLI, DataFrames and Parquet, the kernels, the pass graph and the SPMD exchange (not the
# slow tests that kill or restart a cluster). About 1 minute to install and 3-4 minutes of
# tests on 2 busy cores, numba compiling every kernel afresh.
OLDEST_VENV := .venv-oldest
OLDEST_BIN := $(OLDEST_VENV)/bin
OLDEST_STAMP := $(OLDEST_VENV)/.installed
OLDEST_CONSTRAINTS := .ci/oldest-constraints.txt
OLDEST_TESTS := tests/test_estimator.py tests/test_sklearn_checks.py tests/test_functional.py tests/test_cli.py \
	tests/test_dataframe.py tests/test_kernels.py tests/test_graph.py tests/test_hartigan_faces.py \
	tests/test_mailbox.py tests/test_spmd.py
OLDEST_DESELECT := not killed_worker and not cluster_restart and not cannot_start

.PHONY: test-oldest

$(OLDEST_BIN)/python:
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_BIN)/python -m pip install --quiet --upgrade pip

$(OLDEST_STAMP): $(OLDEST_BIN)/python pyproject.toml $(OLDEST_CONSTRAINTS)
	$(OLDEST_BIN)/python -m pip install --quiet --only-binary=:all: -c $(OLDEST_CONSTRAINTS) -e ".[test]"
	touch $(OLDEST_STAMP)

test-oldest: $(OLDEST_STAMP)
	$(OLDEST_BIN)/python .ci/check_oldest.py $(OLDEST_CONSTRAINTS)
	$(OLDEST_BIN)/python -m pytest -q -ra --durations=10 -k "$(OLDEST_DESELECT)" $(OLDEST_TESTS)
