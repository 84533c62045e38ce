"""A first fit on small data: the NumPy code, chosen by the fit's size, with the compiled loops' result.

The rule of :func:`dkmeans.kernels.plans.plan` (``dkmeans.compile = "auto"``): below
``NUMPY_FIT_WORK`` (elements x centroids x runs) an in-process fit runs the NumPy code unless the
process has loaded the compiled loops of its dtype and width, and compiles nothing; above, it
compiles at its first need. The two paths must give the same fit (the path a fit takes depends
on what ran before it in the process).
"""

from __future__ import annotations

import importlib
import warnings

import dask
import numpy as np
import pytest

import dkmeans
from dkmeans.kernels import plans

nearest = importlib.import_module("dkmeans.kernels.nearest")
placement = importlib.import_module("dkmeans.fit.placement")


def _data(n, d, k, kind, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if kind == "blobs":
        X = rng.normal(scale=8, size=(k, d))[rng.integers(0, k, n)] + rng.normal(size=(n, d))
    elif kind == "duplicated":
        X = rng.normal(size=(max(1, k // 2), d))[rng.integers(0, max(1, k // 2), n)]
    else:
        X = rng.normal(size=(n, d))
    return X.astype(dtype)


@pytest.mark.parametrize(
    "n, d, k, kind",
    [
        (3000, 8, 10, "blobs"),
        (800, 3, 2, "normal"),
        (300, 20, 1, "normal"),
        (60, 4, 45, "blobs"),
        (500, 5, 6, "duplicated"),
        (2000, 33, 7, "blobs"),
    ],
)
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
    assert a.inertia_ == pytest.approx(b.inertia_, rel=tol, abs=tol * scale**2)
    assert a.n_iter_ == b.n_iter_


@pytest.mark.parametrize("kernel_plan", [None], indirect=True)
def test_a_small_fit_runs_numpy_in_one_blas_thread(monkeypatch, kernel_plan):
    seen, blas = [], set()
    original = nearest._backend

    def spy(X, k):
        backend = original(X, k)
        seen.append(backend.value)
        blas.update(
            pool["num_threads"]
            for pool in placement._blas_pools().info()
            if pool["user_api"] == "blas"
        )
        return backend

    monkeypatch.setattr(nearest, "_backend", spy)
    X = _data(20_000, 8, 10, "blobs", np.float32)
    dkmeans.KMeans(n_clusters=10, random_state=0).fit(X)
    assert seen and set(seen) == {"numpy"}
    assert blas <= {1}, "its small BLAS products run in one thread"


def _asked(monkeypatch) -> list:
    """The arguments of every plan the fit service asks for."""
    asked = []
    original = placement.kernel_plan

    def spy(dtype, n_features, **kwargs):
        asked.append((n_features, kwargs["n_rows"], kwargs["n_clusters"]))
        return original(dtype, n_features, **kwargs)

    monkeypatch.setattr(placement, "kernel_plan", spy)
    return asked


def test_the_fit_service_counts_centroids_and_runs(monkeypatch):
    asked = _asked(monkeypatch)
    X = _data(500, 6, 4, "blobs", np.float32)
    dkmeans.KMeans(n_clusters=4, n_init=3, random_state=0).fit(X)
    assert asked == [(6, 500, 4 * 3)]


@pytest.mark.parametrize("kernel_plan", [None], indirect=True)
def test_a_fit_on_the_cluster_takes_the_size_rule_for_its_workers(
    monkeypatch, client, on_cluster, kernel_plan
):
    """A small fit on a cluster runs the NumPy code (no worker loads the compiled loops for it),
    whatever this process has loaded."""
    asked = _asked(monkeypatch)
    dkmeans.KMeans(n_clusters=3, random_state=0).fit(_data(400, 5, 3, "blobs", np.float32))
    assert asked == [(5, 400, 3)]
    plans.mark_loaded(np.float32, 5)
    assert plans.plan(np.float32, 5, n_rows=400, n_clusters=3, in_process=False).path == "numpy"
    assert plans.plan(np.float32, 5, n_rows=400, n_clusters=3).path == "compiled"
    assert (
        plans.plan(np.float32, 5, n_rows=10**6, n_clusters=30, in_process=False).path == "compiled"
    )


@pytest.mark.parametrize("kernel_plan", [None], indirect=True)
def test_the_path_is_chosen_by_size(kernel_plan):
    k, d = 10, 8
    below = -(-plans.NUMPY_FIT_WORK // (k * d)) - 1  # rows of the largest fit below the work bound
    assert plans.plan(np.float32, d, n_rows=below, n_clusters=k).path == "numpy"
    assert plans.plan(np.float64, d, n_rows=below + 1, n_clusters=k).path == "compiled"
    assert plans.plan(np.float32, d, n_rows=below, n_clusters=k).path == "numpy", (
        "another dtype's loops"
    )
    assert plans.plan(np.float32, d, n_rows=below + 1, n_clusters=k).path == "compiled"
    assert plans.plan(np.float32, d, n_rows=1, n_clusters=1).path == "compiled", (
        "loaded loops serve any fit"
    )
    assert plans.plan(np.float32, d + 1, n_rows=1, n_clusters=1).path == "numpy"
    # a fit of unknown rows or centroids compiles at its first need whatever its size
    assert plans.plan(np.float32, 3, n_rows=10).path == "compiled"
    assert plans.plan(np.float32, 5, n_clusters=1).path == "compiled"
    assert plans.plan(np.float32, 7, n_rows=10, n_clusters=1, sparse=True).path == "compiled"
    with dask.config.set({"dkmeans.kernels.backend": "numpy"}):
        assert plans.plan(np.float32, 9, n_rows=10**9, n_clusters=10) == plans.KernelPlan(
            "numpy", "numpy"
        )


@pytest.mark.parametrize("kernel_plan", [None], indirect=True)
def test_preparing_loads_the_loops_for_later_small_fits(kernel_plan):
    """``warm.prepare`` (a worker's preparation, and ``dkmeans warm-up``) loads the compiled loops of
    one dtype and width; small fits of those then take them."""
    from dkmeans.kernels import warm

    assert plans.plan(np.float32, 6, n_rows=100, n_clusters=2).path == "numpy"
    warm.prepare(plans.KernelPlan("numpy", "auto"), np.float32, 6)
    assert plans.plan(np.float32, 6, n_rows=100, n_clusters=2).path == "numpy", (
        "a NumPy plan loads nothing"
    )
    warm.prepare(plans.KernelPlan("compiled", "auto"), np.float32, 6)
    assert plans.plan(np.float32, 6, n_rows=100, n_clusters=2).path == "compiled"
