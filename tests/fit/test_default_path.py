"""The default path a first-hour user takes: default estimators on small data, both kernel code paths.

Property-based (Hypothesis) over shapes, k from 1 to n, seeds, dtypes and input kinds (dense,
CSR, duplicated rows), on the NumPy code path that every first fit of a process takes
(``dkmeans.compile="off"`` forces it) and on the compiled one (``"eager"``): every fit ends
with centres whose ``predict`` is the nearest centre (a float64 reference), never another
exception, never a dead process. Then the regressions the fuzz of issue 29 found, the
kernels' refusal of zero centroids, the warm-up that cannot start from empty probes, and the
one code path of a fit.
"""

from __future__ import annotations

import importlib
import threading
import warnings

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dkmeans
from dkmeans.kernels import assign, assign_partials, distances, plans
from dkmeans.kernels.seeding import Nearest, update_nearest
from tests.helpers import sq_distances

assign_module = importlib.import_module("dkmeans.kernels.nearest")

PATHS = {"numpy": "off", "compiled": "eager"}
SETTINGS = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _assert_nearest(X, C, labels):
    """``labels`` name a nearest centre of each row (up to the float32 rounding of the distances)."""
    D = sq_distances(X, C)
    chosen = D[np.arange(D.shape[0]), np.asarray(labels)]
    best = D.min(axis=1)
    scale = (np.abs(X.toarray() if sp.issparse(X) else X).max() + np.abs(C).max()) ** 2
    np.testing.assert_array_less(chosen - best, 1e-5 * scale + 1e-12)


@st.composite
def small_data(draw):
    """(X, k): dense, CSR or duplicated rows; float32 or float64; k from 1 to n."""
    kind = draw(st.sampled_from(["normal", "blobs", "duplicated", "csr"]))
    n = draw(st.integers(1, 400))
    d = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**16))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    rng = np.random.default_rng(seed)
    if kind == "normal":
        X = rng.normal(size=(n, d))
    elif kind == "blobs":
        centres = rng.normal(scale=10, size=(draw(st.integers(1, 5)), d))
        X = centres[rng.integers(0, len(centres), n)] + rng.normal(size=(n, d))
    elif kind == "duplicated":  # few distinct points, each repeated
        distinct = draw(st.integers(1, 4))
        X = rng.normal(size=(distinct, d))[rng.integers(0, distinct, n)]
    else:
        X = sp.random(n, d, density=draw(st.floats(0.05, 1.0)), random_state=seed, format="csr")
    X = X.astype(dtype)
    k = draw(
        st.one_of(st.integers(1, min(3, n)), st.integers(1, n))
    )  # small k is where k-means|| rounds draw nothing
    return X, k, seed


@pytest.mark.parametrize(
    "estimator", [dkmeans.KMeans, dkmeans.MiniBatchKMeans], ids=["KMeans", "MiniBatchKMeans"]
)
@pytest.mark.parametrize("path", sorted(PATHS))
@SETTINGS
@given(case=small_data())
def test_default_estimators_fit_any_small_input(estimator, path, case):
    X, k, seed = case
    with dask.config.set({"dkmeans.compile": PATHS[path]}), warnings.catch_warnings():
        warnings.simplefilter(
            "ignore"
        )  # fewer distinct points than clusters warns, as scikit-learn does
        km = estimator(n_clusters=k, random_state=seed).fit(X)
        predicted = km.predict(X)
    C = km.cluster_centers_
    assert C.shape == (k, X.shape[1]) and np.all(np.isfinite(C))
    _assert_nearest(X, C, km.labels_)
    _assert_nearest(X, C, predicted)
    reference = sq_distances(X, C).min(axis=1).sum()
    dense = X.toarray() if sp.issparse(X) else X
    rounding = (
        X.shape[0]
        * float(np.finfo(X.dtype).eps)
        * 4
        * float(np.max(dense**2, initial=0) + np.max(C**2))
    )
    assert km.inertia_ == pytest.approx(reference, rel=1e-4, abs=rounding)


def test_more_clusters_than_rows_is_the_documented_error():
    X = np.random.default_rng(0).normal(size=(5, 3))
    with pytest.raises(ValueError, match="n_samples=5 should be >= n_clusters=6"):
        dkmeans.KMeans(n_clusters=6).fit(X)


# -- the cases the issue named ---------------------------------------------------------------
@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize(
    "k, seed, shape", [(1, 0, (800, 34)), (1, 2, (679, 17)), (2, 18, (208, 60)), (3, 1, (410, 31))]
)
def test_small_k_default_fit_where_a_round_draws_no_candidate(path, k, seed, shape):
    """k-means|| rounds that draw nothing (normal at small k) once crashed the fit or the process."""
    X = np.random.default_rng(seed).normal(size=shape)
    with dask.config.set({"dkmeans.compile": PATHS[path]}):
        km = dkmeans.KMeans(n_clusters=k, random_state=seed).fit(X)
    _assert_nearest(X, km.cluster_centers_, km.labels_)


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("k", [1, 2])
def test_small_k_default_fit_on_csr(path, k):
    X = sp.random(689, 38, density=0.2, random_state=0, format="csr")
    with dask.config.set({"dkmeans.compile": PATHS[path]}):
        km = dkmeans.KMeans(n_clusters=k, random_state=0).fit(X)
    _assert_nearest(X, km.cluster_centers_, km.labels_)


@pytest.mark.parametrize("k", [3, 5, 40])
def test_two_distinct_points_many_clusters(k):
    """Objective 0 after Lloyd: local search has nothing to improve (once a division by zero)."""
    X = np.repeat(np.random.default_rng(3).normal(size=(2, 7)), 20, axis=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        km = dkmeans.KMeans(n_clusters=k, random_state=3).fit(X)
    assert km.inertia_ == pytest.approx(0.0, abs=1e-9)
    _assert_nearest(X, km.cluster_centers_, km.labels_)


# -- kernels: no centroid is an error, not a crash -------------------------------------------
@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize(
    "X",
    [np.ones((50, 8), np.float32), np.ones((50, 40)), sp.random(50, 8, 0.3, format="csr")],
    ids=["direct", "streamed", "csr"],
)
def test_kernels_refuse_zero_centroids(path, X):
    C = np.empty((0, X.shape[1]), dtype=X.dtype)
    with dask.config.set({"dkmeans.compile": PATHS[path]}):
        for kernel in (assign, assign_partials, distances):
            with pytest.raises(ValueError, match="at least one centroid"):
                kernel(X, C)
        with pytest.raises(ValueError, match="features"):
            assign(X, np.ones((3, X.shape[1] + 1), dtype=X.dtype))


def test_update_nearest_keeps_the_state_when_a_round_drew_nothing():
    X = np.random.default_rng(0).normal(size=(30, 4))
    state = update_nearest(X, None, X[:2], 0)
    same = update_nearest(X, state, X[:0], 2)
    np.testing.assert_array_equal(same.sq_dist, state.sq_dist)
    np.testing.assert_array_equal(same.index, state.index)
    with pytest.raises(ValueError, match="at least one candidate"):
        update_nearest(X, None, X[:0], 0)
    assert isinstance(same, Nearest)


# -- the warm-up (make demo once printed a ZeroDivisionError from it) -----------------------
def test_empty_probes_compile_nothing(kernel_plan):
    """Dask probes a block function with (0, 0) arrays: they take the NumPy code, whatever the plan."""
    from dkmeans.kernels.backends import select

    for X in (
        np.empty((0, 0), np.float32),
        np.empty((0, 5), np.float64),
        np.empty((4, 0), np.float32),
    ):
        assert assign_module._backend(X, 3) is select.Backend.NUMPY
    with pytest.raises(ValueError, match="at least one feature"):
        assign_module._warm_up(np.dtype(np.float32), 0, 4)


def test_lazy_predict_warms_up_nothing_empty(client):
    """A lazy predict on a Dask array under the default rule: the workers log no failed compilation."""
    import dask.array as da

    X = da.from_array(
        np.random.default_rng(0).normal(size=(2000, 4)).astype(np.float32), chunks=500
    )
    km = dkmeans.KMeans(n_clusters=3, random_state=0).fit(X.compute())
    with dask.config.set({"dkmeans.compile": "auto"}):
        labels = km.predict(X).compute()
    _assert_nearest(X.compute(), km.cluster_centers_, labels)


# -- one code path per fit -------------------------------------------------------------------
def _record_paths(monkeypatch):
    """The code path of every assignment kernel call on float32 rows made in this (main) thread.

    (The k-means|| recluster runs the NumPy code on its float64 candidates whatever the fit's path.)
    """
    from dkmeans.kernels.backends.select import Backend

    seen = []
    original = assign_module._backend

    def spy(X, k):
        backend = original(X, k)
        if threading.current_thread() is threading.main_thread() and X.dtype == np.float32:
            seen.append("compiled" if backend in (Backend.COMPILED, Backend.BLAS) else "numpy")
        return backend

    monkeypatch.setattr(assign_module, "_backend", spy)
    return seen


@pytest.mark.parametrize("kernel_plan", [None], indirect=True)
def test_a_fit_keeps_one_code_path(monkeypatch, kernel_plan):
    """The fit service chooses one plan: a small first fit runs on the NumPy code throughout, a larger
    one compiles at its first need and runs compiled throughout, and later small fits of the same
    rows' kind take the loaded compiled loops."""
    seen = _record_paths(monkeypatch)
    X = np.random.default_rng(0).normal(size=(3000, 24)).astype(np.float32)
    first = dkmeans.KMeans(n_clusters=4, random_state=0).fit(X)
    assert set(seen) == {"numpy"}, (
        "the first small fit of a process runs on the NumPy code throughout"
    )
    seen.clear()
    big = np.random.default_rng(1).normal(size=(60_000, 24)).astype(np.float32)
    dkmeans.KMeans(n_clusters=12, random_state=0, max_iter=2).fit(big)  # 60,000 x 24 x 12 > 2^24
    assert set(seen) == {"compiled"}, "a fit above the work bound runs compiled throughout"
    seen.clear()
    second = dkmeans.KMeans(n_clusters=4, random_state=0).fit(X)
    assert set(seen) == {"compiled"}, "once loaded, the compiled loops serve small fits too"
    # the two paths agree to rounding: the same partition here
    np.testing.assert_allclose(
        first.cluster_centers_, second.cluster_centers_, rtol=1e-4, atol=1e-4
    )
    assert not any(t.name == "dkmeans-compile" for t in threading.enumerate()), (
        "no compiling thread"
    )


def test_the_compile_setting_chooses_the_path():
    """``dkmeans.compile``: "off" the NumPy code, "eager" the compiled loops whatever the size;
    "background", the former default, reads as "auto"."""
    for mode, path in (("off", "numpy"), ("eager", "compiled")):
        with dask.config.set({"dkmeans.compile": mode}):
            assert plans.plan(np.float32, 4, n_rows=10, n_clusters=1).path == path
            assert plans.plan(np.float32, 4).path == path
    with dask.config.set({"dkmeans.compile": "background"}):
        assert plans.compile_mode() == "auto"


def _path_chunk(X, w, offset):
    return [plans.current().path]


def _pin_chunk(X, w, offset):
    return [(plans.current().path, plans.backend_setting())]


def _pin_loop(data):
    return data.map_reduce(_pin_chunk, lambda parts: sum(parts, []))


def _path_loop(data):
    return data.map_reduce(_path_chunk, lambda parts: sum(parts, []))


@pytest.mark.parametrize("mode", ["graph_loop", "single_task", "spmd"])
@pytest.mark.parametrize("path", ["numpy", "compiled"])
def test_the_plan_reaches_every_task(client, request, mode, path):
    """The placed data carries the fit's plan (path and backend setting) into its tasks: plain passes
    and loops in every mode."""
    import dask.array as da

    from dkmeans.engine import PersistedData

    request.getfixturevalue(mode)
    X = da.from_array(np.random.default_rng(0).normal(size=(4000, 3)), chunks=500)
    data = PersistedData(client, X)
    try:
        data.plan = plans.KernelPlan(path, "auto")
        assert set(data.map_reduce(_path_chunk, lambda parts: sum(parts, []))) == {path}
        assert set(data.run_loop(_path_loop, work_per_row=1.0)) == {path}
        # the client's dkmeans.kernels.backend travels in the plan (the workers' own config says "auto")
        with dask.config.set({"dkmeans.kernels.backend": "numpy"}):
            assert plans.plan(np.float64, 3) == plans.KernelPlan("numpy", "numpy"), (
                "the setting takes no loops"
            )
        data.plan = plans.KernelPlan(path, "numpy")
        assert set(data.map_reduce(_pin_chunk, lambda parts: sum(parts, []))) == {(path, "numpy")}
        assert set(data.run_loop(_pin_loop, work_per_row=1.0)) == {(path, "numpy")}
    finally:
        data.release()


def test_workers_without_room_for_the_compiled_kernels_take_the_numpy_plan(
    client, monkeypatch, caplog, on_cluster
):
    """The placement narrows a compiled plan to the NumPy code where loading the compiled kernels would
    take a worker past its pause threshold, and the tasks follow the narrowed plan; the fit says so."""
    import dask.array as da

    from dkmeans.engine import memory
    from dkmeans.engine.place import place_data
    from dkmeans.fit.inputs import as_dataset

    X = da.from_array(np.random.default_rng(0).normal(size=(4000, 3)), chunks=500)
    for room, path in ((True, "compiled"), (False, "numpy")):
        monkeypatch.setattr(memory, "_room_for_kernels", lambda *args, room=room: room)
        data = place_data(client, as_dataset(X), None, plan=plans.KernelPlan("compiled", "blas"))
        try:
            assert data.plan == plans.KernelPlan(path, "blas")
            assert set(data.map_reduce(_pin_chunk, lambda parts: sum(parts, []))) == {
                (path, "blas")
            }
        finally:
            data.release()
    with caplog.at_level("INFO", logger="dkmeans"):
        km = dkmeans.KMeans(n_clusters=3, random_state=0).fit(X)
    assert "no room below their pause threshold" in caplog.text
    _assert_nearest(X.compute(), km.cluster_centers_, km.labels_.compute())
