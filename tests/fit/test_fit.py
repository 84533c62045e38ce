"""The fit service: the local-search phase in a fit, its checkpoint, scikit-learn's conventions at the edge."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.cluster import KMeans as SKKMeans

import dkmeans.fit.runs
from dkmeans import KMeans
from dkmeans.testing import make_blobs


@pytest.fixture(scope="module")
def grid():
    """25 well separated blobs on a 5 x 5 grid: random starts leave Lloyd with misplaced centroids."""
    centers = np.array([(x, y) for x in range(5) for y in range(5)], dtype=float) * 10.0
    rng = np.random.default_rng(3)
    X = centers[rng.integers(0, 25, 5000)] + rng.normal(scale=0.8, size=(5000, 2))
    return X, centers


def _misplaced(C, centers) -> int:
    """Blobs without a centroid within 2 of their centre (the Centroid Index of this layout)."""
    d = np.sqrt(((centers[:, None] - C[None]) ** 2).sum(axis=2))
    return int((d.min(axis=1) > 2.0).sum())


def test_local_search_moves_centroids_lloyd_cannot(grid):
    X, centers = grid
    plain = KMeans(25, init="random", n_init=1, random_state=4, local_search=False).fit(X)
    searched = KMeans(25, init="random", n_init=1, random_state=4, local_search=True).fit(X)
    assert _misplaced(plain.cluster_centers_, centers) > 0, "this start must leave Lloyd stuck"
    assert _misplaced(searched.cluster_centers_, centers) == 0
    assert searched.inertia_ < plain.inertia_
    kinds = [h["algorithm"] for h in searched.history_]
    assert "local-search" in kinds and kinds[0] == "lloyd"
    # the swaps are made on a sample before Lloyd (coreset_start) or after it, confirmed on the data
    rounds = [h for h in searched.history_ if h["algorithm"] == "local-search"]
    assert all(h["swaps_tried"] > 0 for h in rounds)


def test_default_uses_local_search_only_after_a_seeding_strategy(grid):
    X, centers = grid
    auto = KMeans(25, init="random", n_init=1, random_state=4).fit(X)
    assert any(h["algorithm"] == "local-search" for h in auto.history_)
    given = KMeans(25, init=centers + 3.0, n_init=1).fit(
        X
    )  # given centroids: Lloyd's result, as scikit-learn's
    assert all(h["algorithm"] == "lloyd" for h in given.history_)
    sk = SKKMeans(25, init=centers + 3.0, n_init=1, algorithm="lloyd").fit(X)
    np.testing.assert_allclose(given.cluster_centers_, sk.cluster_centers_, rtol=1e-7)


def test_local_search_with_n_init_and_hartigan(grid):
    X, centers = grid
    km = KMeans(
        25, init="random", n_init=3, random_state=1, local_search=True, refine="hartigan"
    ).fit(X)
    assert _misplaced(km.cluster_centers_, centers) == 0
    kinds = [h["algorithm"] for h in km.history_]
    assert "local-search" in kinds
    assert km.stop_reason_ in ("no-improving-move", "objective-decrease")  # Hartigan ran last
    if "hartigan" in kinds:
        assert kinds.index("local-search") < kinds.index("hartigan")


def test_resume_during_the_swap_phase_gives_the_uninterrupted_result(grid, tmp_path, monkeypatch):
    X, _ = grid
    options = dict(n_clusters=25, init="random", n_init=2, random_state=4, local_search=True)
    reference = KMeans(**options).fit(X)
    from dkmeans.io.checkpoint import Checkpointer

    real = dkmeans.fit.runs.coreset_local_search
    path = tmp_path / "job.ckpt"

    def killed_in_second_run(*args, **kwargs):
        if (
            Checkpointer(path, 10, {}).progress()["run"] == 1
        ):  # the second run's swap phase: saved at its start
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(dkmeans.fit.runs, "coreset_local_search", killed_in_second_run)
    with pytest.raises(KeyboardInterrupt):
        KMeans(**options, checkpoint=path).fit(X)
    monkeypatch.setattr(dkmeans.fit.runs, "coreset_local_search", real)

    assert Checkpointer(path, 10, {}).progress() == {
        "run": 1,
        "phase": "local-search",
        "n_iter": Checkpointer(path, 10, {}).progress()["n_iter"],
    }
    resumed = KMeans(**options, checkpoint=path).fit(X)
    np.testing.assert_array_equal(resumed.cluster_centers_, reference.cluster_centers_)
    assert resumed.inertia_ == reference.inertia_ and resumed.n_iter_ == reference.n_iter_


def test_callable_init_as_in_scikit_learn():
    X, _, _ = make_blobs(2000, 3, 4, spread=1.0, box=8.0, seed=5)
    seen = []

    def init(rows, n_clusters, random_state):
        # rows as given (scikit-learn passes them centred, and takes the centres in that space)
        seen.append((rows.shape, n_clusters, type(random_state).__name__))
        return rows[random_state.choice(len(rows), n_clusters, replace=False)]

    ours = KMeans(4, init=init, n_init=1, random_state=0, tol=0).fit(X)
    theirs = SKKMeans(4, init=init, n_init=1, random_state=0, tol=0, algorithm="lloyd").fit(X)
    assert seen[0] == ((2000, 3), 4, "RandomState")  # small data: the callable sees every row
    np.testing.assert_allclose(ours.cluster_centers_, theirs.cluster_centers_, rtol=1e-10)
    np.testing.assert_array_equal(ours.labels_, theirs.labels_)


def test_callable_init_returning_the_wrong_shape_says_so():
    X = make_blobs(500, 3, 4, seed=5)[0]
    with pytest.raises(
        ValueError,
        match=r"The shape of the initial centers \(2, 3\) does not match the number of "
        r"clusters 4",
    ):
        KMeans(4, init=lambda X, k, rs: X[:2]).fit(X)


@pytest.mark.parametrize("init", [5, 2.5, {"a": 1}])
def test_init_of_the_wrong_type_is_a_type_error(init):
    X = make_blobs(200, 2, 3, seed=1)[0]
    with pytest.raises(TypeError, match="'init' parameter of KMeans must be"):
        KMeans(3, init=init).fit(X)


def test_explicit_centres_with_n_init_warn_in_scikit_learns_words():
    X = make_blobs(300, 2, 3, seed=1)[0]
    with pytest.warns(
        RuntimeWarning,
        match=r"Explicit initial center position passed: performing only one init in "
        r"KMeans instead of n_init=4\.",
    ):
        KMeans(3, init=X[:3], n_init=4).fit(X)


def test_no_large_graph_warning_for_a_large_numpy_fit_but_the_users_own_graphs_still_warn(client):
    """distributed warns about graphs over 10 MB; in-memory input travels in the graph on purpose (lost chunks
    stay recomputable), so the warning is silenced for dkmeans' own call only."""
    import warnings

    import dask.array as da

    X = np.random.default_rng(0).random(
        (2_000_000, 16), dtype=np.float32
    )  # 122 MiB: sent to the cluster
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        km = KMeans(4, init=X[:4], n_init=1, max_iter=2).fit(X)
    assert km.data_mode_ == "in-memory"
    assert not [w for w in caught if "large graph" in str(w.message)]
    with pytest.warns(UserWarning, match="Sending large graph"):
        client.compute(da.from_array(X, chunks=(500_000, 16)).sum()).result()
