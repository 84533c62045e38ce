"""Size caps through the faces: KMeans, train and the CLI's options; the caps' checks at the public edge."""

import dask
import numpy as np
import pandas as pd
import pytest

from dkmeans import Descriptor, KMeans, train
from dkmeans.errors import InvalidParameterError
from dkmeans.fit.capacity import resolve_capacity
from dkmeans.fit.spec import FitSpec


def blobs(n=2000, seed=0):
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(size=(3 * n // 4, 3)), rng.normal(size=(n // 4, 3)) + 4])


def test_balanced_fit_equal_sizes_and_monotone_objective():
    X = blobs()
    km = KMeans(4, random_state=0, n_init=1, balanced=True).fit(X)
    np.testing.assert_array_equal(np.bincount(km.labels_, minlength=4), [500] * 4)
    np.testing.assert_array_equal(km.cluster_sizes_, [500] * 4)
    objective = [r["objective"] for r in km.history_]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(objective, objective[1:]))
    d2 = ((X - km.cluster_centers_[km.labels_]) ** 2).sum()
    assert km.inertia_ == pytest.approx(d2, rel=1e-9)
    assert len(km.capacity_passes_) >= km.n_iter_
    unconstrained = KMeans(4, random_state=0, n_init=1).fit(X)
    assert km.inertia_ >= unconstrained.inertia_ * (1 - 1e-9)


def test_balanced_floor_when_k_does_not_divide_n():
    """Sizes within one of n/k both ways: 2,003 rows in 4 clusters are 500 or 501 each, 3 of 501."""
    X = blobs(2004, seed=4)[:2003]
    km = KMeans(4, random_state=0, n_init=1, balanced=True).fit(X)
    sizes = np.bincount(km.labels_, minlength=4)
    assert sizes.min() >= 500 and sizes.max() <= 501 and sizes.sum() == 2003
    np.testing.assert_array_equal(km.cluster_sizes_, sizes)


def test_max_cluster_size_fraction_and_train_face():
    X = blobs(1200, seed=1)
    km = KMeans(3, random_state=0, n_init=1, max_cluster_size=0.35).fit(X)
    assert np.bincount(km.labels_).max() <= 420
    result = train(
        Descriptor(cluster_count=3, max_iteration_count=50),
        X,
        random_state=0,
        max_cluster_size=0.35,
    )
    assert np.bincount(result.labels).max() <= 420
    assert result.objective_function_value == pytest.approx(
        float(((X - result.model.centroids[result.labels]) ** 2).sum()), rel=1e-6
    )


def test_k_one_and_loose_caps_are_plain_lloyd():
    X = blobs(400, seed=2)
    one = KMeans(1, random_state=0, n_init=1, max_cluster_size=400).fit(X)
    np.testing.assert_allclose(one.cluster_centers_[0], X.mean(0))
    loose = KMeans(3, random_state=0, n_init=1, max_cluster_size=400, local_search=False).fit(X)
    plain = KMeans(3, random_state=0, n_init=1, local_search=False).fit(X)
    np.testing.assert_array_equal(loose.labels_, plain.labels_)
    np.testing.assert_allclose(loose.inertia_, plain.inertia_, rtol=1e-9)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(max_cluster_size=10), ["max_cluster_size=10", "n_clusters=3", "30", "100"]),
        (dict(min_cluster_size=40), ["min_cluster_size=40", "120", "100"]),
        (dict(max_cluster_size=1.5), ["(0, 1]"]),
        (dict(balanced=True, max_cluster_size=50), ["balanced"]),
        (dict(max_cluster_size=50, algorithm="hartigan"), ["Lloyd"]),
        (dict(max_cluster_size=50, local_search=True), ["local search"]),
        (dict(max_cluster_size=-1), ["max_cluster_size"]),
    ],
)
def test_caps_checked_at_the_edge(kwargs, words):
    X = blobs(100, seed=3)
    with pytest.raises(InvalidParameterError) as info:
        KMeans(3, random_state=0, n_init=1, **kwargs).fit(X)
    for word in words:
        assert word in str(info.value)


def test_resolve_capacity_arithmetic():
    spec = FitSpec(n_clusters=4, balanced=True)
    cap = resolve_capacity(spec, 10, 10.0, 1.0, False)
    assert (cap.lower, cap.upper) == (2.0, 3.0)
    cap = resolve_capacity(
        spec, 10, 12.0, 2.0, True
    )  # weighted: within the largest weight of the share
    assert (cap.lower, cap.upper) == (1.0, 5.0)
    spec = FitSpec(n_clusters=4, max_cluster_size=0.3, min_cluster_size=0.2)
    cap = resolve_capacity(spec, 10, 10.0, 1.0, False)
    assert (cap.lower, cap.upper) == (2.0, 3.0)


def test_cli_options_reach_the_estimator():
    from dkmeans.cli import _fit_params, build_parser

    args = build_parser().parse_args(
        ["fit", "in.parquet", "--model", "m.json", "-k", "4", "--max-cluster-size", "300"]
    )
    assert _fit_params(args)["max_cluster_size"] == 300
    args = build_parser().parse_args(
        ["fit", "in.parquet", "--model", "m.json", "-k", "4", "--balanced"]
    )
    assert _fit_params(args)["balanced"] is True
    args = build_parser().parse_args(
        ["fit", "in.parquet", "--model", "m.json", "-k", "4", "--min-cluster-size", "0.1"]
    )
    assert _fit_params(args)["min_cluster_size"] == 0.1


def _same_capped_fit(reference, other, cap):
    labels = np.asarray(
        other.labels_.compute() if hasattr(other.labels_, "compute") else other.labels_
    )
    np.testing.assert_array_equal(labels, reference.labels_)
    np.testing.assert_allclose(
        other.cluster_centers_, reference.cluster_centers_, rtol=1e-6, atol=1e-9
    )
    assert other.inertia_ == pytest.approx(reference.inertia_, rel=1e-9)
    assert np.bincount(labels).max() <= cap


def test_worker_count_chunking_and_out_of_core_invariance(client, single_worker_client, on_cluster):
    """The same capped fit in this process, on two workers, on one worker and out of core (Dask
    arrays of other chunkings on the cluster): the same labels, centroids and objective."""
    import dask.array as da

    X = blobs(1600, seed=5)
    caps = dict(max_cluster_size=460, random_state=0, n_init=1)
    with dask.config.set({"dkmeans.in-process-bytes": 1 << 30}):
        reference = KMeans(4, **caps).fit(X)
    assert np.bincount(reference.labels_).max() <= 460
    two = KMeans(4, **caps).fit(da.from_array(X, chunks=(300, 3)))
    _same_capped_fit(reference, two, 460)
    with single_worker_client.as_current():
        one = KMeans(4, **caps).fit(da.from_array(X, chunks=(512, 3)))
        _same_capped_fit(reference, one, 460)
    streamed = KMeans(4, out_of_core=True, **caps).fit(da.from_array(X, chunks=(250, 3)))
    assert streamed.data_mode_ == "out-of-core"
    _same_capped_fit(reference, streamed, 460)


def test_dask_dataframe_labels_on_its_index(client):
    """A Dask DataFrame (index not 0..n-1) gets the capped labels of the same rows as an array."""
    import dask.dataframe as dd

    X = blobs(1200, seed=6)
    frame = pd.DataFrame(X, columns=list("abc"), index=np.arange(1200) * 3 + 7)
    reference = KMeans(3, random_state=0, n_init=1, balanced=True).fit(X)
    ours = KMeans(3, random_state=0, n_init=1, balanced=True).fit(
        dd.from_pandas(frame, npartitions=4)
    )
    labels = ours.labels_.compute()
    assert list(labels.index) == list(frame.index)
    _same_capped_fit(reference, ours, 400)
    np.testing.assert_array_equal(np.bincount(labels.to_numpy()), [400, 400, 400])


def test_cli_fit_on_a_parquet_file(client, tmp_path, capsys):
    """dkmeans fit FILE --max-cluster-size: the model's sizes within the cap, its centroids those of
    KMeans on the same rows (the command in process, on the session's cluster; the same command as
    a process of its own, with its embedded cluster, is in tests/system/test_cli_commands.py)."""
    from dkmeans.cli import main
    from dkmeans.io import load_model

    X = blobs(800, seed=7)
    pd.DataFrame(X, columns=list("abc")).to_parquet(tmp_path / "rows.parquet")
    args = ["fit", tmp_path / "rows.parquet", "-k", 4, "--max-cluster-size", 220]
    args += ["--model", tmp_path / "m.npz", "--random-state", 0, "--json"]
    assert main([str(a) for a in args]) == 0, capsys.readouterr().err
    model, meta = load_model(tmp_path / "m.npz")
    assert max(meta["cluster_sizes"]) <= 220 and sum(meta["cluster_sizes"]) == 800
    reference = KMeans(4, random_state=0, n_init=1, max_cluster_size=220).fit(X)
    np.testing.assert_allclose(model.centroids, reference.cluster_centers_, rtol=1e-6, atol=1e-9)
    assert meta["objective"] == pytest.approx(reference.inertia_, rel=1e-9)


@pytest.mark.parametrize("where", ["in-process", "cluster"])
def test_cosine_balanced_fit_is_the_optimal_transport_of_the_unit_rows(where, client, graph_loop):
    """A cosine balanced fit (rows of any length): equal sizes, the objective ``sum (1 - cos)`` of
    its labels, and those labels an optimal transport of the unit rows to the final centroids
    (half the squared distances); its later assignments take one pass each (the exact moves
    proved from their lists, the moved rows fetched: unit rows, in the caller and from the
    cluster's persisted chunks alike, the loop one graph a pass)."""
    import dask.array as da

    from tests.drivers.test_capacitated import transport_cost

    rng = np.random.default_rng(3)
    X = np.concatenate(
        [rng.normal(size=(900, 3)) + [3, 0, 0], rng.normal(size=(300, 3)) + [0, 3, 0]]
    ) * rng.uniform(0.5, 4, size=(1200, 1))
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    local = {"dkmeans.in-process-bytes": 1 << 30 if where == "in-process" else 0}
    data = X if where == "in-process" else da.from_array(X, chunks=(400, 3))
    with dask.config.set(local):
        km = KMeans(4, metric="cosine", balanced=True, random_state=0, n_init=1).fit(data)
    labels = np.asarray(km.labels_)
    np.testing.assert_array_equal(np.bincount(labels, minlength=4), [300] * 4)
    C = km.cluster_centers_.astype(np.float64)
    assert km.inertia_ == pytest.approx(float((1 - (U * C[labels]).sum(1)).sum()), rel=1e-9)
    assert km.inertia_ == pytest.approx(transport_cost(U, C, 300, 300) / 2, rel=1e-9)
    assert 1 in km.capacity_passes_


def test_a_capped_loop_in_one_task_reports_every_assignment(client, single_task):
    """A capped Lloyd loop run inside one task hands its passes back (their copy's bookkeeping):
    ``capacity_passes_`` holds every assignment's passes, one per iteration and the final one's,
    and the fit is the one-graph-a-pass fit's (the same labels, passes and objective)."""
    import dask.array as da

    X = blobs(1600, seed=6)
    caps = dict(balanced=True, random_state=0, n_init=1)
    km = KMeans(4, **caps).fit(da.from_array(X, chunks=(400, 3)))
    assert "lloyd_iterations" in single_task  # the loop ran in a task
    assert km.n_iter_ >= 2
    assert km.n_iter_ + 1 <= len(km.capacity_passes_) <= km.n_iter_ + 2
    with dask.config.set({"dkmeans.single-task-work": 0, "dkmeans.spmd": False}):
        graph = KMeans(4, **caps).fit(da.from_array(X, chunks=(400, 3)))
    np.testing.assert_array_equal(np.asarray(km.labels_), np.asarray(graph.labels_))
    assert km.capacity_passes_ == graph.capacity_passes_
    assert km.inertia_ == pytest.approx(graph.inertia_, rel=1e-12)
