"""The oneDAL-style API: invariants, preconditions, postconditions, train/infer agreement."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

import dkmeans
from dkmeans import Descriptor, InferResult, Model, TrainResult, infer, train
from dkmeans.errors import DataTypeError, DKMeansError, InvalidDataError, InvalidParameterError
from dkmeans.testing import make_blobs, pick_rows, reference_lloyd


def test_descriptor_defaults_follow_the_spec():
    d = Descriptor()
    assert (d.cluster_count, d.max_iteration_count, d.accuracy_threshold) == (2, 100, 0.0)
    assert d.dtype is np.float32 and d.stop_rule == "objective-decrease"


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"cluster_count": 0}, "cluster_count"),
        ({"cluster_count": -3}, "cluster_count"),
        ({"cluster_count": 2.5}, "cluster_count"),
        ({"cluster_count": True}, "cluster_count"),
        ({"max_iteration_count": -1}, "max_iteration_count"),
        ({"accuracy_threshold": -1e-9}, "accuracy_threshold"),
        ({"accuracy_threshold": float("nan")}, "accuracy_threshold"),
        ({"dtype": np.int32}, "dtype"),
        ({"stop_rule": "labels"}, "stop_rule"),
    ],
)
def test_descriptor_invariants(kwargs, fragment):
    with pytest.raises(InvalidParameterError, match=fragment):
        Descriptor(**kwargs)


def test_descriptor_rejects_unknown_parameters():
    with pytest.raises(TypeError, match="n_clusters"):
        Descriptor(n_clusters=3)


def test_model_invariant():
    m = Model(np.zeros((3, 2)))
    assert m.cluster_count == 3
    with pytest.raises(InvalidDataError, match="cluster_count"):
        Model(np.zeros((3, 2)), cluster_count=4)
    with pytest.raises(InvalidDataError, match="non-empty 2-D"):
        Model(np.zeros((0, 2)))


@pytest.fixture
def problem():
    X, _, _ = make_blobs(1500, 3, 4, spread=2.5, box=6.0, seed=21)
    return X, pick_rows(X, 4, seed=2)


def test_train_postconditions_and_reference(client, problem):
    X, C0 = problem
    desc = Descriptor(
        cluster_count=4, max_iteration_count=100, accuracy_threshold=1e-6, dtype=np.float64
    )
    res = train(desc, X, C0)
    ref = reference_lloyd(X, C0, max_iter=100, threshold=1e-6)
    assert isinstance(res, TrainResult)
    assert res.labels.shape == (X.shape[0],) and res.labels.dtype == np.int32
    assert res.model.centroids.shape == (4, 3) and res.model.cluster_count == 4
    assert 0 <= res.iteration_count <= desc.max_iteration_count
    assert res.objective_function_value >= 0
    assert res.iteration_count == ref.n_iter
    np.testing.assert_allclose(res.model.centroids, ref.centroids, rtol=1e-7)
    np.testing.assert_array_equal(res.labels, ref.labels)
    np.testing.assert_allclose(res.objective_function_value, ref.objective, rtol=1e-7)
    assert len(res.history) == res.iteration_count


def test_infer_gives_exactly_the_training_labels_and_objective(client, problem):
    X, C0 = problem
    desc = Descriptor(cluster_count=4, max_iteration_count=7, dtype=np.float64)
    res = train(desc, X, C0)
    inf = infer(desc, res.model, X)
    assert isinstance(inf, InferResult)
    np.testing.assert_array_equal(inf.labels, res.labels)
    assert inf.objective_function_value == res.objective_function_value


def test_float32_descriptor_converts_data(client, problem):
    X, C0 = problem
    res = train(Descriptor(cluster_count=4, max_iteration_count=50), X, C0)
    assert res.model.centroids.dtype == np.float32
    ref = reference_lloyd(X.astype(np.float32), C0.astype(np.float32), max_iter=50)
    np.testing.assert_allclose(res.model.centroids, ref.centroids, rtol=1e-4, atol=1e-5)
    assert X.dtype == np.float64  # the user's array is untouched


def test_dask_in_dask_out(client, problem):
    X, C0 = problem
    desc = Descriptor(cluster_count=4, max_iteration_count=30, dtype=np.float64)
    res = train(desc, da.from_array(X, chunks=(200, 3)), C0)
    assert isinstance(res.labels, da.Array)
    np.testing.assert_array_equal(res.labels.compute(), train(desc, X, C0).labels)
    inf = infer(desc, res.model, da.from_array(X, chunks=(700, 3)))
    assert isinstance(inf.labels, da.Array)
    np.testing.assert_array_equal(inf.labels.compute(), res.labels.compute())


def test_centroid_shift_stop_rule_option(client, problem):
    X, C0 = problem
    desc = Descriptor(
        cluster_count=4,
        max_iteration_count=100,
        accuracy_threshold=1e-3,
        dtype=np.float64,
        stop_rule="centroid-shift",
    )
    res = train(desc, X, C0)
    ref = reference_lloyd(X, C0, max_iter=100, tol=1e-3, tol_inclusive=False)
    assert res.iteration_count == ref.n_iter
    assert res.history[-1].centroid_shift < 1e-3 or res.stop_reason == "fixed-point"


def test_named_initialisation_is_reproducible(client, problem):
    X, _ = problem
    desc = Descriptor(cluster_count=4, max_iteration_count=0, dtype=np.float64)
    a = train(desc, X, "random", random_state=5).model.centroids
    b = train(desc, da.from_array(X, chunks=(111, 3)), "random", random_state=5).model.centroids
    np.testing.assert_array_equal(a, b)
    # the centroids are rows of X
    assert all(any(np.array_equal(c, x) for x in X) for c in a)


@pytest.mark.parametrize(
    "make, error, fragment",
    [
        (lambda X, C: (X, C[:3]), InvalidDataError, "shape"),
        (lambda X, C: (X, C[:, :2]), InvalidDataError, "shape"),
        (lambda X, C: (X[:0], C), InvalidDataError, "0 sample"),
        (lambda X, C: (X[:, :0], C[:, :0]), InvalidDataError, "0 feature"),
        (lambda X, C: (X[:3], C), InvalidParameterError, "should be >= cluster_count"),
        (
            lambda X, C: (np.where(np.arange(len(X))[:, None] == 5, np.nan, X), C),
            InvalidDataError,
            "NaN",
        ),
        (
            lambda X, C: (np.where(np.arange(len(X))[:, None] == 5, np.inf, X), C),
            InvalidDataError,
            "infinity",
        ),
        (
            lambda X, C: (X, np.where(np.arange(4)[:, None] == 0, np.nan, C)),
            InvalidDataError,
            "NaN",
        ),
        (lambda X, C: (X[:, 0], C), InvalidDataError, "2D"),
        (lambda X, C: (X, C[:0]), InvalidDataError, "initial_centroids"),
        (lambda X, C: (X, "k-means+++"), InvalidParameterError, "unknown strategy"),
        (lambda X, C: (X.astype(complex), C), InvalidDataError, "Complex data not supported"),
        (lambda X, C: (np.array([["a", "b", "c"]] * 10), C), DKMeansError, "data"),
    ],
)
def test_train_preconditions(client, problem, make, error, fragment):
    X, C0 = problem
    data, C = make(X, C0)
    with pytest.raises(error, match=fragment):
        train(Descriptor(cluster_count=4, dtype=np.float64), data, C)


def test_nan_in_dask_data_is_reported(client, problem):
    X, C0 = problem
    X = X.copy()
    X[1234, 2] = np.nan
    with pytest.raises(InvalidDataError, match="NaN or infinity"):
        train(Descriptor(cluster_count=4, dtype=np.float64), da.from_array(X, chunks=(300, 3)), C0)


def test_infer_preconditions(client, problem):
    X, C0 = problem
    model = Model(C0)
    with pytest.raises(InvalidDataError, match="cluster_count"):
        infer(Descriptor(cluster_count=3), model, X)
    with pytest.raises(InvalidDataError, match="features"):
        infer(Descriptor(cluster_count=4), model, X[:, :2])
    with pytest.raises(DataTypeError, match="Model"):
        infer(Descriptor(cluster_count=4), C0, X)
    with pytest.raises(DataTypeError, match="Descriptor"):
        train({"cluster_count": 4}, X, C0)


def test_errors_are_value_and_type_errors():
    assert issubclass(InvalidDataError, ValueError) and issubclass(
        InvalidParameterError, ValueError
    )
    assert issubclass(DataTypeError, TypeError)
    assert dkmeans.Descriptor is Descriptor
