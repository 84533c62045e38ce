# The two commands of the README: `make demo` and `make test`.
# Each creates .venv with $(PYTHON) (3.10+) if needed and installs the project into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DOCS_STAMP := $(VENV)/.installed-docs
DOCS_BUILD := docs/_build

.PHONY: demo test lint test-system test-quick test-bounds bench venv clean docs docs-inventories

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/dkmeans demo

# Every test but the long system cases (marked slow: `make test-system` runs them, CI runs both):
# about 10 minutes on 2 cores.
test: $(STAMP) lint
	$(BIN)/python -m pytest -q -ra --durations=15 -m "not slow"

# Formatting and lint by ruff (configured in pyproject.toml; a few seconds): `$(BIN)/ruff format .`
# and `$(BIN)/ruff check --fix .` repair most of what it finds.
lint: $(STAMP)
	$(BIN)/ruff format --check --quiet .
	$(BIN)/ruff check --quiet .

# The long system cases, whole: commands, scripts and notebooks run as processes of their own
# (the CLI, the deploy recipes, the examples, the docs' examples), commands stopped by signals,
# the out-of-core acceptance on memory-limited workers, killed workers, interrupted fits, SLURM
# (tests/system/conftest.py lists them). With the docs extra: tests/system/test_docs.py builds
# the site unless DKMEANS_DOCS_BUILD names one already built.
test-system: $(STAMP) $(DOCS_STAMP)
	$(BIN)/python -m pytest -q -ra --durations=15 -m slow

# The inner loop: every test but the system tests (tests/system/: subprocesses, faults,
# out-of-core clusters, deploy recipes).
test-quick: $(STAMP)
	$(BIN)/python -m pytest -q -ra --durations=10 -m "not system and not slow"

# `make test-bounds`: the kernel and default-path tests again with numba's bounds checks on
# (NUMBA_BOUNDSCHECK=1, compiled afresh in a scratch cache): an out-of-range index in a compiled
# loop raises IndexError there instead of corrupting memory. About 5 minutes on 2 cores.
BOUNDS_TESTS := tests/kernels/test_kernels.py tests/system/test_kernels_targets.py tests/fit/test_default_path.py \
	tests/drivers/test_local_search.py tests/drivers/test_hartigan.py tests/drivers/test_minibatch.py

test-bounds: $(STAMP)
	cache=$$(mktemp -d) && NUMBA_BOUNDSCHECK=1 NUMBA_CACHE_DIR=$$cache $(BIN)/python -m pytest -q -ra \
		-p no:cacheprovider -k "not demo" $(BOUNDS_TESTS); status=$$?; rm -rf $$cache; exit $$status

# A smoke run by default (fewer rows); `make bench BENCH_ARGS=` runs the full sizes.
BENCH_ARGS ?= --quick

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	$(BIN)/python benchmarks/lloyd.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .venv-oldest dkmeans-demo-output .pytest_cache docs/_build docs/_generated \
		docs/api/index.rst docs/api/generated docs/auto_examples

# `make docs`: the HTML site in docs/_build/html (user guide, API reference generated from the
# package, the gallery running examples/), warnings as errors (-W -n: every reference must
# resolve), then every internal link of the built pages checked. The warnings are also kept in
# docs/_build/warnings.log, which tests/system/test_docs.py reads. Needs no network (intersphinx
# reads docs/_inventories/). DKMEANS_DOCS_GALLERY=0 skips running the examples.
$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[docs]"
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	mkdir -p $(DOCS_BUILD)
	$(BIN)/python -m sphinx -b html -E -W --keep-going -n -q -j 1 -w $(DOCS_BUILD)/warnings.log \
		docs $(DOCS_BUILD)/html
	$(BIN)/python docs/_ext/check_links.py $(DOCS_BUILD)/html

# Download the intersphinx inventories again into docs/_inventories/ (needs the network).
docs-inventories: $(STAMP)
	$(BIN)/python docs/_ext/inventories.py

# `make test-oldest`: the tests again in a separate .venv-oldest holding exactly the oldest
# versions pyproject.toml allows (the pins of .ci/oldest-constraints.txt, wheels only), on a
# subset of the suite: fit, predict and scikit-learn's estimator checks, the functional API,
# the CLI (in process and its commands in processes of their own), DataFrames and Parquet, the
# kernels, the pass graph and the SPMD exchange (not the cases that kill or restart clusters, which
# are in other files of tests/system/). About 1 minute to install and 3-4 minutes of
# tests on 2 busy cores, numba compiling every kernel afresh.
OLDEST_VENV := .venv-oldest
OLDEST_BIN := $(OLDEST_VENV)/bin
OLDEST_STAMP := $(OLDEST_VENV)/.installed
OLDEST_CONSTRAINTS := .ci/oldest-constraints.txt
OLDEST_TESTS := tests/faces/test_estimator.py tests/faces/test_sklearn_checks.py tests/faces/test_functional.py \
	tests/faces/test_cli.py tests/system/test_cli_commands.py tests/faces/test_dataframe.py \
	tests/kernels/test_kernels.py tests/engine/test_graph.py tests/faces/test_hartigan_faces.py \
	tests/engine/test_mailbox.py tests/engine/test_spmd.py

.PHONY: test-oldest

$(OLDEST_BIN)/python:
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_BIN)/python -m pip install --quiet --upgrade pip

$(OLDEST_STAMP): $(OLDEST_BIN)/python pyproject.toml $(OLDEST_CONSTRAINTS)
	$(OLDEST_BIN)/python -m pip install --quiet --only-binary=:all: -c $(OLDEST_CONSTRAINTS) -e ".[test]"
	touch $(OLDEST_STAMP)

test-oldest: $(OLDEST_STAMP)
	$(OLDEST_BIN)/python .ci/check_oldest.py $(OLDEST_CONSTRAINTS)
	$(OLDEST_BIN)/python -m pytest -q -ra --durations=10 $(OLDEST_TESTS)
