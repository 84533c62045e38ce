"""Shared fixtures: one real multi-process Dask cluster for the session, data, xp."""

from __future__ import annotations

import contextlib
import os

import dask
import numpy as np
import pytest

from dkmeans.testing import local_cluster, make_blobs
from tests.helpers import usable_cupy

# The suite runs with the settings a user's fit gets: small in-memory data is fitted in
# the calling process, small Dask loops inside one task, larger ones SPMD. The other
# modes run where a test asks for them: ``graph_loop`` (one graph per Lloyd iteration),
# ``single_task`` and ``spmd`` (which also check the mode was taken), ``on_cluster``
# (in-memory data sent to the cluster); test_lloyd.py runs every Lloyd test in each mode.
# Kernels compile eagerly in the tests, so that a fit never mixes the NumPy and compiled
# paths (which agree to rounding only) and results compare exactly.
os.environ["DASK_DKMEANS__COMPILE"] = "eager"  # CLI subprocesses and the cluster's workers
# dask read the environment when imported (above), so this process needs the setting itself
dask.config.set({"dkmeans.compile": "eager"})


@pytest.fixture
def graph_loop(monkeypatch):
    """Lloyd loops run one graph per iteration (also in CLI subprocesses)."""
    monkeypatch.setenv("DASK_DKMEANS__SINGLE_TASK_WORK", "0")
    monkeypatch.setenv("DASK_DKMEANS__SPMD", "False")
    with dask.config.set({"dkmeans.single-task-work": 0, "dkmeans.spmd": False}):
        yield


@pytest.fixture
def on_cluster(monkeypatch):
    """In-memory (NumPy, pandas) data is sent to the cluster instead of being fitted in-process."""
    monkeypatch.setenv("DASK_DKMEANS__IN_PROCESS_BYTES", "0")
    with dask.config.set({"dkmeans.in-process-bytes": 0}):
        yield


@pytest.fixture
def single_task(monkeypatch, on_cluster):
    """Small Lloyd loops run inside one task (the default for Dask data); yields the calls."""
    from dkmeans.config import KEYS
    from dkmeans.engine.persisted import PersistedData

    DEFAULT_SINGLE_TASK_WORK = KEYS["single-task-work"].default

    calls = []
    original = PersistedData._run_in_one_task

    def spy(self, fn, args):
        calls.append(fn.__name__)
        return original(self, fn, args)

    monkeypatch.setattr(PersistedData, "_run_in_one_task", spy)
    monkeypatch.setenv("DASK_DKMEANS__SINGLE_TASK_WORK", str(DEFAULT_SINGLE_TASK_WORK))
    monkeypatch.setenv("DASK_DKMEANS__SPMD", "False")
    with dask.config.set(
        {"dkmeans.single-task-work": DEFAULT_SINGLE_TASK_WORK, "dkmeans.spmd": False}
    ):
        yield calls


@pytest.fixture
def spmd(monkeypatch, on_cluster):
    """Lloyd loops run SPMD (the default for loops too large for one task, forced here); yields the ranks' calls."""
    import dkmeans.engine.spmd

    calls = []
    original = dkmeans.engine.spmd.run_spmd

    def spy(data, fn, args=(), on_progress=None):
        calls.append(fn.__name__)
        return original(data, fn, args, on_progress)

    monkeypatch.setattr(dkmeans.engine.spmd, "run_spmd", spy)
    monkeypatch.setenv("DASK_DKMEANS__SPMD", "True")
    monkeypatch.setenv("DASK_DKMEANS__SINGLE_TASK_WORK", "0")
    with dask.config.set({"dkmeans.spmd": True, "dkmeans.single-task-work": 0}):
        yield calls


def _freeze_long_lived(import_first: bool = False) -> int:
    """Run on each worker of a session cluster: collect, then freeze what is left out of the garbage
    collector's later passes (:func:`gc.freeze`); with ``import_first``, after importing what a fit
    imports. Returns how many objects are frozen.

    Every fit on a cluster measures its workers (the memory probe), which starts with a full
    ``gc.collect()`` on each, as do the out-of-core fits' releases: 0.25-0.35 s a fit on 2 busy
    cores for a worker holding the objects of dask, pandas, pyarrow and numba (190,000 from their
    imports, 260,000 once kernels are loaded), 1-2 ms once they are frozen: a third of the wall
    time of tests/faces/test_column_types.py. Objects created later are collected as before (and
    frozen ones are still freed when their last reference goes); the kernels are not loaded here
    (tests/engine/test_memory_probe.py sees its workers load them).
    """
    import gc

    if import_first:
        import dask.array  # noqa: F401
        import dask.dataframe  # noqa: F401
        import numba  # noqa: F401
        import pyarrow.parquet  # noqa: F401

        import dkmeans.drivers.lloyd  # noqa: F401
        import dkmeans.engine.persisted  # noqa: F401
        import dkmeans.engine.streamed  # noqa: F401
        import dkmeans.kernels.warm  # noqa: F401
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


#: the session's clusters (:func:`client`, :func:`single_worker_client`) once started
_SESSION_CLUSTERS: list = []


@contextlib.contextmanager
def _session_cluster(n_workers: int, **options):
    with local_cluster(n_workers, **options) as c:
        c.run(_freeze_long_lived, True)
        _SESSION_CLUSTERS.append(c)
        try:
            yield c
        finally:
            _SESSION_CLUSTERS.remove(c)


@pytest.fixture(autouse=True, scope="module")
def _freeze_long_lived_objects():
    """At each test module's start, what this process and the session clusters' workers hold by
    then (modules, kernels loaded by earlier modules' fits) is frozen (see
    :func:`_freeze_long_lived`): the automatic full collections of this process, which grew with
    the suite's modules to 0.2 s each (5 s of tests/fit + tests/faces), and the workers' probes
    then pass over new objects only."""
    _freeze_long_lived()
    for c in _SESSION_CLUSTERS:
        c.run(_freeze_long_lived, on_error="ignore")
    yield


@pytest.fixture(scope="session")
def client():
    """A 2-worker, 1-thread-per-worker LocalCluster (processes), set as the current client."""
    with _session_cluster(2, set_as_default=True) as c, c.as_current():
        yield c


@pytest.fixture(scope="session")
def single_worker_client():
    """A second cluster with one worker, for worker-count invariance."""
    with _session_cluster(1) as c:
        yield c


@pytest.fixture
def blobs():
    """Well separated blobs (float64): X, true labels, true centres."""
    return make_blobs(3000, 4, 5, spread=1.0, box=10.0, seed=1)


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory):
    """Blobs with a truth and an id column, as a folder of two Parquet files and a CSV file:
    ``(root, frame)`` (the command-line tests, in-process and in subprocesses)."""
    import pandas as pd

    root = tmp_path_factory.mktemp("cli")
    X, truth, _ = make_blobs(6000, 2, 4, spread=0.8, seed=3)
    df = pd.DataFrame(X, columns=["a", "b"])
    df["truth"] = truth
    df["id"] = [f"row{i}" for i in range(len(df))]
    (root / "data").mkdir()
    df.iloc[:2500].to_parquet(root / "data" / "part0.parquet")
    df.iloc[2500:].to_parquet(root / "data" / "part1.parquet")
    df.to_csv(root / "data.csv", index=False)
    return root, df


#: The values of Dask config ``dkmeans.kernels.backend``: the compiled loops chosen per shape,
#: the compiled loops around BLAS products, the namespace code.
KERNEL_BACKENDS = ("auto", "blas", "numpy")


@pytest.fixture(params=KERNEL_BACKENDS)
def kernel_backend(request):
    """Runs the test under each ``dkmeans.kernels.backend`` setting (narrow it with
    ``@pytest.mark.parametrize("kernel_backend", [...], indirect=True)``); yields the setting."""
    with dask.config.set({"dkmeans.kernels.backend": request.param}):
        yield request.param


@pytest.fixture
def kernel_plan(request, monkeypatch):
    """The test runs under a kernel plan (:class:`dkmeans.kernels.plans.KernelPlan`), in a process
    that has loaded no compiled loops yet (as a fresh one: the size rule of ``plans.plan`` applies).

    The path is ``"compiled"`` unless the test asks for another with
    ``@pytest.mark.parametrize("kernel_plan", ["numpy"], indirect=True)``, or for none (``None``:
    the fit service chooses, under ``dkmeans.compile = "auto"``); yields the plan (or None).
    """
    from dkmeans.kernels import plans

    monkeypatch.setattr(plans, "_loaded", set())
    path = getattr(request, "param", "compiled")
    if path is None:
        with dask.config.set({"dkmeans.compile": "auto"}):
            yield None
        return
    with plans.KernelPlan(
        path, dask.config.get("dkmeans.kernels.backend", "auto")
    ).applied() as plan:
        yield plan


@pytest.fixture(params=["numpy", "cupy"])
def xp(request):
    """Array namespaces to test kernels with (CuPy only where a GPU is present)."""
    if request.param == "numpy":
        return np
    return usable_cupy()


@pytest.fixture
def own_cluster():
    """A separate 2-worker cluster with nannies, for tests that kill or restart its workers."""
    with local_cluster(2) as c:
        yield c


def pytest_collection_modifyitems(config, items):
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "xp" in fixtures and "cupy" in item.name:
            item.add_marker(pytest.mark.gpu)
        if "own_cluster" in fixtures:  # kills or restarts workers of its own cluster: a system test
            item.add_marker(pytest.mark.system)
