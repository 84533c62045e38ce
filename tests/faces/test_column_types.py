"""Every numeric column type a pipeline produces, in every face, in memory, persisted and out of core.

Each input holds the same small integer-valued numbers (exact in every type: int8 to uint64,
float16, bools, decimals); each fit is compared with the float64 fit of those numbers from the
same initial centroids (NumPy in, scikit-learn's checks), the result dtype following the rule:
float32 stays float32, everything else float64.
"""

from __future__ import annotations

from decimal import Decimal

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dkmeans
from dkmeans import KMeans, MiniBatchKMeans
from dkmeans.errors import DataTypeError, InvalidDataError

polars = pytest.importorskip("polars")

# three blobs of integer points, 120 rows: exact in every numeric type below
_rng = np.random.default_rng(7)
CENTRES = np.array([[10, 10, 10], [50, 60, 80], [90, 20, 40]])
VALUES = np.concatenate([c + _rng.integers(-5, 6, size=(40, 3)) for c in CENTRES]).astype(
    np.float64
)
INIT_ROWS = [0, 40, 80]
COLUMNS = ["a", "b", "c"]

NUMPY_TYPES = [
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "bool",
]
NULLABLE_TYPES = [
    "Int8",
    "Int16",
    "Int32",
    "Int64",
    "UInt8",
    "UInt16",
    "UInt32",
    "UInt64",
    "Float32",
    "Float64",
    "boolean",
]
ARROW_TYPES = [
    "int8[pyarrow]",
    "uint64[pyarrow]",
    "float[pyarrow]",
    "double[pyarrow]",
    "bool[pyarrow]",
    "decimal128(12, 2)[pyarrow]",
]
ALL_TYPES = NUMPY_TYPES + NULLABLE_TYPES + ARROW_TYPES
FLOAT32_TYPES = {"float32", "Float32", "float[pyarrow]"}


def _numbers(dtype: str) -> np.ndarray:
    """The float64 numbers a column of ``dtype`` holds (bools: 0/1; decimals: quarters, exact)."""
    if "bool" in dtype:
        return VALUES % 2
    if dtype.startswith("decimal"):
        return VALUES / 4
    return VALUES


def _column(values: np.ndarray, dtype: str):
    if dtype.startswith("decimal"):
        arrow = pa.array([Decimal(f"{v:.2f}") for v in values], type=pa.decimal128(12, 2))
        return pd.Series(arrow, dtype=pd.ArrowDtype(pa.decimal128(12, 2)))
    if "bool" in dtype:
        return pd.Series(values.astype(bool)).astype(dtype)
    return pd.Series(values).astype(dtype)


def frame_of(dtype: str, values=None) -> pd.DataFrame:
    values = _numbers(dtype) if values is None else values
    return pd.DataFrame({name: _column(values[:, j], dtype) for j, name in enumerate(COLUMNS)})


def mixed_frame() -> tuple[pd.DataFrame, np.ndarray]:
    """One frame with a column of each kind (NumPy, nullable, Arrow, decimal): and its float64 numbers."""
    cols = {
        "i8": ("Int8", VALUES[:, 0]),
        "u64": ("uint64[pyarrow]", VALUES[:, 1]),
        "dec": ("decimal128(12, 2)[pyarrow]", VALUES[:, 2] / 4),
        "f": ("float32", VALUES[:, 0] / 2),
        "flag": ("boolean", VALUES[:, 1] % 2),
    }
    frame = pd.DataFrame({name: _column(v, t) for name, (t, v) in cols.items()})
    return frame, np.column_stack([v for _, v in cols.values()]).astype(np.float64)


def reference(numbers: np.ndarray, dtype) -> KMeans:
    """The fit of the same numbers as a NumPy array of ``dtype``, from the same initial rows."""
    X = numbers.astype(dtype)
    return KMeans(3, init=X[INIT_ROWS], n_init=1).fit(X)


def _placed(frame: pd.DataFrame, placement: str, tmp_path):
    """``frame`` as a user would hold it: in memory, as a Dask DataFrame, or read back from Parquet."""
    if placement == "memory":
        return frame
    if placement in ("dask", "out_of_core"):
        return dd.from_pandas(frame, npartitions=3, sort=False)
    path = tmp_path / "data"
    path.mkdir()
    table = pa.Table.from_pandas(frame, preserve_index=False)
    for i, rows in enumerate(((0, 50), (50, 120))):  # two files, as a writer's parts
        pq.write_table(table.slice(rows[0], rows[1] - rows[0]), path / f"part-{i:05d}.parquet")
    backend = "pyarrow" if placement == "parquet_arrow" else "numpy_nullable"
    return dd.read_parquet(str(path), dtype_backend=backend)


def _expected_dtype(dtypes) -> np.dtype:
    return (
        np.dtype(np.float32)
        if all(str(t) in FLOAT32_TYPES for t in dtypes)
        else np.dtype(np.float64)
    )


def _check_fit(km, ref, dtype):
    assert km.cluster_centers_.dtype == dtype
    rtol = 1e-5 if dtype == np.float32 else 1e-9
    np.testing.assert_allclose(km.cluster_centers_, ref.cluster_centers_, rtol=rtol)
    assert km.inertia_ == pytest.approx(ref.inertia_, rel=rtol)
    assert km.n_iter_ == ref.n_iter_


def _labels(labels) -> np.ndarray:
    return np.asarray(labels.compute() if hasattr(labels, "compute") else labels)


PLACEMENTS = ["memory", "dask", "out_of_core", "parquet", "parquet_arrow"]


def _run_estimator(dtype_name, placement, tmp_path):
    frame = frame_of(dtype_name)
    numbers = _numbers(dtype_name)
    dtype = _expected_dtype(frame.dtypes)
    ref = reference(numbers, dtype)
    X = _placed(frame, placement, tmp_path)
    km = KMeans(
        3,
        init=numbers.astype(dtype)[INIT_ROWS],
        n_init=1,
        out_of_core=placement in ("out_of_core", "parquet_arrow"),
    ).fit(X)
    _check_fit(km, ref, dtype)
    assert km.data_mode_ == (
        "out-of-core" if placement in ("out_of_core", "parquet_arrow") else "in-memory"
    )
    np.testing.assert_array_equal(_labels(km.labels_), ref.labels_)
    np.testing.assert_array_equal(_labels(km.predict(X)), ref.labels_)
    np.testing.assert_allclose(
        np.asarray(_labels(km.transform(X))), ref.transform(numbers.astype(dtype)), rtol=1e-5
    )
    assert km.score(X) == pytest.approx(ref.score(numbers.astype(dtype)), rel=1e-5)


@pytest.mark.parametrize("dtype_name", ALL_TYPES)
@pytest.mark.parametrize("placement", ["memory", "dask"])
def test_every_column_type_fits_as_its_float64_numbers(client, dtype_name, placement, tmp_path):
    _run_estimator(dtype_name, placement, tmp_path)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(dtype_name=st.sampled_from(ALL_TYPES), placement=st.sampled_from(PLACEMENTS))
def test_column_types_by_placement_property(client, tmp_path_factory, dtype_name, placement):
    """Any type in any placement, out-of-core and the engine's own Parquet reader included."""
    _run_estimator(dtype_name, placement, tmp_path_factory.mktemp("types"))


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_every_face_on_a_frame_of_every_kind_of_column(client, placement, tmp_path):
    """KMeans, MiniBatchKMeans (fit, partial_fit), sweep, metrics and train/infer on one mixed frame."""
    frame, numbers = mixed_frame()
    X = _placed(frame, placement, tmp_path)
    out_of_core = placement in ("out_of_core", "parquet_arrow")
    ref = reference(numbers, np.float64)

    km = KMeans(3, init=numbers[INIT_ROWS], n_init=1, out_of_core=out_of_core).fit(X)
    _check_fit(km, ref, np.dtype(np.float64))
    assert list(km.feature_names_in_) == list(frame.columns)

    # the functional face: train and infer
    desc = dkmeans.Descriptor(cluster_count=3, max_iteration_count=300, accuracy_threshold=0.0)
    trained = dkmeans.train(desc, X, numbers[INIT_ROWS], out_of_core=out_of_core)
    ref_trained = dkmeans.train(desc, numbers, numbers[INIT_ROWS])
    np.testing.assert_allclose(trained.model.centroids, ref_trained.model.centroids, rtol=1e-9)
    inferred = dkmeans.infer(desc, trained.model, X)
    np.testing.assert_array_equal(
        _labels(inferred.labels), dkmeans.infer(desc, ref_trained.model, numbers).labels
    )

    # metrics and the sweep
    from dkmeans import metrics

    assert metrics.objective(X, ref.cluster_centers_) == pytest.approx(ref.inertia_, rel=1e-9)
    assert metrics.davies_bouldin_score(X, km) == pytest.approx(
        metrics.davies_bouldin_score(numbers, ref), rel=1e-9
    )
    swept = dkmeans.sweep(X, [2, 3], random_state=0, out_of_core=out_of_core)
    ref_swept = dkmeans.sweep(numbers, [2, 3], random_state=0)
    for k in (2, 3):
        np.testing.assert_allclose(
            swept.models[k].cluster_centers_, ref_swept.models[k].cluster_centers_, rtol=1e-9
        )

    # mini-batch: the same draws (keyed by row) whatever the input kind
    mb = MiniBatchKMeans(
        3,
        init=numbers[INIT_ROWS],
        n_init=1,
        batch_size=32,
        max_iter=5,
        random_state=0,
        out_of_core=out_of_core,
    ).fit(X)
    ref_mb = MiniBatchKMeans(
        3,
        init=numbers[INIT_ROWS],
        n_init=1,
        batch_size=32,
        max_iter=5,
        random_state=0,
        out_of_core=out_of_core,
    ).fit(dd.from_array(numbers, chunksize=40) if placement != "memory" else numbers)
    np.testing.assert_allclose(mb.cluster_centers_, ref_mb.cluster_centers_, rtol=1e-9)
    if placement == "memory":
        partial = MiniBatchKMeans(3, init=numbers[INIT_ROWS], n_init=1, random_state=0).partial_fit(
            frame
        )
        ref_partial = MiniBatchKMeans(
            3, init=numbers[INIT_ROWS], n_init=1, random_state=0
        ).partial_fit(numbers)
        np.testing.assert_allclose(
            partial.cluster_centers_, ref_partial.cluster_centers_, rtol=1e-12
        )


# -- polars and pyarrow frames -----------------------------------------------------------------
POLARS_TYPES = [
    "Int8",
    "Int16",
    "Int32",
    "Int64",
    "UInt8",
    "UInt16",
    "UInt32",
    "UInt64",
    "Float32",
    "Float64",
    "Boolean",
    "Decimal",
]


def polars_frame(type_name: str):
    numbers = _numbers(
        "bool" if type_name == "Boolean" else "decimal" if type_name == "Decimal" else type_name
    )
    if type_name == "Decimal":
        dtype = polars.Decimal(12, 2)
    else:
        dtype = getattr(polars, type_name)
    data = {
        name: numbers[:, j].astype(bool) if type_name == "Boolean" else numbers[:, j]
        for j, name in enumerate(COLUMNS)
    }
    return polars.DataFrame(data).with_columns(
        [polars.col(c).cast(dtype) for c in COLUMNS]
    ), numbers


@pytest.mark.parametrize("type_name", POLARS_TYPES)
def test_polars_frames_of_every_numeric_type(type_name):
    frame, numbers = polars_frame(type_name)
    dtype = np.dtype(np.float32) if type_name == "Float32" else np.dtype(np.float64)
    ref = reference(numbers, dtype)
    km = KMeans(3, init=numbers.astype(dtype)[INIT_ROWS], n_init=1).fit(frame)
    _check_fit(km, ref, dtype)
    assert list(km.feature_names_in_) == COLUMNS
    np.testing.assert_array_equal(km.predict(frame), ref.labels_)
    desc = dkmeans.Descriptor(cluster_count=3, dtype=dtype)
    assert dkmeans.infer(
        desc, dkmeans.Model(ref.cluster_centers_), frame
    ).objective_function_value == pytest.approx(ref.inertia_, rel=1e-5)


def test_pyarrow_tables_with_decimals_fit_as_floats():
    numbers = VALUES / 4
    table = pa.table(
        {
            c: pa.array([Decimal(f"{v:.2f}") for v in numbers[:, j]], type=pa.decimal128(12, 2))
            for j, c in enumerate(COLUMNS)
        }
    )
    ref = reference(numbers, np.float64)
    km = KMeans(3, init=numbers[INIT_ROWS], n_init=1).fit(table)
    _check_fit(km, ref, np.dtype(np.float64))
    np.testing.assert_array_equal(km.predict(table), ref.labels_)


# -- non-numeric columns: named, whatever the frame library --------------------------------------
def _with_others(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(
        name=[f"row{i}" for i in range(len(frame))],
        when=pd.date_range("2024-01-01", periods=len(frame), freq="h"),
        kind=pd.Categorical(["x", "y"] * (len(frame) // 2)),
    )


@pytest.mark.parametrize("library", ["pandas", "dask", "polars", "pyarrow"])
def test_non_numeric_columns_are_named(client, library):
    frame = _with_others(frame_of("float64"))
    data = {
        "pandas": lambda: frame,
        "dask": lambda: dd.from_pandas(frame, npartitions=2),
        "polars": lambda: polars.from_pandas(frame),
        "pyarrow": lambda: pa.Table.from_pandas(frame, preserve_index=False),
    }[library]()
    with pytest.raises(
        DataTypeError, match=r"columns \['name', 'when', 'kind'\] are not numeric"
    ) as info:
        KMeans(3).fit(data)
    assert "could not convert" not in str(info.value)
    nested = pa.table({"a": VALUES[:, 0], "tags": pa.array([[1, 2]] * len(VALUES))})
    with pytest.raises(DataTypeError, match=r"columns \['tags'\] are not numeric"):
        KMeans(3).fit(nested)


# -- missing values ------------------------------------------------------------------------------
def _frame_with_missing(kind: str) -> pd.DataFrame:
    """NaN in a NumPy column, pd.NA in a nullable one, an Arrow null in a pyarrow one: 2 + 1 + 1 values."""
    frame = pd.DataFrame(
        {
            "a": VALUES[:, 0],
            "b": pd.array(VALUES[:, 1].astype(int), dtype="Int64"),
            "c": pd.Series(VALUES[:, 2], dtype="double[pyarrow]"),
        }
    )
    if kind in ("nan", "all"):
        frame.loc[[3, 70], "a"] = np.nan
    if kind in ("na", "all"):
        frame.loc[5, "b"] = pd.NA
    if kind in ("null", "all"):
        frame.loc[90, "c"] = None
    return frame


MISSING_COUNTS = {
    "nan": r"'a' \(2\)",
    "na": r"'b' \(1\)",
    "null": r"'c' \(1\)",
    "all": r"'a' \(2\), 'b' \(1\), 'c' \(1\)",
}


@pytest.mark.parametrize("kind", list(MISSING_COUNTS))
@pytest.mark.parametrize("library", ["pandas", "polars", "pyarrow"])
def test_missing_values_in_memory_name_the_columns_and_counts(kind, library):
    frame = _frame_with_missing(kind)
    data = {
        "pandas": frame,
        "polars": polars.from_pandas(frame),
        "pyarrow": pa.Table.from_pandas(frame, preserve_index=False),
    }[library]
    with pytest.raises(
        InvalidDataError,
        match=r"X: missing values \(NaN or null\) in column\(s\) " + MISSING_COUNTS[kind],
    ):
        KMeans(3).fit(data)


@pytest.mark.parametrize("placement", ["dask", "out_of_core", "parquet_arrow"])
def test_missing_values_in_lazy_data_raise_when_the_pass_finds_them(client, placement, tmp_path):
    X = _placed(_frame_with_missing("all"), placement, tmp_path)
    with pytest.raises(InvalidDataError, match=r"missing values \(NaN or null\) in column\(s\) '"):
        KMeans(3, out_of_core=placement != "dask").fit(X)


@pytest.mark.parametrize("placement", ["memory", "dask", "out_of_core", "parquet_arrow"])
def test_missing_skip_fits_the_complete_rows_and_labels_the_others_minus_one(
    client, placement, tmp_path
):
    frame = _frame_with_missing("all")
    numbers = VALUES.copy()
    complete = np.ones(len(VALUES), bool)
    complete[[3, 70, 5, 90]] = False
    ref = KMeans(3, init=numbers[INIT_ROWS], n_init=1).fit(numbers[complete])
    X = _placed(frame, placement, tmp_path)
    out_of_core = placement in ("out_of_core", "parquet_arrow")
    km = KMeans(3, init=numbers[INIT_ROWS], n_init=1, missing="skip", out_of_core=out_of_core).fit(
        X
    )
    np.testing.assert_allclose(km.cluster_centers_, ref.cluster_centers_, rtol=1e-9)
    assert km.inertia_ == pytest.approx(ref.inertia_, rel=1e-9)
    labels = _labels(km.labels_)
    assert labels.shape == (len(VALUES),)  # every input row, -1 for those left out
    np.testing.assert_array_equal(labels[complete], ref.labels_)
    assert (labels[~complete] == -1).all()
    predicted = _labels(km.predict(X))
    np.testing.assert_array_equal(predicted, labels)
    distances = np.asarray(_labels(km.transform(X)))
    assert np.isnan(distances[~complete]).all() and np.isfinite(distances[complete]).all()
    assert km.score(X) == pytest.approx(-ref.inertia_, rel=1e-9)


def test_missing_skip_in_every_face(client):
    numbers = VALUES.copy()
    numbers[[2, 50], 1] = np.nan
    complete = ~np.isnan(numbers).any(axis=1)
    weights = np.linspace(1, 2, len(numbers))
    ref = KMeans(3, init=VALUES[INIT_ROWS], n_init=1).fit(
        numbers[complete], sample_weight=weights[complete]
    )
    km = KMeans(3, init=VALUES[INIT_ROWS], n_init=1, missing="skip").fit(
        numbers, sample_weight=weights
    )
    np.testing.assert_allclose(km.cluster_centers_, ref.cluster_centers_, rtol=1e-12)
    assert (km.labels_[~complete] == -1).all()
    desc = dkmeans.Descriptor(cluster_count=3)
    trained = dkmeans.train(desc, numbers, VALUES[INIT_ROWS], missing="skip")
    assert (trained.labels[~complete] == -1).all()
    inferred = dkmeans.infer(desc, trained.model, numbers, missing="skip")
    np.testing.assert_array_equal(inferred.labels, trained.labels)
    mb = MiniBatchKMeans(3, init=VALUES[INIT_ROWS], n_init=1, random_state=0, missing="skip").fit(
        numbers
    )
    assert (mb.predict(numbers)[~complete] == -1).all()
    swept = dkmeans.sweep(numbers, [2, 3], random_state=0, missing="skip")
    assert (swept.models[3].labels_[~complete] == -1).all()
    with pytest.raises(InvalidDataError, match="Input X contains NaN"):
        KMeans(3).fit(numbers)  # the default stays an error (scikit-learn's message for arrays)
    with pytest.raises(dkmeans.errors.InvalidParameterError, match="missing must be one of"):
        KMeans(3, missing="drop").fit(VALUES)
