"""``max_iter`` and ``n_iter_`` in scikit-learn's meaning on every fit (issue 51).

``max_iter`` bounds every Lloyd loop of a fit, on the data or on a sample of it; ``n_iter_``
counts the Lloyd updates made on the data; ``max_iter=1`` is one Lloyd update from the seeding
(scikit-learn with the same initial centroids is the reference) and a larger ``max_iter``
never scores worse, at sizes on both sides of the sample's threshold and with both seedings.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.cluster import KMeans as SKKMeans

import dkmeans
import dkmeans.drivers.coreset as coreset_module
import dkmeans.drivers.local_search as local_search_module
import dkmeans.fit.runs as runs
import dkmeans.fit.service as service
from dkmeans.drivers.coreset import CORESET_MIN_ROWS, coreset_size
from dkmeans.ksweep import sweep as k_sweep


def _seeding_spy(monkeypatch) -> list:
    """The first run's seeding of every fit from now on (the plan's own, seeded)."""
    seen, real = [], service.fit_runs

    def spy(data, plan, state, checkpoint=None):
        seen.append(np.asarray(plan.initialise(0), dtype=np.float64))
        return real(data, plan, state, checkpoint)

    monkeypatch.setattr(service, "fit_runs", spy)
    return seen


def _lloyd_records(model) -> int:
    return sum(1 for r in model.history_ if r["algorithm"] == "lloyd")


def _blobs(n: int, seed: int, d: int = 4, k: int = 6) -> np.ndarray:
    """Overlapping blobs: Lloyd neither converges in one update nor empties a cluster."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-4, 4, size=(k, d))
    return centres[rng.integers(0, k, n)] + rng.normal(size=(n, d))


# -- scikit-learn's own test, at 10 seeds ---------------------------------------------------
ESTIMATORS = [dkmeans.KMeans, dkmeans.MiniBatchKMeans]


@pytest.mark.parametrize("init", ["k-means||", "k-means++"])
@pytest.mark.parametrize("estimator", ESTIMATORS, ids=["KMeans", "MiniBatchKMeans"])
def test_score_max_iter_as_scikit_learn(estimator, init):
    """scikit-learn's ``test_score_max_iter``: more iterations give a better score."""
    for seed in range(10):
        X = np.random.RandomState(seed).randn(100, 10)
        short = estimator(n_init=1, random_state=seed, max_iter=1, init=init).fit(X)
        long = estimator(n_init=1, random_state=seed, max_iter=10, init=init).fit(X)
        assert long.score(X) > short.score(X), seed
        assert short.n_iter_ == 1 and 1 <= long.n_iter_ <= 10


# -- the property: sizes around the sample's threshold, both seedings ------------------------
SIZES = st.sampled_from(
    [
        CORESET_MIN_ROWS // 2,
        CORESET_MIN_ROWS - 1,
        CORESET_MIN_ROWS,
        CORESET_MIN_ROWS + 1,
        CORESET_MIN_ROWS + 500,
        2 * CORESET_MIN_ROWS + 7,
        3 * CORESET_MIN_ROWS,
    ]
)
#: caps below the settle's and from it on (where the start may be settled on a sample)
BELOW = [1, 2, 3, 5, 6, 7, 9, 12, 20, runs.SETTLE_MAX_ITER - 1]
FROM = [runs.SETTLE_MAX_ITER, runs.SETTLE_MAX_ITER + 1, 2 * runs.SETTLE_MAX_ITER]


@settings(
    max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    n=SIZES,
    seed=st.integers(0, 2**16),
    init=st.sampled_from(["k-means||", "k-means++"]),
    caps=st.lists(st.sampled_from(BELOW + FROM), min_size=2, max_size=4, unique=True),
)
def test_max_iter_is_scikit_learns(n, seed, init, caps):
    X = _blobs(n, seed)
    with pytest.MonkeyPatch.context() as monkeypatch:
        seeding = _seeding_spy(monkeypatch)
        one = dkmeans.KMeans(6, init=init, n_init=1, max_iter=1, random_state=seed).fit(X)
    # one Lloyd update from the seeding: scikit-learn from the same centroids is the reference
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scikit-learn's "did not converge" at max_iter=1
        ref = SKKMeans(6, init=seeding[0], n_init=1, max_iter=1, algorithm="lloyd").fit(X)
    np.testing.assert_allclose(one.cluster_centers_, ref.cluster_centers_, rtol=1e-7, atol=1e-9)
    assert one.n_iter_ == 1 and _lloyd_records(one) == 1
    scores = {1: one.score(X)}
    for cap in caps:
        model = dkmeans.KMeans(6, init=init, n_init=1, max_iter=cap, random_state=seed).fit(X)
        # every Lloyd update on the data is counted, and no more than max_iter of them run
        assert model.n_iter_ == _lloyd_records(model) <= cap
        scores[cap] = model.score(X)
    # a larger max_iter never scores worse (score: minus the objective; float64 rounding aside);
    # where the start is settled on a sample, only among caps on the same side of the settle's
    settled = coreset_size(n, 6) <= runs.SETTLE_MAX_SHARE * n
    groups = [BELOW, FROM] if settled else [BELOW + FROM]
    for group in groups:
        ordered = [scores[cap] for cap in sorted(scores) if cap in group]
        for shorter, longer in zip(ordered, ordered[1:]):
            assert longer >= shorter - 1e-9 * abs(shorter), (sorted(scores), ordered)


# -- the settle on a sample: bounded by max_iter, not where the sample is the data ------------
def _spy_lloyd(monkeypatch, module) -> list:
    """``(max_iter, rows, n_iter)`` of every ``lloyd`` call made from ``module``."""
    calls, real = [], module.lloyd

    def spy(data, centroids, *, max_iter, **kw):
        result = real(data, centroids, max_iter=max_iter, **kw)
        calls.append((max_iter, data.n_rows, result.n_iter))
        return result

    monkeypatch.setattr(module, "lloyd", spy)
    return calls


@pytest.mark.parametrize("max_iter", [runs.SETTLE_MAX_ITER, 2 * runs.SETTLE_MAX_ITER])
def test_every_lloyd_loop_is_bounded_and_data_updates_counted(monkeypatch, max_iter):
    n = 12 * CORESET_MIN_ROWS  # the sample is a twelfth of the rows: the start is settled on it
    X = _blobs(n, 3, d=8, k=12)
    settles = []
    real_start = runs.coreset_start
    monkeypatch.setattr(
        runs,
        "coreset_start",
        lambda *a, **kw: settles.append(kw["max_iter"]) or real_start(*a, **kw),
    )
    on_coreset = _spy_lloyd(monkeypatch, coreset_module)  # the settle and the confirmations
    on_search = _spy_lloyd(monkeypatch, local_search_module)  # the search's rounds on the sample
    on_data = _spy_lloyd(monkeypatch, runs)
    model = dkmeans.KMeans(12, n_init=1, max_iter=max_iter, random_state=0).fit(X)
    on_sample = on_coreset + on_search
    assert settles == [runs.SETTLE_MAX_ITER]  # run whole: the same start whatever the cap
    assert all(n_iter <= cap <= max_iter for cap, _, n_iter in on_sample + on_data)
    assert any(rows < n for _, rows, _ in on_sample)  # the settle ran on the sample
    # n_iter_ counts the updates on the data: Lloyd's and every confirmation's, kept or not
    confirmations = sum(n_iter for _, rows, n_iter in on_sample if rows == n)
    first = sum(n_iter for _, rows, n_iter in on_data)
    assert model.n_iter_ == first + confirmations == _lloyd_records(model) <= max_iter


@pytest.mark.parametrize("n", [CORESET_MIN_ROWS // 4, CORESET_MIN_ROWS, CORESET_MIN_ROWS + 1])
def test_no_settle_where_the_sample_is_most_of_the_data(monkeypatch, n):
    """Where the sample would hold more than half of the rows the fit is Lloyd from the seeding
    (then the searches): the start is not settled on (nearly) the data itself."""
    monkeypatch.setattr(runs, "coreset_start", lambda *a, **kw: pytest.fail("settled on the data"))
    model = dkmeans.KMeans(8, n_init=1, random_state=1).fit(_blobs(n, 1))
    assert model.n_iter_ == _lloyd_records(model) <= 300


@pytest.mark.parametrize(
    "max_iter", [1, runs.SEARCH_AFTER_ITERS, runs.SEARCH_AFTER_ITERS + 1, runs.SETTLE_MAX_ITER - 1]
)
def test_max_iter_below_the_settles_settles_nothing(monkeypatch, max_iter):
    """Below the settle's own cap the start is the seeding's, even where the sample is small."""
    monkeypatch.setattr(runs, "coreset_start", lambda *a, **kw: pytest.fail("settled"))
    X = _blobs(12 * CORESET_MIN_ROWS, 2, d=8, k=12)
    model = dkmeans.KMeans(12, n_init=1, max_iter=max_iter, random_state=2).fit(X)
    assert model.n_iter_ == _lloyd_records(model) <= max_iter


def test_rejected_confirmation_counts(monkeypatch):
    """A confirmation the data rejects still made its Lloyd updates on the data: they count."""
    real = runs.coreset_local_search
    rejected = []

    def reject(*a, **kw):
        out = real(*a, **kw)
        if out.lloyd is not None and out.kept:  # the data's verdict overturned: the start stands
            out.kept, out.centroids = False, np.asarray(a[1])
        if out.lloyd is not None:
            rejected.append(out.lloyd.n_iter)
        return out

    monkeypatch.setattr(runs, "coreset_local_search", reject)
    X = _blobs(CORESET_MIN_ROWS, 5, d=8, k=30)
    model = dkmeans.KMeans(
        30, init="random", n_init=1, max_iter=40, random_state=5, local_search=True
    ).fit(X)
    assert rejected, "no confirmation ran: the case tests nothing"
    assert model.n_iter_ == _lloyd_records(model) <= 40


# -- mini-batch and the sweep: their own step counts ------------------------------------------
@pytest.mark.parametrize("max_iter", [1, 2, 5])
def test_minibatch_steps_bounded_by_max_iter(max_iter):
    X = _blobs(3000, 4)
    model = dkmeans.MiniBatchKMeans(
        6, batch_size=256, max_iter=max_iter, tol=0.0, max_no_improvement=None, random_state=4
    ).fit(X)
    # scikit-learn's counts: (max_iter * n) // batch_size steps, n_iter_ epochs of them
    assert model.n_steps_ == (max_iter * 3000) // 256
    assert model.n_iter_ == -(-model.n_steps_ * 256 // 3000) <= max_iter


@pytest.mark.parametrize("max_iter", [1, 2])
def test_minibatch_out_of_core_counts_passes(client, max_iter):
    """Out of core an epoch is a sequential pass: ceil(n / batch_size) steps, the last shorter."""
    import dask.array as da

    X = _blobs(1000, 8).astype(np.float32)
    model = dkmeans.MiniBatchKMeans(
        6,
        batch_size=300,
        max_iter=max_iter,
        tol=0.0,
        max_no_improvement=None,
        random_state=8,
        out_of_core=True,
    )
    model.fit(da.from_array(X, chunks=400))
    assert model.data_mode_ == "out-of-core"
    assert model.n_steps_ == max_iter * 4 and model.n_iter_ == max_iter


@pytest.mark.parametrize("max_iter", [1, 3, 300])
def test_sweep_counts_as_single_fits(max_iter):
    X = _blobs(CORESET_MIN_ROWS + 1, 6)
    sweep = k_sweep(X, [2, 5], max_iter=max_iter, random_state=6)
    for k in (2, 5):
        single = dkmeans.KMeans(k, max_iter=max_iter, random_state=6).fit(X)
        assert sweep.n_iter[k] == single.n_iter_ <= max_iter
        if max_iter == 1:
            assert sweep.n_iter[k] == 1
