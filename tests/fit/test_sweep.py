"""The k sweep: each k's model is the single fit's, the passes over the data are shared, the elbow rule."""

from __future__ import annotations

import threading

import dask.array as da
import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import calinski_harabasz_score, davies_bouldin_score

import dkmeans
from dkmeans import KMeans
from dkmeans.errors import InvalidParameterError
from dkmeans.fit.krules import answers, bic_score
from dkmeans.ksweep import elbow
from dkmeans.testing import make_blobs

#: the cluster scores of every k: two passes, combined across the k
METRIC_PASSES = 2


def _assert_passes_shared(result, single, slack: int = 2):
    """The sweep's passes: the longest single fit's and the metrics', or the gap's reference fits' if longer."""
    reference = result.reference.n_passes + 1 if result.reference is not None else 0
    low = max(single) + METRIC_PASSES
    assert low <= result.n_passes <= max(low, reference) + slack, (
        result.n_passes,
        single,
        reference,
    )
    assert result.n_passes < sum(single) + reference


@pytest.fixture(scope="module")
def blobs():
    X, _, _ = make_blobs(900, 3, 5, spread=1.0, box=10.0, seed=2)
    return X


def _assert_single_fits(result, X, ks, exact: bool, **fit_kwargs):
    """Each k's model against ``KMeans(n_clusters=k, random_state=result.random_state).fit(X)``;
    the single fits' passes."""
    passes = []
    for k in ks:
        single = KMeans(n_clusters=k, random_state=result.random_state).fit(X, **fit_kwargs)
        model = result.models[k]
        got_labels, want_labels = np.asarray(model.labels_), np.asarray(single.labels_)
        if hasattr(model.labels_, "compute"):
            got_labels, want_labels = model.labels_.compute(), single.labels_.compute()
        np.testing.assert_array_equal(got_labels, want_labels)
        assert model.n_iter_ == single.n_iter_ and model.stop_reason_ == single.stop_reason_
        assert model.n_passes_ == single.n_passes_ == result.passes[k]
        if exact:
            np.testing.assert_array_equal(model.cluster_centers_, single.cluster_centers_)
            assert [h["objective"] for h in model.history_] == [
                h["objective"] for h in single.history_
            ]
        else:
            np.testing.assert_allclose(
                model.cluster_centers_, single.cluster_centers_, rtol=1e-10, atol=1e-12
            )
        assert model.inertia_ == pytest.approx(single.inertia_, rel=1e-12)
        assert result.objective[k] == model.inertia_
        passes.append(single.n_passes_)
    return passes


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_each_k_is_the_single_fit_in_process(blobs, weighted):
    """In-memory NumPy data fitted in this process: the same passes over the same chunks, so equal to the bit."""
    X = blobs
    w = np.random.default_rng(0).uniform(0.5, 2.0, len(X)) if weighted else None
    ks = [1, 2, 5, 9]
    result = dkmeans.sweep(X, ks, random_state=0, sample_weight=w)
    assert result.k_values == ks and result.data_mode == "in-memory" and result.random_state == 0
    single = _assert_single_fits(result, X, ks, exact=True, sample_weight=w)
    # every pass serves every k still running: about the longest single fit's passes, far below their sum
    _assert_passes_shared(result, single)
    # each k's scores: scikit-learn's on the labels of its model (two combined passes for all k)
    for k in ks[1:]:
        labels, metrics = result.models[k].labels_, result.metrics[k]
        assert metrics["objective"] == result.objective[k]
        if not weighted:
            assert metrics["calinski_harabasz"] == pytest.approx(
                calinski_harabasz_score(X, labels), rel=1e-9
            )
            assert metrics["davies_bouldin"] == pytest.approx(
                davies_bouldin_score(X, labels), rel=1e-9
            )
        assert -1 <= metrics["simplified_silhouette"] <= 1 and metrics["imbalance"] >= 1


@pytest.mark.parametrize(
    "params",
    [
        {"algorithm": "hartigan"},
        {"refine": "hartigan"},
        {"init": "k-means++"},
        {"init": "random"},
        {"metric": "cosine"},
    ],
    ids=str,
)
def test_every_algorithm_and_seeding(blobs, params):
    """Hartigan's stateful rounds and labels, k-means++'s trials, n_init=10 runs, cosine: each k its single fit."""
    ks = [2, 5]
    result = dkmeans.sweep(blobs, ks, random_state=0, **params)
    for k in ks:
        single = KMeans(k, random_state=0, **params).fit(blobs)
        np.testing.assert_array_equal(result.models[k].cluster_centers_, single.cluster_centers_)
        np.testing.assert_array_equal(result.models[k].labels_, single.labels_)
        assert result.objective[k] == single.inertia_ and result.passes[k] == single.n_passes_
    _assert_passes_shared(result, list(result.passes.values()), slack=0)


def test_dask_array_on_the_cluster(client, blobs, on_cluster):
    """Persisted Dask data: a single fit's small loops run inside one task, the sweep's shared: equal to rounding.

    (``on_cluster``: a Dask array this small is otherwise computed and fitted in the caller.)
    """
    X = da.from_array(blobs, chunks=((97, 300, 33, 200, 270), (3,)))
    ks = [2, 7]
    result = dkmeans.sweep(X, ks, random_state=3)
    assert result.data_mode == "in-memory"
    single = _assert_single_fits(result, X, ks, exact=False)
    _assert_passes_shared(result, single)
    for k in ks:
        assert result.models[k].predict(blobs[:50]).shape == (50,)


def test_out_of_core_each_k_is_the_single_fit(client, blobs):
    """Rows read from their source in every pass: the k's stateful seedings replay their combined passes."""
    X = da.from_array(blobs, chunks=(300, 3))
    ks = [3, 6]
    result = dkmeans.sweep(X, ks, random_state=2, out_of_core=True)
    assert result.data_mode == "out-of-core"
    for k in ks:
        single = KMeans(k, random_state=2, out_of_core=True).fit(X)
        # the same passes over the same chunks, each combined as its own pass: equal to the bit
        np.testing.assert_array_equal(result.models[k].cluster_centers_, single.cluster_centers_)
        np.testing.assert_array_equal(result.models[k].labels_.compute(), single.labels_.compute())
        assert result.objective[k] == single.inertia_
        assert result.passes[k] == single.n_passes_ and result.n_iter[k] == single.n_iter_
    _assert_passes_shared(result, list(result.passes.values()), slack=0)


def test_results_do_not_depend_on_the_chunking(client, blobs):
    ks = [3, 6]
    one = dkmeans.sweep(da.from_array(blobs, chunks=(450, 3)), ks, random_state=1)
    other = dkmeans.sweep(
        da.from_array(blobs, chunks=((13, 400, 287, 200), (3,))), ks, random_state=1
    )
    local = dkmeans.sweep(blobs, ks, random_state=1)
    for k in ks:
        for res in (other, local):
            np.testing.assert_allclose(
                res.models[k].cluster_centers_, one.models[k].cluster_centers_, rtol=1e-10
            )
            np.testing.assert_array_equal(
                np.asarray(res.models[k].labels_), one.models[k].labels_.compute()
            )
            assert res.n_iter[k] == one.n_iter[k]


@pytest.mark.filterwarnings(
    "ignore:Number of distinct clusters:sklearn.exceptions.ConvergenceWarning"
)
def test_tiny_data_up_to_k_equal_n():
    X = np.array(
        [[0, 0], [0, 1], [5, 5], [5, 6], [9, 0], [9, 1], [0, 0], [2, 8], [3, 3], [7, 7]],
        dtype=float,
    )
    ks = [1, 2, 9, 10]
    result = dkmeans.sweep(X, ks, random_state=0)
    _assert_single_fits(result, X, ks, exact=True)
    assert result.objective[1] == pytest.approx(((X - X.mean(0)) ** 2).sum())
    assert (
        result.objective[10] == 0.0 and result.objective[9] == 0.0
    )  # a duplicated row: 9 distinct rows


def test_dataframe_columns_are_the_models_features(blobs):
    df = pd.DataFrame(blobs, columns=["a", "b", "c"])
    result = dkmeans.sweep(df, [2, 5], random_state=0)
    for k in (2, 5):
        assert list(result.models[k].feature_names_in_) == ["a", "b", "c"]
        np.testing.assert_array_equal(result.models[k].predict(df), result.models[k].labels_)


def test_a_k_larger_than_the_rows_is_refused_before_any_pass():
    X = np.random.default_rng(0).normal(size=(10, 2))
    with pytest.raises(InvalidParameterError, match="n_samples=10 should be >= n_clusters=11"):
        dkmeans.sweep(X, [2, 11])


def test_a_failing_k_is_raised_naming_it_and_stops_the_others(blobs):
    def init(X, k, random_state):
        if k == 4:
            raise ValueError("no start for four")
        return X[:k]

    before = threading.active_count()
    with pytest.raises(ValueError, match="no start for four") as info:
        dkmeans.sweep(blobs, [2, 4, 6], init=init, n_init=1, random_state=0)
    assert any("n_clusters=4" in note for note in info.value.__notes__)
    assert threading.active_count() == before


@pytest.mark.parametrize(
    "k_values, message",
    [
        ([], "empty"),
        ([2, 2], "distinct"),
        ([0, 2], ">= 1"),
        ([True, 2], ">= 1"),
        ("2:4", "sequence"),
    ],
)
def test_bad_k_values(blobs, k_values, message):
    with pytest.raises(InvalidParameterError, match=message):
        dkmeans.sweep(blobs, k_values)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"n_clusters": 3}, "no n_clusters"),
        ({"checkpoint": "x.npz"}, "no checkpoint"),
        ({"init": np.zeros((2, 3))}, "initial centroids"),
        ({"reference_draws": 2.5}, "reference_draws must be an integer >= 0"),
        ({"reference_rows": 0}, "reference_rows must be an integer >= 1"),
        ({"silhouette_rows": -1}, "silhouette_rows must be an integer >= 0"),
        ({"silhouette_rows": True}, "silhouette_rows must be an integer >= 0"),
    ],
)
def test_parameters_a_sweep_does_not_take(blobs, params, message):
    with pytest.raises(InvalidParameterError, match=message):
        dkmeans.sweep(blobs, [2, 3], **params)


def test_a_capped_sweep_checks_its_caps_as_a_single_fit_does(blobs):
    import scipy.sparse as sp

    with pytest.raises(InvalidParameterError, match="balanced needs dense rows"):
        dkmeans.sweep(sp.csr_matrix(blobs), [2, 3], balanced=True)
    with pytest.raises(InvalidParameterError, match="needs Lloyd's algorithm"):
        dkmeans.sweep(blobs, [2, 3], balanced=True, algorithm="hartigan")
    result = dkmeans.sweep(blobs, [2, 3], balanced=True, random_state=0, reference_draws=0)
    for k, model in result.models.items():
        sizes = np.bincount(model.labels_, minlength=k)
        assert sizes.max() - sizes.min() <= 1, sizes


@pytest.mark.parametrize(
    "ks, objectives, expected",
    [
        # log10 = 3, 2, 1, .699, .602; scaled y = 1, .583, .166, .043, 0; x = 0, .25, .5, .75, 1;
        # chord - curve = 0, .167, .334, .207, 0
        ([1, 2, 3, 4, 5], [1000, 100, 10, 5, 4], 3),
        # uneven k: log10 = 4, 2, 1, 0: y = 1, .5, .25, 0; x = 0, .143, .429, 1; chord - curve = 0, .357, .321, 0
        ([2, 4, 8, 16], [1e4, 1e2, 1e1, 1e0], 4),
        # the third point a little lower: log10 = 4, 2, .5, 0: y = 1, .5, .125, 0: .571 - .125 = .446 beats .357
        ([2, 4, 8, 16], [1e4, 1e2, 10**0.5, 1e0], 8),
        # 6 blobs (the CLI's 20,000 rows, k = 2..10): the log finds the sixth; the objective itself the fifth
        (
            list(range(2, 11)),
            [1.25e6, 8.41e5, 4.36e5, 1.57e5, 7.96e4, 7.74e4, 7.52e4, 7.31e4, 7.09e4],
            6,
        ),
        (
            [1, 2, 3],
            [100, 10, 0],
            2,
        ),  # an objective of 0: scaled as it is; y = 1, .1, 0; chord - curve = 0, .4, 0
        ([1, 2, 3, 4], [1e4, 1e3, 1e2, 1e1], None),  # straight in log: no elbow
        ([1, 2, 3, 4], [40, 30, 20, 10], None),  # straight, so concave in log: no elbow
        ([2, 3], [10, 1], None),  # two points: no elbow
        ([2, 3, 4], [5, 5, 5], None),  # flat
    ],
)
def test_the_elbow_rule_on_hand_computed_curves(ks, objectives, expected):
    assert elbow(ks, objectives) == expected


def test_the_result_states_its_rule_table_and_plot(blobs, tmp_path):
    result = dkmeans.sweep(blobs, [2, 3, 5, 8, 12], random_state=0)
    assert result.suggested_k == 5 and result.rule.startswith("the most votes of calinski_harabasz")
    assert (
        result.answers == answers(result.scores)
        and result.answers["elbow"]
        == elbow(result.k_values, [result.objective[k] for k in result.k_values])
        == 5
    )
    table = result.format_table()
    assert (
        "<- suggested" in table.splitlines()[3]
        and f"passes over the data: {result.n_passes} in all" in table
    )
    assert "each rule's k: elbow 5, calinski_harabasz 5" in table
    assert [row["k"] for row in result.rows()] == [2, 3, 5, 8, 12]
    assert set(result.metrics[5]) == {
        "objective",
        "calinski_harabasz",
        "davies_bouldin",
        "simplified_silhouette",
        "imbalance",
        "bic",
        "silhouette",
        "gap",
        "gap_sd",
    }
    assert all(
        name in table.splitlines()[0] for name in ("calinski_harabasz", "silhouette", "gap", "bic")
    )
    pytest.importorskip("matplotlib")
    path = result.plot(tmp_path / "sweep.png")
    assert path == tmp_path / "sweep.png" and path.stat().st_size > 5_000


def test_the_issue_s_coarse_grid_suggests_the_eight_blobs():
    """8 blobs in 6 d, two pairs of them 5 sd apart: the elbow of the coarse grid says 6, the suggestion 8."""
    X, _, _ = make_blobs(6000, 6, 8, spread=1.0, box=10.0, seed=36)
    result = dkmeans.sweep(X, [2, 3, 4, 6, 8, 10, 12], random_state=0)
    assert result.answers["elbow"] == 6 and result.answers["calinski_harabasz"] == 8
    assert result.suggested_k == 8, result.rule


def test_uniform_data_has_no_clear_k():
    X = np.random.default_rng(0).uniform(size=(3000, 3))
    result = dkmeans.sweep(X, [2, 3, 4, 6, 8], random_state=0)
    assert result.suggested_k is None and result.rule.startswith("no clear k")
    assert "suggested k: none (no clear k" in result.format_table()
    # each rule still answers: the indices always have a best k, the gap rule stops at 1
    assert result.answers["calinski_harabasz"] is not None and result.answers["gap"] is None


def test_the_scores_are_scikit_learn_s_on_the_same_labels(blobs):
    """A sample as large as the data: the silhouette of all rows; CH and DB of every k as scikit-learn gives them."""
    from sklearn.metrics import silhouette_score

    ks = [2, 4, 5, 7]
    result = dkmeans.sweep(blobs, ks, random_state=1, silhouette_rows=len(blobs))
    for k in ks:
        labels = result.models[k].labels_
        assert result.metrics[k]["silhouette"] == pytest.approx(
            silhouette_score(blobs, labels), rel=1e-9
        )
        assert result.metrics[k]["calinski_harabasz"] == pytest.approx(
            calinski_harabasz_score(blobs, labels), rel=1e-9
        )
        assert result.metrics[k]["davies_bouldin"] == pytest.approx(
            davies_bouldin_score(blobs, labels), rel=1e-9
        )
        sizes = np.bincount(labels, minlength=k)
        assert result.metrics[k]["bic"] == pytest.approx(
            bic_score(sizes, result.objective[k], 3), rel=1e-12
        )


def test_the_gap_is_the_reference_fits_log_objective_less_the_data_s():
    """gap(k) = mean over draws of log(W*_k / m) - log(W_k / n); at k = 1 from the data's scatter."""
    X = np.random.default_rng(3).normal(size=(500, 2))
    result = dkmeans.sweep(X, [2, 3], random_state=0, reference_draws=3, reference_rows=400)
    ref = result.reference
    assert ref.draws == 3 and ref.rows == 400 and ref.total_weight == 500
    assert ref.total_scatter == pytest.approx(((X - X.mean(0)) ** 2).sum(), rel=1e-12)
    for k in (2, 3):
        want = ref.mean_log[k] - np.log(result.objective[k] / 500)
        assert result.metrics[k]["gap"] == pytest.approx(want, rel=1e-12)
        assert result.metrics[k]["gap_sd"] == pytest.approx(
            ref.sd_log[k] * np.sqrt(1 + 1 / 3), rel=1e-12
        )
    assert result.scores.gap_at_1 == pytest.approx(
        ref.mean_log[1] - np.log(ref.total_scatter / 500)
    )
    # the reference at k = 1: the scatter of the reference rows about their mean, per row
    from dkmeans.drivers.streams import stream
    from dkmeans.kernels.reference import Frame, FrameStats, principal_axes, reference_rows

    centred = X - X.mean(0)
    axes = principal_axes(FrameStats(500.0, X.mean(0), centred.T @ centred))
    projected = centred @ axes
    frame = Frame(X.mean(0), axes, projected.min(0), projected.max(0))
    logs = []
    for b in range(3):
        R = reference_rows(frame, 0, 500, 400, result.random_state, stream("gap.reference", b))
        logs.append(np.log(((R - R.mean(0)) ** 2).sum() / 400))
    assert ref.mean_log[1] == pytest.approx(np.mean(logs), rel=1e-9)
    assert ref.sd_log[1] == pytest.approx(np.std(logs), rel=1e-6, abs=1e-12)


def test_without_reference_draws_or_sample_the_rules_that_need_them_abstain(blobs):
    result = dkmeans.sweep(blobs, [2, 5, 8], random_state=0, reference_draws=0, silhouette_rows=0)
    assert (
        result.reference is None
        and result.answers["gap"] is None
        and result.answers["silhouette"] is None
    )
    assert result.suggested_k == 5 and "no test for data without clusters" in result.rule
    assert result.n_passes == max(result.passes.values()) + METRIC_PASSES


def test_sparse_rows_sweep_with_scikit_learn_s_scores():
    """CSR data: the scores of every k are scikit-learn's (on the dense rows); no gap, no silhouette (Euclidean
    reference and sample of dense rows only)."""
    import scipy.sparse as sp

    X = sp.random(400, 12, density=0.3, format="csr", random_state=0, dtype=np.float64)
    result = dkmeans.sweep(X, [2, 3, 4], random_state=0)
    dense = X.toarray()
    for k in (2, 3, 4):
        labels = result.models[k].labels_
        assert result.metrics[k]["calinski_harabasz"] == pytest.approx(
            calinski_harabasz_score(dense, labels), rel=1e-9
        )
        assert result.metrics[k]["davies_bouldin"] == pytest.approx(
            davies_bouldin_score(dense, labels), rel=1e-9
        )
    assert (
        result.reference is None
        and result.answers["gap"] is None
        and result.answers["silhouette"] is None
    )
    assert result.suggested_k in (2, 3, 4) and "no test for data without clusters" in result.rule
