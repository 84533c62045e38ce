"""Bad input at every public entry: the error type names the problem and the inputs stay unchanged.

One parametrised case per problem listed in the reliability issue, run through the
estimator (NumPy and Dask input), the functional API, the CLI and model loading.
"""

from __future__ import annotations

import warnings

import dask.array as da
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from sklearn.exceptions import ConvergenceWarning, NotFittedError

import dkmeans
from dkmeans.cli import main as cli_main
from dkmeans.errors import DataTypeError, InvalidDataError, InvalidParameterError
from dkmeans.io import ModelFileError

RNG = np.random.default_rng(0)
GOOD = RNG.normal(size=(40, 3))


def _with_nan_in_last_chunk():
    X = GOOD.copy()
    X[-1, 2] = np.nan
    return X


def _with_inf():
    X = GOOD.copy()
    X[7, 0] = np.inf
    return X


# (id, X, kwargs for KMeans, fit kwargs, error type, message fragment)
ESTIMATOR_CASES = [
    ("nan", _with_nan_in_last_chunk(), {}, {}, InvalidDataError, "NaN"),
    ("inf", _with_inf(), {}, {}, InvalidDataError, "infinity"),
    ("1-d", GOOD[:, 0], {}, {}, InvalidDataError, "2D"),
    ("3-d", GOOD.reshape(40, 3, 1), {}, {}, InvalidDataError, "dim"),
    ("zero rows", GOOD[:0], {}, {}, InvalidDataError, "0 sample"),
    ("zero columns", GOOD[:, :0], {}, {}, InvalidDataError, "0 feature"),
    (
        "k = 0",
        GOOD,
        {"n_clusters": 0},
        {},
        InvalidParameterError,
        "n_clusters must be an integer >= 1",
    ),
    ("k < 0", GOOD, {"n_clusters": -2}, {}, InvalidParameterError, "n_clusters"),
    (
        "k not integer",
        GOOD,
        {"n_clusters": 2.5},
        {},
        InvalidParameterError,
        "n_clusters must be an integer",
    ),
    (
        "k as string",
        GOOD,
        {"n_clusters": "3"},
        {},
        InvalidParameterError,
        "n_clusters must be an integer",
    ),
    (
        "k > n",
        GOOD,
        {"n_clusters": 41},
        {},
        InvalidParameterError,
        "n_samples=40 should be >= n_clusters=41",
    ),
    ("complex", GOOD + 1j, {}, {}, (DataTypeError, InvalidDataError), "omplex"),
    (
        "strings",
        np.array([["a", "b"], ["c", "d"]]),
        {"n_clusters": 1},
        {},
        (DataTypeError, InvalidDataError),
        "string",
    ),
    ("init wrong shape", GOOD, {"init": np.zeros((3, 2))}, {}, InvalidDataError, "init"),
    ("init wrong k", GOOD, {"init": np.zeros((4, 3))}, {}, InvalidDataError, "init"),
    ("init nan", GOOD, {"init": np.full((3, 3), np.nan)}, {}, InvalidDataError, "init"),
    (
        "init unknown name",
        GOOD,
        {"init": "kmeans++"},
        {},
        InvalidParameterError,
        "'init' parameter of KMeans must be",
    ),
    ("weights length", GOOD, {}, {"sample_weight": np.ones(39)}, InvalidDataError, "sample_weight"),
    ("weights negative", GOOD, {}, {"sample_weight": -np.ones(40)}, InvalidDataError, "negative"),
    (
        "weights all zero",
        GOOD,
        {},
        {"sample_weight": np.zeros(40)},
        InvalidDataError,
        "sample_weight",
    ),
    (
        "weights nan",
        GOOD,
        {},
        {"sample_weight": np.r_[np.ones(39), np.nan]},
        InvalidDataError,
        "sample_weight",
    ),
    ("unknown algorithm", GOOD, {"algorithm": "elkan"}, {}, InvalidParameterError, "algorithm"),
    ("bad max_iter", GOOD, {"max_iter": 0}, {}, InvalidParameterError, "max_iter"),
    ("bad tol", GOOD, {"tol": -1.0}, {}, InvalidParameterError, "tol"),
]


def _copies(X, fit_kwargs, params):
    def snapshot(v):
        return v.copy() if hasattr(v, "copy") else v

    return (
        snapshot(X),
        {k: snapshot(v) for k, v in fit_kwargs.items()},
        {k: snapshot(v) for k, v in params.items()},
    )


def _assert_unchanged(before, after):
    for a, b in zip(before, after):
        if isinstance(a, dict):
            _assert_unchanged(list(a.values()), list(b.values()))
        elif sp.issparse(a):
            assert (a != b).nnz == 0
        elif isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("case", ESTIMATOR_CASES, ids=[c[0] for c in ESTIMATOR_CASES])
def test_estimator_numpy(client, case):
    _, X, params, fit_kwargs, error, fragment = case
    before = _copies(X, fit_kwargs, params)
    km = dkmeans.KMeans(**{"n_clusters": 3, "random_state": 0, **params})
    with pytest.raises(error, match=fragment):
        km.fit(X, **fit_kwargs)
    assert not hasattr(km, "cluster_centers_") and not hasattr(km, "n_features_in_")
    _assert_unchanged(before, (X, fit_kwargs, params))


DASK_CASES = [
    c
    for c in ESTIMATOR_CASES
    if c[0]
    in {
        "nan",
        "inf",
        "k > n",
        "weights length",
        "weights negative",
        "weights all zero",
        "weights nan",
        "init wrong shape",
    }
]


@pytest.mark.parametrize("case", DASK_CASES, ids=[c[0] for c in DASK_CASES])
def test_estimator_dask(client, case):
    """The same problems in a 4-chunk Dask array (NaN in the last chunk; k > n globally, not per chunk)."""
    _, X, params, fit_kwargs, error, fragment = case
    Xd = da.from_array(X, chunks=(10, 3))
    fit_kwargs = {k: da.from_array(v, chunks=10) for k, v in fit_kwargs.items()}
    km = dkmeans.KMeans(**{"n_clusters": 3, "random_state": 0, **params})
    with pytest.raises(error, match=fragment):
        km.fit(Xd, **fit_kwargs)
    assert not hasattr(km, "cluster_centers_")


def test_k_larger_than_rows_is_global_for_dask_with_unknown_chunks(client):
    """Every chunk has fewer rows than k, but the data has more: fine. k above all rows: an error."""
    df = pd.DataFrame(GOOD, columns=list("abc"))
    import dask.dataframe as dd

    ddf = dd.from_pandas(df, npartitions=8)  # 5 rows a partition, unknown lengths as an array
    X = ddf.to_dask_array()
    assert np.isnan(X.shape[0])
    assert dkmeans.KMeans(7, random_state=0).fit(X).cluster_centers_.shape == (7, 3)
    with pytest.raises(InvalidParameterError, match="n_samples=40 should be >= n_clusters=41"):
        dkmeans.KMeans(41, random_state=0).fit(X)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.bool_, np.float16])
def test_integer_bool_float16_are_converted_as_scikit_learn_does(client, dtype):
    from sklearn.cluster import KMeans as SKKMeans

    X = (np.abs(GOOD) * 3).astype(dtype)
    ours = dkmeans.KMeans(2, init=X[:2].astype(np.float64), n_init=1).fit(X)
    theirs = SKKMeans(2, init=X[:2].astype(np.float64), n_init=1).fit(X)
    assert ours.cluster_centers_.dtype == theirs.cluster_centers_.dtype
    np.testing.assert_allclose(ours.cluster_centers_, theirs.cluster_centers_, rtol=1e-6)
    assert X.dtype == dtype  # not converted in place


def test_columns_chunked_data_gives_the_row_chunked_result(client):
    X = RNG.normal(size=(400, 6))
    C0 = X[:4].copy()
    by_rows = dkmeans.KMeans(4, init=C0, n_init=1, tol=0).fit(da.from_array(X, chunks=(100, 6)))
    by_both = dkmeans.KMeans(4, init=C0, n_init=1, tol=0).fit(da.from_array(X, chunks=(100, 2)))
    np.testing.assert_allclose(by_both.cluster_centers_, by_rows.cluster_centers_, rtol=1e-12)


@pytest.mark.parametrize("algorithm", ["lloyd", "hartigan"])
def test_fewer_distinct_points_than_k_warns_returns_k_centres_and_terminates(client, algorithm):
    X = np.repeat(np.array([[0.0, 0.0], [5.0, 5.0], [9.0, 0.0]]), 20, axis=0)
    with pytest.warns(ConvergenceWarning, match="distinct"):
        km = dkmeans.KMeans(5, max_iter=1000, tol=0, random_state=0, algorithm=algorithm).fit(X)
    assert km.cluster_centers_.shape == (5, 2)
    assert km.n_iter_ < 1000 and km.inertia_ == 0.0
    assert {tuple(c) for c in km.cluster_centers_} == {(0.0, 0.0), (5.0, 5.0), (9.0, 0.0)}


def test_fewer_distinct_points_during_lloyd_itself_warns_and_stops(client):
    """Initial centres given by the user: the empty clusters cannot get a row of their own."""
    X = np.repeat(np.array([[0.0, 0.0], [5.0, 5.0]]), 10, axis=0)
    init = np.array([[0.0, 0.0], [5.0, 5.0], [100.0, 100.0]])
    with pytest.warns(ConvergenceWarning, match="distinct"):
        km = dkmeans.KMeans(3, init=init, max_iter=500, tol=0).fit(X)
    assert km.n_iter_ <= 3 and km.stop_reason_ in ("fixed-point", "centroid-shift")
    assert km.cluster_centers_.shape == (3, 2)


def test_constant_data(client):
    X = np.full((30, 3), 2.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        km = dkmeans.KMeans(3, random_state=0).fit(X)
    np.testing.assert_array_equal(km.cluster_centers_, np.full((3, 3), 2.5))
    assert km.inertia_ == 0.0


def test_predict_errors(client):
    km = dkmeans.KMeans(3, random_state=0)
    with pytest.raises(NotFittedError):
        km.predict(GOOD)
    km.fit(GOOD)
    with pytest.raises(InvalidDataError, match="3 features"):
        km.predict(GOOD[:, :2])
    with pytest.raises(InvalidDataError, match="3 features"):
        km.predict(da.from_array(GOOD[:, :2], chunks=10))
    with pytest.raises(InvalidDataError, match="NaN"):
        km.predict(_with_nan_in_last_chunk())


FUNCTIONAL_CASES = [
    ("nan", _with_nan_in_last_chunk(), {}, InvalidDataError, "NaN"),
    ("1-d", GOOD[:, 0], {}, InvalidDataError, "2D"),
    ("zero rows", GOOD[:0], {}, InvalidDataError, "0 sample"),
    (
        "k > n",
        GOOD,
        {"cluster_count": 41},
        InvalidParameterError,
        "n_samples=40 should be >= cluster_count=41",
    ),
    ("k = 0", GOOD, {"cluster_count": 0}, InvalidParameterError, "cluster_count"),
    ("k not integer", GOOD, {"cluster_count": 2.0}, InvalidParameterError, "cluster_count"),
    ("unknown parameter", GOOD, {"clusters": 3}, TypeError, "clusters"),
    ("complex", GOOD + 1j, {}, (DataTypeError, InvalidDataError), "omplex"),
]


@pytest.mark.parametrize("case", FUNCTIONAL_CASES, ids=[c[0] for c in FUNCTIONAL_CASES])
def test_functional_train(client, case):
    _, X, desc_kwargs, error, fragment = case
    before = X.copy()
    with pytest.raises(error, match=fragment):
        dkmeans.train(
            dkmeans.Descriptor(**{"cluster_count": 3, **desc_kwargs}), X, "random", random_state=0
        )
    np.testing.assert_array_equal(before, X)


def test_functional_bad_initial_centroids_and_weights(client):
    desc = dkmeans.Descriptor(cluster_count=3)
    with pytest.raises(InvalidDataError, match="initial_centroids"):
        dkmeans.train(desc, GOOD, np.zeros((3, 2)))
    with pytest.raises(InvalidParameterError, match="unknown strategy"):
        dkmeans.train(desc, GOOD, "kmeans||")
    with pytest.raises(InvalidDataError, match="negative"):
        dkmeans.train(desc, GOOD, sample_weight=-np.ones(40))
    model = dkmeans.train(desc, GOOD, GOOD[:3]).model
    with pytest.raises(InvalidDataError, match="features"):
        dkmeans.infer(desc, model, GOOD[:, :2])


@pytest.fixture
def csv_file(tmp_path):
    path = tmp_path / "data.csv"
    pd.DataFrame(GOOD, columns=["a", "b", "c"]).assign(name="x").to_csv(path, index=False)
    return path


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["-k", "0"], "-k must be an integer >= 1"),
        (["-k", "41"], "41"),
        (["-k", "3", "--columns", "a", "name"], "name"),
        (["-k", "3", "--columns", "nope"], "nope"),
        (["-k", "3", "--resume"], "--resume needs --checkpoint"),
        (["-k", "3", "--checkpoint-every", "0", "--checkpoint", "ck"], "checkpoint-every"),
    ],
    ids=[
        "k=0",
        "k>n",
        "string column",
        "missing column",
        "resume without checkpoint",
        "bad checkpoint-every",
    ],
)
def test_cli_fit(client, csv_file, tmp_path, capsys, args, fragment):
    before = csv_file.read_bytes()
    code = cli_main(
        [
            "fit",
            str(csv_file),
            "--model",
            str(tmp_path / "m.npz"),
            "--scheduler",
            client.scheduler.address,
            "--quiet",
            *args,
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and err.count("\n") == 1
    assert not (tmp_path / "m.npz").exists()
    assert csv_file.read_bytes() == before


def test_cli_missing_input_and_model(tmp_path, capsys):
    assert (
        cli_main(["fit", str(tmp_path / "none.parquet"), "-k", "2", "--model", str(tmp_path / "m")])
        == 2
    )
    assert "none.parquet" in capsys.readouterr().err
    assert (
        cli_main(
            [
                "predict",
                str(tmp_path / "none.npz"),
                str(tmp_path / "x.csv"),
                "--output",
                str(tmp_path),
            ]
        )
        == 2
    )
    assert "none.npz" in capsys.readouterr().err


@pytest.mark.parametrize(
    "content, fragment",
    [
        (b"not a zip at all", "not an .npz"),
        (b"PK\x03\x04 truncated", "damaged or truncated"),
    ],
    ids=["garbage", "truncated"],
)
def test_model_loading(tmp_path, content, fragment):
    path = tmp_path / "model.npz"
    path.write_bytes(content)
    with pytest.raises(ModelFileError, match=fragment):
        dkmeans.KMeans.load(path)
    with pytest.raises(ModelFileError, match="does not exist"):
        dkmeans.KMeans.load(tmp_path / "missing.npz")


# -- bad values found lazily: raised when computed, as at fit ----------------------------------
LAZY_MESSAGE = r"Input contains NaN or infinity"
#: NaN in a DataFrame is a missing value: the message names the column and counts them
FRAME_MESSAGE = {
    "nan": r"X: missing values \(NaN or null\) in column\(s\) 'c' \(1\)",
    "inf": LAZY_MESSAGE,
}


def _bad(kind):
    return _with_nan_in_last_chunk() if kind == "nan" else _with_inf()


def _frame(X):
    return pd.DataFrame(X, columns=list("abc"))


@pytest.fixture(scope="module")
def fitted(client):
    return dkmeans.KMeans(3, random_state=0).fit(GOOD)


@pytest.fixture(scope="module")
def fitted_frame(client):
    """Fitted on named columns, for DataFrame input."""
    return dkmeans.KMeans(3, random_state=0).fit(_frame(GOOD))


@pytest.mark.parametrize("kind", ["nan", "inf"])
@pytest.mark.parametrize("method", ["predict", "transform"])
def test_bad_values_in_a_dask_chunk_raise_when_computed(fitted, method, kind):
    """NaN in the last chunk (infinity in the first): the lazy result raises when computed, not before."""
    X = da.from_array(_bad(kind), chunks=(10, 3))
    lazy = getattr(fitted, method)(X)  # metadata only: nothing computed yet
    with pytest.raises(InvalidDataError, match=LAZY_MESSAGE):
        lazy.compute()
    # the check is the bad chunk's: the other chunks compute, and as NumPy input gives
    good = slice(10, 30)
    np.testing.assert_allclose(lazy[good].compute(), getattr(fitted, method)(GOOD[good]), rtol=1e-6)


@pytest.mark.parametrize("kind", ["nan", "inf"])
@pytest.mark.parametrize("method", ["predict", "transform"])
def test_bad_values_in_a_dask_dataframe_partition_raise_when_computed(fitted_frame, method, kind):
    import dask.dataframe as dd

    lazy = getattr(fitted_frame, method)(dd.from_pandas(_frame(_bad(kind)), npartitions=4))
    with pytest.raises(InvalidDataError, match=FRAME_MESSAGE[kind]):
        lazy.compute()
    good = dd.from_pandas(_frame(GOOD), npartitions=4)
    np.testing.assert_allclose(
        np.asarray(getattr(fitted_frame, method)(good).compute()),
        np.asarray(getattr(fitted_frame, method)(_frame(GOOD))),
        rtol=1e-6,
    )


@pytest.mark.parametrize("kind", ["nan", "inf"])
def test_score_of_bad_dask_data_raises(fitted, fitted_frame, kind):
    """score computes the objective, so it raises at the call; so does metrics.objective."""
    import dask.dataframe as dd

    from dkmeans.metrics import objective

    X = _bad(kind)
    with pytest.raises(InvalidDataError, match=LAZY_MESSAGE):
        fitted.score(da.from_array(X, chunks=(10, 3)))
    with pytest.raises(InvalidDataError, match=FRAME_MESSAGE[kind]):
        fitted_frame.score(dd.from_pandas(_frame(X), npartitions=4))
    with pytest.raises(InvalidDataError, match=LAZY_MESSAGE):
        objective(da.from_array(X, chunks=(10, 3)), fitted.cluster_centers_)
    with pytest.raises(InvalidDataError, match=LAZY_MESSAGE):
        objective(X, fitted.cluster_centers_)
    assert fitted.score(da.from_array(GOOD, chunks=(10, 3))) == pytest.approx(
        fitted.score(GOOD), rel=1e-12
    )


@pytest.mark.parametrize("kind", ["nan", "inf"])
@pytest.mark.parametrize("method", ["predict", "transform", "score"])
def test_bad_values_in_local_input_raise_at_call(fitted, fitted_frame, method, kind):
    X = _bad(kind)
    fragment = "NaN" if kind == "nan" else "infinity"
    with pytest.raises(InvalidDataError, match=fragment):
        getattr(fitted, method)(X)
    with pytest.raises(InvalidDataError, match=fragment):
        getattr(fitted_frame, method)(_frame(X))


@pytest.mark.parametrize("kind", ["nan", "inf"])
def test_infer_on_bad_dask_data_raises(client, kind):
    import dask.dataframe as dd

    desc = dkmeans.Descriptor(cluster_count=3)
    model = dkmeans.train(desc, GOOD, GOOD[:3]).model
    X = _bad(kind)
    with pytest.raises(InvalidDataError, match=LAZY_MESSAGE):
        dkmeans.infer(desc, model, da.from_array(X, chunks=(10, 3)))
    with pytest.raises(InvalidDataError, match=FRAME_MESSAGE[kind].replace("X:", "data:")):
        dkmeans.infer(desc, model, dd.from_pandas(_frame(X), npartitions=4))
