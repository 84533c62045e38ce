"""Where dkmeans takes scikit-learn's meaning of a parameter or result (issue 29, item 5).

Each test holds dkmeans against scikit-learn's behaviour (or the documented rule where
scikit-learn has no equivalent): unit sample weights in ``MiniBatchKMeans.fit``,
``n_init="auto"`` with a callable ``init``, the ``init_size < n_clusters`` warning,
``verbose`` as a bool and its messages, exact zeros in ``transform`` for rows equal to a
centre, and where k-means|| puts the centres that data with fewer distinct points than
``n_clusters`` leaves unused.
"""

from __future__ import annotations

import re
import warnings

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.cluster import KMeans as SkKMeans
from sklearn.cluster import MiniBatchKMeans as SkMiniBatchKMeans
from sklearn.cluster import kmeans_plusplus
from sklearn.exceptions import ConvergenceWarning

from dkmeans import KMeans, MiniBatchKMeans
from dkmeans.drivers.init import InitOptions
from dkmeans.drivers.init.kmeans_parallel import kmeans_parallel
from dkmeans.engine.local import ChunkList
from dkmeans.errors import InvalidParameterError
from dkmeans.testing import make_blobs


@pytest.fixture(scope="module")
def X():
    return make_blobs(3000, 3, 6, spread=1.0, box=10.0, seed=2)[0]


# -- sample_weight=np.ones(n) is the unweighted fit ----------------------------------------
@pytest.mark.parametrize("init", ["k-means||", "k-means++", "random"])
def test_minibatch_unit_weights_give_the_unweighted_fit(X, init):
    """scikit-learn: ``fit(X, sample_weight=np.ones(n))`` is ``fit(X)``; so here, to the bit."""
    n = len(X)
    kwargs = dict(n_clusters=6, init=init, batch_size=200, random_state=1)
    plain = MiniBatchKMeans(**kwargs).fit(X)
    ones = MiniBatchKMeans(**kwargs).fit(X, sample_weight=np.ones(n))
    np.testing.assert_array_equal(ones.cluster_centers_, plain.cluster_centers_)
    np.testing.assert_array_equal(ones.labels_, plain.labels_)
    assert ones.n_steps_ == plain.n_steps_ and ones.inertia_ == plain.inertia_
    # equal weights draw uniformly too (scikit-learn: probability proportional to an equal weight)
    twice = MiniBatchKMeans(**kwargs).fit(X, sample_weight=np.full(n, 2.0))
    np.testing.assert_array_equal(twice.cluster_centers_, plain.cluster_centers_)
    assert twice.inertia_ == pytest.approx(2.0 * plain.inertia_, rel=1e-12)
    # partial_fit: unit weights are the unweighted steps, labels and inertia
    a, b = MiniBatchKMeans(**kwargs), MiniBatchKMeans(**kwargs)
    for part in (X[:1000], X[1000:2000]):
        a.partial_fit(part)
        b.partial_fit(part, sample_weight=np.ones(len(part)))
    np.testing.assert_array_equal(b.cluster_centers_, a.cluster_centers_)
    np.testing.assert_array_equal(b.labels_, a.labels_)
    assert b.inertia_ == a.inertia_


def test_minibatch_unit_weights_give_the_unweighted_fit_on_dask(client, X):
    kwargs = dict(n_clusters=6, batch_size=200, random_state=1)
    dX = da.from_array(X, chunks=700)
    plain = MiniBatchKMeans(**kwargs).fit(dX)
    ones = MiniBatchKMeans(**kwargs).fit(dX, sample_weight=da.ones(len(X), chunks=1000))
    np.testing.assert_array_equal(ones.cluster_centers_, plain.cluster_centers_)
    np.testing.assert_array_equal(ones.labels_.compute(), plain.labels_.compute())
    assert ones.inertia_ == pytest.approx(plain.inertia_, rel=1e-12)
    # and the in-process fit's (batches keyed by global row index)
    np.testing.assert_array_equal(
        MiniBatchKMeans(**kwargs).fit(X).cluster_centers_, plain.cluster_centers_
    )


def test_sklearn_unit_weights_give_its_unweighted_fit(X):
    """The behaviour matched above, on scikit-learn itself."""
    kwargs = dict(n_clusters=6, batch_size=200, random_state=1, n_init=1)
    a = SkMiniBatchKMeans(**kwargs).fit(X)
    b = SkMiniBatchKMeans(**kwargs).fit(X, sample_weight=np.ones(len(X)))
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)


# -- n_init="auto" --------------------------------------------------------------------------
def _counting_init(calls):
    def init(X, n_clusters, random_state):
        calls.append(1)
        return X[random_state.choice(len(X), n_clusters, replace=False)]

    return init


@pytest.mark.parametrize(
    "dk, sk, runs", [(KMeans, SkKMeans, 10), (MiniBatchKMeans, SkMiniBatchKMeans, 3)]
)
def test_n_init_auto_with_a_callable_init_runs_as_many_as_sklearn(X, dk, sk, runs):
    """scikit-learn's ``_check_params_vs_input``: a callable counts as "random" (KMeans 10, MiniBatchKMeans 3)."""
    ours, theirs = [], []
    dk(6, init=_counting_init(ours), random_state=0).fit(X)
    sk(6, init=_counting_init(theirs), random_state=0).fit(X)
    assert len(theirs) == runs
    assert len(ours) == runs


def test_n_init_auto_as_sklearn_for_its_strategies(X):
    calls = []
    KMeans(6, init=_counting_init(calls), n_init=2, random_state=0).fit(X)
    assert len(calls) == 2  # an explicit n_init is kept
    assert KMeans(6, init="random", random_state=0)._fit_spec().n_init == 10
    assert KMeans(6, init="k-means++", random_state=0)._fit_spec().n_init == 1
    assert MiniBatchKMeans(6, init="random")._fit_spec().n_init == 3
    assert MiniBatchKMeans(6, init="k-means++")._fit_spec().n_init == 1


# -- init_size < n_clusters -------------------------------------------------------------------
def test_init_size_below_n_clusters_warns_as_sklearn(X):
    message = re.escape(
        "init_size=4 should be larger than n_clusters=6. Setting it to min(3*n_clusters, n_samples)"
    )
    with pytest.warns(RuntimeWarning, match=message):
        SkMiniBatchKMeans(6, init_size=4, random_state=0, n_init=1).fit(X)
    with pytest.warns(RuntimeWarning, match=message):
        MiniBatchKMeans(6, init_size=4, random_state=0).fit(X)
    with pytest.warns(RuntimeWarning, match=message):
        MiniBatchKMeans(6, init_size=4, random_state=0).partial_fit(X[:500])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        MiniBatchKMeans(6, init_size=6, random_state=0).fit(X)  # not below: no warning


# -- verbose -----------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [KMeans, MiniBatchKMeans])
def test_verbose_accepts_bools_as_sklearn(X, cls, capsys):
    SkKMeans(6, verbose=True, n_init=1, random_state=0).fit(X)  # scikit-learn takes a bool
    capsys.readouterr()
    cls(6, verbose=True, random_state=0).fit(X)
    assert "iteration" in capsys.readouterr().out
    cls(6, verbose=False, random_state=0).fit(X)
    assert capsys.readouterr().out == ""
    with pytest.raises(InvalidParameterError, match="verbose"):
        cls(6, verbose=-1).fit(X)
    with pytest.raises(InvalidParameterError, match="verbose"):
        cls(6, verbose="yes").fit(X)


def test_verbose_prints_sklearn_messages(X, capsys):
    """scikit-learn's "Initialization complete" before each run and "Converged at iteration i: ..." after it."""
    KMeans(6, init=X[:6], n_init=1, local_search=False, verbose=1).fit(X)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Initialization complete"
    assert re.fullmatch(
        r"Converged at iteration \d+: (strict convergence|center shift \S+ within tolerance)\.",
        lines[-1],
    )
    assert int(lines[-1].split()[3].rstrip(":")) == sum(
        line.startswith("iteration") for line in lines
    )
    KMeans(
        6, init="random", n_init=3, local_search=False, tol=0.0, verbose=True, random_state=0
    ).fit(X)
    out = capsys.readouterr().out
    assert out.count("Initialization complete") == 3
    assert (
        out.count("Converged at iteration") == 3 and out.count("strict convergence") == 3
    )  # tol=0: fixed points
    # with local search (default): one run, whose Lloyd loops each end with their message
    KMeans(6, random_state=0, verbose=1).fit(X)
    out = capsys.readouterr().out
    assert out.count("Initialization complete") == 1 and "Converged at iteration" in out
    # mini-batch: scikit-learn's early-stop message, at the end
    mbk = MiniBatchKMeans(6, batch_size=100, random_state=0, verbose=1).fit(X)
    out = capsys.readouterr().out
    assert mbk.stop_reason_ == "no-improvement"
    assert (
        out.splitlines()[-1]
        == f"Converged (lack of improvement in inertia) at step {mbk.n_steps_}/{100 * 3000 // 100}"
    )


# -- transform of the centres ------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_transform_of_the_centres_is_zero_on_the_diagonal(client, X, dtype):
    """A row equal to a centre is at distance exactly 0, as scikit-learn gives for its own centres."""
    Xd = X.astype(dtype)
    km = KMeans(6, random_state=0).fit(Xd)
    C = km.cluster_centers_
    sk = SkKMeans(6, n_init=1, random_state=0).fit(Xd)
    assert np.all(np.diag(sk.transform(sk.cluster_centers_)) == 0)
    for rows in (C, C.copy(), da.from_array(C, chunks=4), sp.csr_matrix(C)):
        D = km.transform(rows)
        D = D.compute() if isinstance(D, da.Array) else D
        assert D.dtype == dtype
        assert np.all(np.diag(D) == 0), np.diag(D)
    # everywhere else as scikit-learn's euclidean_distances (float32 in float64, as it computes them)
    from sklearn.metrics.pairwise import euclidean_distances

    want = euclidean_distances(Xd[:200].astype(np.float64), C.astype(np.float64))
    np.testing.assert_allclose(
        km.transform(Xd[:200]), want, rtol=1e-6 if dtype == np.float32 else 1e-12
    )
    np.testing.assert_allclose(
        km.transform(sp.csr_matrix(Xd[:200])), want, rtol=1e-6 if dtype == np.float32 else 1e-12
    )
    # rows next to a centre keep their small distance (no cancellation to 0 or to a rounding floor)
    near = C + np.asarray(1e-4, dtype)
    exact = np.sqrt(((near.astype(np.float64) - C.astype(np.float64)) ** 2).sum(axis=1))
    np.testing.assert_allclose(np.diag(km.transform(near)), exact, rtol=1e-6)


# -- fewer distinct points than clusters -----------------------------------------------------
def _two_points(n=40):
    X = np.repeat(np.array([[0.0, 0.0], [5.0, 1.0]]), n // 2, axis=0)
    np.random.default_rng(0).shuffle(X)
    return X


@pytest.mark.parametrize("seed", range(6))
def test_kmeans_parallel_unused_centres_where_sklearn_puts_them(seed):
    """40 rows of 2 distinct points, k = 5: both points, then copies of the first row.

    scikit-learn's k-means++ draws on a zero potential land on row 0 (README: the farthest
    rows fill in deterministically; the centres that must coincide come with a warning
    counting the distinct ones). The same for any chunking.
    """
    X = _two_points()
    results = []
    for n_chunks in (1, 3, 7):
        with pytest.warns(
            ConvergenceWarning,
            match=r"Number of distinct clusters \(2\) found smaller than "
            r"n_clusters \(5\)",
        ):
            results.append(
                kmeans_parallel(ChunkList.from_array(X, None, n_chunks), 5, seed, InitOptions())
            )
    for C in results[1:]:
        np.testing.assert_array_equal(C, results[0])
    C = results[0]
    assert {tuple(c) for c in C[:2]} == {(0.0, 0.0), (5.0, 1.0)}
    np.testing.assert_array_equal(C[2:], np.repeat(X[:1], 3, axis=0))
    sk, _ = kmeans_plusplus(X, 5, random_state=seed)
    np.testing.assert_array_equal(sk[2:], C[2:])  # scikit-learn's rule for the unused centres


def test_kmeans_parallel_completion_counts_repeated_candidates_once():
    """Repeated candidates count once, and the farthest distinct rows fill in before any centre coincides."""
    from dkmeans.drivers.init.kmeans_parallel import _complete

    X = np.concatenate([np.zeros((1, 1)), np.full((10, 1), 10.0), np.full((3, 1), 5.0)])
    data = ChunkList.from_array(X, None, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        # the 3 farthest rows are all 10.0: one fills in, then 5.0 in a further pass
        np.testing.assert_array_equal(_complete(data, X[:1], 3).ravel(), [0.0, 10.0, 5.0])
        np.testing.assert_array_equal(_complete(data, X[[0, 0, 1]], 3).ravel(), [0.0, 10.0, 5.0])
    with pytest.warns(ConvergenceWarning, match=r"distinct clusters \(3\)"):
        np.testing.assert_array_equal(
            _complete(data, X[[0, 0, 1]], 5).ravel(), [0.0, 10.0, 5.0, 0.0, 0.0]
        )


def test_kmeans_fit_with_fewer_distinct_points_keeps_k_centres(client):
    X = _two_points()
    for fit in (
        lambda: KMeans(5, random_state=3).fit(X),
        lambda: KMeans(5, random_state=3).fit(da.from_array(X, chunks=13)),
        lambda: MiniBatchKMeans(5, random_state=3, batch_size=20).fit(X),
    ):
        with pytest.warns(ConvergenceWarning, match="distinct"):
            km = fit()
        assert km.cluster_centers_.shape == (5, 2)
        assert {tuple(c) for c in km.cluster_centers_} == {(0.0, 0.0), (5.0, 1.0)}
        assert km.inertia_ == 0.0
