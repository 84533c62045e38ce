# The two commands of the README: `make demo` and `make test`.
# Each creates .venv with $(PYTHON) (3.10+) if needed and installs the project into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench venv clean

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

# A smoke run by default (fewer rows); `make bench BENCH_ARGS=` runs the full sizes.
BENCH_ARGS ?= --quick

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	$(BIN)/python benchmarks/lloyd.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) dkmeans-demo-output .pytest_cache
