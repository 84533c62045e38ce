"""A first fit on small data: the NumPy code, chosen by the fit's size, with the compiled loops' result.

The policy of :func:`dkmeans.kernels.backends.compile.resolve_path` (background mode): below
``NUMPY_FIT_WORK`` (elements x centroids x runs) a fit runs the NumPy code unless the loops are
compiled already, and starts no compilation; above, it starts one and waits as long as it
pays. The two paths must give the same fit (the path a fit takes depends on what ran before
it in the process).
"""

from __future__ import annotations

import importlib
import threading
import warnings

import dask
import numpy as np
import pytest

import dkmeans
from dkmeans.kernels.backends import compile as kernel_compile

nearest = importlib.import_module("dkmeans.kernels.nearest")
service = importlib.import_module("dkmeans.fit.service")


def _data(n, d, k, kind, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if kind == "blobs":
        X = rng.normal(scale=8, size=(k, d))[rng.integers(0, k, n)] + rng.normal(size=(n, d))
    elif kind == "duplicated":
        X = rng.normal(size=(max(1, k // 2), d))[rng.integers(0, max(1, k // 2), n)]
    else:
        X = rng.normal(size=(n, d))
    return X.astype(dtype)


@pytest.mark.parametrize("n, d, k, kind", [(3000, 8, 10, "blobs"), (800, 3, 2, "normal"), (300, 20, 1, "normal"),
                                           (60, 4, 45, "blobs"), (500, 5, 6, "duplicated"), (2000, 33, 7, "blobs")])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_and_compiled_paths_give_the_same_fit(n, d, k, kind, dtype):
    X = _data(n, d, k, kind, dtype)
    w = np.random.default_rng(1).uniform(0.5, 2.0, n) if kind == "blobs" else None
    fits = {}
    for mode in ("off", "eager"):  # the NumPy code, the compiled loops
        with dask.config.set({"dkmeans.compile": mode}), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # fewer distinct points than clusters
            fits[mode] = dkmeans.KMeans(n_clusters=k, random_state=0).fit(X, sample_weight=w)
    a, b = fits["off"], fits["eager"]
    np.testing.assert_array_equal(a.labels_, b.labels_)
    scale = float(np.abs(X).max())
    tol = 1e-5 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, rtol=tol, atol=tol * scale)
    assert a.inertia_ == pytest.approx(b.inertia_, rel=tol, abs=tol * scale ** 2)
    assert a.n_iter_ == b.n_iter_


@pytest.fixture
def fresh_compile_state(monkeypatch):
    """No kind compiled or started in this process, and no small fit counted (as in a fresh one)."""
    monkeypatch.setattr(kernel_compile, "_ready", set())
    monkeypatch.setattr(kernel_compile, "_started", set())
    monkeypatch.setattr(kernel_compile, "_small_fits", 0)


def _compiling() -> bool:
    return any(t.name == "dkmeans-compile" and t.is_alive() for t in threading.enumerate())


def test_a_small_fit_runs_numpy_and_no_compilation_competes_with_it(monkeypatch, fresh_compile_state):
    assert kernel_compile.wait_compiled(timeout=60)  # nothing of another test still compiling
    seen, blas = [], set()
    original = nearest._backend

    def spy(X, k):
        backend = original(X, k)
        seen.append((backend.value, _compiling()))
        blas.update(pool["num_threads"] for pool in service._blas_pools().info() if pool["user_api"] == "blas")
        return backend

    monkeypatch.setattr(nearest, "_backend", spy)
    X = _data(20_000, 8, 10, "blobs", np.float32)
    with dask.config.set({"dkmeans.compile": "background"}):
        dkmeans.KMeans(n_clusters=10, random_state=0).fit(X)
    assert seen and set(seen) == {("numpy", False)}
    assert kernel_compile._started == set()
    assert blas <= {1}, "its small BLAS products run in one thread"


def test_repeated_small_fits_compile_after_a_fit_for_the_next(monkeypatch, fresh_compile_state):
    """After SMALL_FITS_BEFORE_COMPILING small fits the compilation starts, when a fit has ended."""
    assert kernel_compile.wait_compiled(timeout=60)
    monkeypatch.setattr(kernel_compile, "SMALL_FITS_BEFORE_COMPILING", 2)
    warmed = []
    monkeypatch.setattr(kernel_compile, "_warm", lambda kind, warm_up, backend: warmed.append(kind))  # no compiling
    during = []
    original = nearest._backend
    monkeypatch.setattr(nearest, "_backend", lambda X, k: during.append(_compiling()) or original(X, k))
    X = _data(5_000, 8, 4, "blobs", np.float32)
    kinds = {kind for kind, _ in nearest.compiled_kinds(np.float32, 8)}
    with dask.config.set({"dkmeans.compile": "background"}):
        dkmeans.KMeans(n_clusters=4, random_state=0).fit(X)
        assert kernel_compile._started == set()
        dkmeans.KMeans(n_clusters=4, random_state=1).fit(X)
        assert kernel_compile._started == kinds, "the second small fit's end starts the compilation"
    kernel_compile.wait_compiled(timeout=30)
    assert set(warmed) == kinds
    assert during and not any(during), "no compilation ran during a fit"


def test_the_fit_service_counts_centroids_and_runs(monkeypatch):
    asked = []
    original = service.resolve_path

    def spy(kinds, n_elements, n_clusters=None):
        asked.append((n_elements, n_clusters))
        return original(kinds, n_elements, n_clusters)

    monkeypatch.setattr(service, "resolve_path", spy)
    X = _data(500, 6, 4, "blobs", np.float32)
    dkmeans.KMeans(n_clusters=4, n_init=3, random_state=0).fit(X)
    assert asked == [(500 * 6, 4 * 3)]


def test_a_fit_on_the_cluster_takes_no_size_rule(monkeypatch, client, on_cluster):
    """The size rule weighs this process's load of the compiled loops: a cluster's workers load them in theirs."""
    asked = []
    original = service.resolve_path
    monkeypatch.setattr(service, "resolve_path", lambda kinds, n, k=None: asked.append((n, k)) or original(kinds, n, k))
    dkmeans.KMeans(n_clusters=3, random_state=0).fit(_data(400, 5, 3, "blobs", np.float32))
    assert asked == [(400 * 5, None)]


def test_the_path_is_chosen_by_size(monkeypatch, fresh_compile_state):
    release = threading.Event()
    kind = ("test-small-fit", 1)
    kinds = [(kind, lambda: release.wait(30))]  # a compilation that ends when told
    k = 10
    below = -(-kernel_compile.NUMPY_FIT_WORK // k) - 1  # elements of the largest fit below the work bound
    monkeypatch.setattr(kernel_compile, "NUMPY_SECONDS_PER_ELEMENT", 1e-9)  # waits about a millisecond
    try:
        with dask.config.set({"dkmeans.compile": "background"}):
            assert kernel_compile.resolve_path(kinds, below, k) == "numpy"
            assert kernel_compile._started == set(), "a small fit starts no compilation"
            assert kernel_compile.resolve_path(kinds, below + 1, k) == "numpy"  # waited, then NumPy
            assert kind in kernel_compile._started, "a larger fit starts the compilation"
            release.set()
            assert kernel_compile.wait_compiled(timeout=30)
            assert kernel_compile.resolve_path(kinds, 1, 1) == "compiled", "compiled loops serve any fit once ready"
    finally:
        release.set()


def test_unknown_centroids_keep_the_element_rules(fresh_compile_state):
    kinds = [(("test-unknown-k", 1), lambda: None)]
    with dask.config.set({"dkmeans.compile": "background"}):
        assert kernel_compile.resolve_path(kinds, kernel_compile.COMPILE_FIRST_ELEMENTS) == "compiled"
        assert kernel_compile.resolve_path(kinds, kernel_compile.COMPILE_FIRST_ELEMENTS, 1) == "numpy"


def test_a_process_finishes_its_compilation_before_it_exits(monkeypatch, fresh_compile_state):
    """A background compilation left running is waited for at exit (numba's disk cache then serves the next process)."""
    kind = ("test-at-exit", 1)
    monkeypatch.setattr(kernel_compile, "NUMPY_SECONDS_PER_ELEMENT", 0.0)
    with dask.config.set({"dkmeans.compile": "background"}):
        elements = kernel_compile.COMPILE_FIRST_ELEMENTS // 2  # a fit that starts a compilation, not waiting for it
        path = kernel_compile.resolve_path([(kind, lambda: threading.Event().wait(0.3))], elements,
                                           -(-kernel_compile.NUMPY_FIT_WORK // elements))
    assert path == "numpy" and kind not in kernel_compile._ready
    assert kernel_compile._at_exit, "registered with atexit when the compilation started"
    assert kernel_compile.finish_at_exit(timeout=30)
    assert kind in kernel_compile._ready
