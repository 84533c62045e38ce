"""Pruned Lloyd against unpruned Lloyd in each loop mode: the same run, fewer distances.

Asserted exactly (``assert_array_equal``, ``==``): the centroids after every block, the number of
updates, the stop reason, every iteration's objective and shift, and the final labels. The
pruned partials are the unpruned kernel's to the bit (tests/kernels/test_pruned.py), so nothing
may differ. The unpruned run is itself checked against the float64 reference in test_lloyd.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from dkmeans.drivers import pruned_lloyd
from dkmeans.drivers.lloyd import CentroidShift, ObjectiveDecrease, lloyd
from dkmeans.engine.local import ChunkList
from dkmeans.testing import fit_lloyd, make_blobs, persist_rows
from dkmeans.testing import pick_rows as initial_rows


@pytest.fixture(autouse=True, params=["per-iteration", "single-task", "spmd"])
def loop_mode(request):
    """Every test runs with one graph per iteration, with the whole loop in one task, and SPMD
    (tests of in-process chunks ask for ``in-process`` instead)."""
    if request.param == "in-process":
        yield
        return
    if request.param == "per-iteration":
        request.getfixturevalue("graph_loop")
        yield
        return
    calls = request.getfixturevalue("spmd" if request.param == "spmd" else "single_task")
    yield
    assert "lloyd_iterations" in calls, f"the loop did not run {request.param}"


@pytest.fixture(scope="module")
def blobs32():
    X, _, _ = make_blobs(3000, 12, 20, spread=1.5, box=8.0, seed=3, dtype=np.float32)
    return X


def _same_run(a, b):
    assert a.result.n_iter == b.result.n_iter and a.result.stop_reason == b.result.stop_reason
    np.testing.assert_array_equal(a.result.centroids, b.result.centroids)
    for ha, hb in zip(a.result.history, b.result.history):
        assert (ha.objective, ha.centroid_shift, ha.empty_clusters_fixed) == (
            hb.objective,
            hb.centroid_shift,
            hb.empty_clusters_fixed,
        )
    np.testing.assert_array_equal(np.asarray(a.labels), np.asarray(b.labels))
    assert a.objective == b.objective


def _both(data_of, C0, **options):
    data = data_of()  # one placement: the sums combine in the same order in both runs
    plain = fit_lloyd(data, C0, prune=False, **options)
    pruned = fit_lloyd(data, C0, prune=True, **options)
    _same_run(plain, pruned)
    return plain, pruned


@pytest.mark.parametrize("stop_rule", [CentroidShift(0.0), ObjectiveDecrease(0.0)])
def test_equals_unpruned(client, blobs32, stop_rule):
    C0 = initial_rows(blobs32, 24, seed=1)
    plain, pruned = _both(
        lambda: persist_rows(client, blobs32, 3), C0, max_iter=40, stop_rule=stop_rule
    )
    assert pruned.result.n_iter > 5
    fractions = [h.distances_computed for h in pruned.result.history]
    assert all(h.distances_computed == 1.0 for h in plain.result.history)
    assert fractions[0] >= 1.0 and min(fractions[3:]) < 0.5, fractions


def test_cosine_and_weights(client, blobs32):
    X = blobs32 / np.linalg.norm(blobs32, axis=1, keepdims=True)
    w = np.random.default_rng(0).uniform(0, 2, len(X))
    w[:40] = 0.0
    C0 = initial_rows(X, 16, seed=2)
    _both(
        lambda: persist_rows(client, X, 4, w),
        C0,
        max_iter=25,
        stop_rule=CentroidShift(0.0),
        metric="cosine",
    )


def test_empty_clusters(client):
    X, _, _ = make_blobs(600, 32, 75, spread=1.0, box=10.0, seed=8, dtype=np.float32)
    C0 = initial_rows(X, 200, seed=3)  # few rows per centroid: updates keep leaving clusters empty
    plain, pruned = _both(
        lambda: persist_rows(client, X, 3), C0, max_iter=10, stop_rule=CentroidShift(0.0)
    )
    assert sum(h.empty_clusters_fixed for h in plain.result.history) >= 2


def test_resume_from_a_block_equals_the_whole_run(client, blobs32):
    C0 = initial_rows(blobs32, 24, seed=4)
    data = persist_rows(client, blobs32, 2)
    whole = lloyd(data, C0, max_iter=12, stop_rule=CentroidShift(0.0), prune=False)
    states = []
    lloyd(
        data,
        C0,
        max_iter=12,
        stop_rule=CentroidShift(0.0),
        prune=True,
        on_state=states.append,
        state_every=4,
    )
    resumed = lloyd(
        data, C0, max_iter=12, stop_rule=CentroidShift(0.0), prune=True, resume=states[0]
    )
    assert resumed.n_iter == whole.n_iter
    np.testing.assert_array_equal(resumed.centroids, whole.centroids)
    # each block builds its bounds again: its first iteration computes every distance
    assert resumed.history[4].distances_computed >= 1.0


@pytest.mark.parametrize("loop_mode", ["in-process"], indirect=True)
def test_auto_switches_off_and_back(monkeypatch, blobs32):
    """With the switch-off share at 0, every pruned pass after a build pauses pruning: 4 plain passes,
    a build, a pruned pass, then 8 plain ones. The run equals the unpruned one throughout."""
    monkeypatch.setattr(pruned_lloyd, "AUTO_OFF_FRACTION", 0.0)
    monkeypatch.setattr(pruned_lloyd, "AUTO_MIN_WORK", 0)
    monkeypatch.setattr(pruned_lloyd, "AUTO_MIN_ROW_WORK", 0)
    monkeypatch.setattr(pruned_lloyd, "AUTO_PLAIN_ABOVE", float("inf"))
    C0 = initial_rows(blobs32, 24, seed=5)
    chunks = ChunkList.from_array(blobs32, n_chunks=3)
    auto = lloyd(chunks, C0, max_iter=20, stop_rule=ObjectiveDecrease(-1.0), prune="auto")
    plain = lloyd(chunks, C0, max_iter=20, stop_rule=ObjectiveDecrease(-1.0), prune=False)
    np.testing.assert_array_equal(auto.centroids, plain.centroids)
    fractions = [h.distances_computed for h in auto.history]
    assert auto.n_iter >= 9, fractions
    assert fractions[0] >= 1.0 and fractions[1] < 1.0 and fractions[2:6] == [1.0] * 4, fractions
    assert fractions[6] >= 1.0 and fractions[7] < 1.0 and set(fractions[8:16]) == {1.0}, fractions


@pytest.mark.parametrize("loop_mode", ["in-process"], indirect=True)
def test_auto_chunks_that_settle_little_take_the_unpruned_kernel(monkeypatch, blobs32):
    """With the chunks' plain share at 0, a chunk where any row fails its bounds' first test takes the
    unpruned kernel and builds its bounds again in the next pass (never pausing here): every pass
    computes every distance, and the run equals the unpruned one."""
    monkeypatch.setattr(pruned_lloyd, "AUTO_OFF_FRACTION", 2.0)
    monkeypatch.setattr(pruned_lloyd, "AUTO_MIN_WORK", 0)
    monkeypatch.setattr(pruned_lloyd, "AUTO_MIN_ROW_WORK", 0)
    monkeypatch.setattr(pruned_lloyd, "AUTO_PLAIN_ABOVE", 0.0)
    C0 = initial_rows(blobs32, 24, seed=5)
    chunks = ChunkList.from_array(blobs32, n_chunks=3)
    auto = lloyd(chunks, C0, max_iter=10, stop_rule=ObjectiveDecrease(-1.0), prune="auto")
    plain = lloyd(chunks, C0, max_iter=10, stop_rule=ObjectiveDecrease(-1.0), prune=False)
    np.testing.assert_array_equal(auto.centroids, plain.centroids)
    assert [h.objective for h in auto.history] == [h.objective for h in plain.history]
    assert all(h.distances_computed >= 1.0 for h in auto.history), [
        h.distances_computed for h in auto.history
    ]


@pytest.mark.parametrize("loop_mode", ["in-process"], indirect=True)
def test_out_of_core_is_not_pruned(blobs32):
    chunks = ChunkList.from_array(blobs32, n_chunks=2)
    chunks.in_memory = False
    res = lloyd(
        chunks, initial_rows(blobs32, 8), max_iter=5, stop_rule=CentroidShift(0.0), prune=True
    )
    assert all(h.distances_computed == 1.0 for h in res.history)


@pytest.mark.parametrize("loop_mode", ["in-process"], indirect=True)
def test_default_fit_prunes_and_equals_prune_false():
    """KMeans' default prune ("auto") on a fit large enough for it (n k d >= 2^26, k d >= 2^14): the
    same centroids, labels, objective and history as prune=False, with fewer distances computed."""
    from dkmeans import KMeans

    X, _, _ = make_blobs(8192, 64, 64, spread=1.0, box=5.0, seed=2, dtype=np.float32)
    auto = KMeans(256, random_state=0).fit(X)
    plain = KMeans(256, random_state=0, prune=False).fit(X)
    np.testing.assert_array_equal(auto.cluster_centers_, plain.cluster_centers_)
    np.testing.assert_array_equal(auto.labels_, plain.labels_)
    assert auto.inertia_ == plain.inertia_ and auto.n_iter_ == plain.n_iter_
    assert [h["objective"] for h in auto.history_] == [h["objective"] for h in plain.history_]
    computed = [h["distances_computed"] for h in auto.history_ if h["algorithm"] == "lloyd"]
    assert min(computed) < 0.5 and all(
        h["distances_computed"] == 1.0 for h in plain.history_ if h["algorithm"] == "lloyd"
    ), computed


@pytest.mark.parametrize("loop_mode", ["in-process"], indirect=True)
def test_bounds_fit_the_room_the_budget_leaves(blobs32):
    """The groups are planned with the data's row_state_bytes (the persist budget's room): fewer groups
    in less room, and no pruning where not even one group's bounds fit."""

    class Tight(ChunkList):
        room = 0.0

        def row_state_bytes(self):
            return self.room

    chunks = Tight.from_array(blobs32, n_chunks=2)
    assert pruned_lloyd.prune_groups(chunks, 24) == 0
    res = lloyd(
        chunks, initial_rows(blobs32, 24), max_iter=4, stop_rule=CentroidShift(0.0), prune=True
    )
    assert all(h.distances_computed == 1.0 for h in res.history)
    chunks.room = 16 + 4 * 1.5
    assert pruned_lloyd.prune_groups(chunks, 24) == 1  # Hamerly's one bound: 20 bytes a row
    chunks.room = float("inf")
    assert pruned_lloyd.prune_groups(chunks, 24) == 2  # k / 10


@pytest.mark.parametrize("loop_mode", ["in-process"], indirect=True)
def test_plain_share_follows_the_groups_width():
    """prune="auto"'s fallback share: the narrow groups' value up to 16 centroids a group, the wide
    groups' from 64 on, in between growing with the width; the switch-off share grows as much."""
    narrow, wide = pruned_lloyd.AUTO_PLAIN_ABOVE, pruned_lloyd.AUTO_PLAIN_ABOVE_WIDE
    assert pruned_lloyd.plain_share(256, 25) == narrow and pruned_lloyd.plain_share(16, 1) == narrow
    assert (
        pruned_lloyd.plain_share(2048, 32) == wide and pruned_lloyd.plain_share(65_536, 64) == wide
    )
    middle = [pruned_lloyd.plain_share(32 * w, 32) for w in (20, 32, 48)]
    assert narrow < middle[0] < middle[1] < middle[2] < wide
    assert middle[1] == pytest.approx((narrow + wide) / 2)
    assert pruned_lloyd.off_share(256, 25) == pruned_lloyd.AUTO_OFF_FRACTION
    assert pruned_lloyd.off_share(2048, 32) == pytest.approx(
        pruned_lloyd.AUTO_OFF_FRACTION + wide - narrow
    )


# -- a run's bounds kept across its Lloyd blocks (the default fit: Lloyd, local search, Lloyd) --------
@pytest.fixture(scope="module")
def search_blobs():
    """Data on which the default fit runs the local search (swaps confirmed on the data) and Lloyd after."""
    X, _, _ = make_blobs(8192, 64, 64, spread=1.0, box=5.0, seed=2, dtype=np.float32)
    return X


def _kept_anywhere(client=None) -> list:
    from dkmeans.engine import kept

    here = kept.keys()
    there = (
        [] if client is None else [key for keys in client.run(kept.keys).values() for key in keys]
    )
    return here + there


def _same_fit(a, b):
    """Equal to the bit, but for the local search's own measurement of the objective (a graph pass
    outside the Lloyd loop, whose sums on the cluster may combine in another order from one fit to
    the next, pruned or not: seen in the last bit between two unpruned fits, with weights)."""
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    assert a.inertia_ == b.inertia_ and a.n_iter_ == b.n_iter_
    assert [h["algorithm"] for h in a.history_] == [h["algorithm"] for h in b.history_]
    for ha, hb in zip(a.history_, b.history_):
        if ha["algorithm"] == "lloyd":
            assert (ha["objective"], ha["centroid_shift"]) == (
                hb["objective"],
                hb["centroid_shift"],
            )
        else:
            assert ha["objective"] == pytest.approx(hb["objective"], rel=1e-12)


def _fit_three_ways(X, weights=None, **params):
    """prune=False, True and "auto" on the same data; all equal; returns the True fit's Lloyd fractions."""
    from dkmeans import KMeans

    fits = {
        p: KMeans(256, random_state=0, prune=p, **params).fit(X, sample_weight=weights)
        for p in (False, True, "auto")
    }
    _same_fit(fits[True], fits[False])
    _same_fit(fits["auto"], fits[False])
    if params.get("metric") != "cosine":  # (cosine fits run no local search)
        assert any(h["algorithm"] == "local-search" for h in fits[True].history_)
    return [h["distances_computed"] for h in fits[True].history_ if h["algorithm"] == "lloyd"]


@pytest.mark.parametrize("variant", ["plain", "weights", "cosine"])
def test_default_fit_keeps_its_bounds_across_blocks(client, search_blobs, loop_mode, variant):
    """The default fit (local search on; none with cosine) pruned equals the unpruned fit, in every
    loop mode, with weights and with cosine; with prune=True only the run's first pass builds bounds (every later
    block, the search's confirmations included, starts from the bounds the run kept), and nothing
    stays in a registry after the fit."""
    import dask.array as da

    X, w, params = search_blobs, None, {}
    if variant == "weights":
        w = np.random.default_rng(0).uniform(0, 2, len(X))
        w[:50] = 0.0
    if variant == "cosine":
        X, params = X / np.linalg.norm(X, axis=1, keepdims=True), {"metric": "cosine"}
    Xd = client.persist(da.from_array(X, chunks=(2048, X.shape[1])))
    wd = None if w is None else client.persist(da.from_array(w, chunks=2048))
    fractions = _fit_three_ways(Xd, wd, **params)
    assert fractions[0] >= 1.0 and all(f < 1.0 for f in fractions[1:]), fractions
    assert _kept_anywhere(client) == []


@pytest.mark.parametrize("loop_mode", ["in-process"], indirect=True)
@pytest.mark.parametrize("variant", ["plain", "weights", "cosine"])
def test_default_fit_in_the_caller_keeps_its_bounds_across_blocks(search_blobs, variant):
    X, w, params = search_blobs, None, {}
    if variant == "weights":
        w = np.random.default_rng(1).uniform(0, 2, len(X))
    if variant == "cosine":
        X, params = X / np.linalg.norm(X, axis=1, keepdims=True), {"metric": "cosine"}
    fractions = _fit_three_ways(X, w, **params)
    assert fractions[0] >= 1.0 and all(f < 1.0 for f in fractions[1:]), fractions
    assert _kept_anywhere() == []


@pytest.mark.parametrize("loop_mode", ["in-process"], indirect=True)
def test_a_failing_fit_leaves_no_bounds(monkeypatch, search_blobs):
    """A fit that fails after a Lloyd block kept its bounds drops them all the same."""
    from dkmeans import KMeans
    from dkmeans.fit import runs

    def fail(*args, **kwargs):
        assert _kept_anywhere(), (
            "the first Lloyd block's bounds should be kept for the run's next block"
        )
        raise RuntimeError("search failed")

    monkeypatch.setattr(runs, "coreset_local_search", fail)
    with pytest.raises(RuntimeError, match="search failed"):
        KMeans(256, random_state=0, prune=True).fit(search_blobs)
    assert _kept_anywhere() == []


def test_a_failing_fit_on_the_cluster_leaves_no_bounds(
    client, monkeypatch, search_blobs, loop_mode, request
):
    """The same where the loop runs on the cluster: a one-task or SPMD block's bounds stay in the
    registry of the worker that ran it (one graph per pass: as futures, held by the data), and are
    dropped there."""
    import dask.array as da

    from dkmeans import KMeans
    from dkmeans.fit import runs

    seen = []

    def fail(*args, **kwargs):
        seen.append(_kept_anywhere(client))
        raise RuntimeError("search failed")

    monkeypatch.setattr(runs, "coreset_local_search", fail)
    Xd = client.persist(da.from_array(search_blobs, chunks=(2048, search_blobs.shape[1])))
    with pytest.raises(RuntimeError, match="search failed"):
        KMeans(256, random_state=0, prune=True).fit(Xd)
    if request.node.callspec.params["loop_mode"] != "per-iteration":
        assert seen and seen[0], (
            "the first Lloyd block's bounds should be kept for the run's next block"
        )
    assert _kept_anywhere(client) == []


@pytest.mark.parametrize("loop_mode", ["in-process"], indirect=True)
def test_auto_run_builds_in_long_blocks_and_prunes_short_ones_with_kept_bounds(
    monkeypatch, blobs32
):
    """A run's "auto" passes: a block shorter than AUTO_MIN_ITERS builds no bounds; a long one does;
    a short block after it prunes from the kept bounds (no build); each block equals unpruned Lloyd."""
    from dkmeans.engine import kept

    monkeypatch.setattr(pruned_lloyd, "AUTO_MIN_WORK", 0)
    monkeypatch.setattr(pruned_lloyd, "AUTO_MIN_ROW_WORK", 0)
    monkeypatch.setattr(pruned_lloyd, "AUTO_OFF_FRACTION", 2.0)
    monkeypatch.setattr(pruned_lloyd, "AUTO_PLAIN_ABOVE", float("inf"))
    chunks = ChunkList.from_array(blobs32, n_chunks=3)
    C = initial_rows(blobs32, 24, seed=5)
    run = pruned_lloyd.PrunedPasses.for_run(chunks, "auto", 24, iterations=40)
    rule = ObjectiveDecrease(-1.0)  # (never stops)
    fractions = []
    for iters in (3, 10, 2):
        pruned = lloyd(chunks, C, max_iter=iters, stop_rule=rule, prune=run)
        plain = lloyd(chunks, C, max_iter=iters, stop_rule=rule, prune=False)
        np.testing.assert_array_equal(pruned.centroids, plain.centroids)
        assert [h.objective for h in pruned.history] == [h.objective for h in plain.history]
        fractions.append([h.distances_computed for h in pruned.history])
        C = pruned.centroids
    assert fractions[0] == [1.0] * 3, fractions
    assert fractions[1][0] >= 1.0 and max(fractions[1][1:]) < 1.0, fractions
    assert max(fractions[2]) < 1.0, fractions
    assert kept.keys()  # the run's bounds, between its blocks
    run.release(chunks)
    assert kept.keys() == []
