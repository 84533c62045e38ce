"""Numeric columns of any type as float arrays: one conversion of frames, partitions, Arrow batches.

Pipelines hold numbers in many types: NumPy's ints, unsigned ints, floats and bools; pandas'
nullable ``Int8``-``UInt64``, ``Float32``/``Float64`` and ``boolean``; pyarrow-backed columns
(``double[pyarrow]``, ``decimal128(p, s)[pyarrow]``); the Arrow columns of Parquet files. Each
becomes a float column here, in the result dtype of :func:`result_dtype` (float32 when every
column is float32, float64 otherwise, as scikit-learn converts), column by column, without
an ``object`` array in between (``DataFrame.to_numpy`` of mixed extension types gives one).

Missing values (NaN, ``pd.NA``, Arrow nulls) are counted per column. What becomes of them is
the ``missing`` policy of :data:`MISSING`: ``"error"`` raises
:class:`~dkmeans.errors.InvalidDataError` with :func:`missing_message` (the columns and their
counts: of the whole frame in memory, of the partition or batch where a pass found them for
lazy data); ``"skip"`` keeps the rows, NaN where a value is missing, for the caller to leave
out (:func:`complete_rows`). The functions here run in the caller and in tasks on workers.
pandas is imported where first used (:func:`dkmeans._lazy.lazy_module`): a worker whose tasks
take arrays never imports it (with pyarrow, about 0.7 s of a fresh worker's first pass over the
labels on 2 cores).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dkmeans._lazy import lazy_module
from dkmeans.errors import InvalidDataError

if TYPE_CHECKING:
    import pandas as pd
else:
    pd = lazy_module("pandas")

#: What happens to rows with a missing feature: an error, or the rows left out of a fit
#: (and labelled -1, no cluster, by inference).
MISSING = ("error", "skip")


def _arrow_type(dtype):
    """The pyarrow type behind a pandas ``ArrowDtype`` (None for any other dtype)."""
    return getattr(dtype, "pyarrow_dtype", None)


def is_numeric_arrow_type(t) -> bool:
    """Integers, floats, decimals and bools of Arrow (not dates, strings, nested types)."""
    import pyarrow as pa

    return bool(
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_decimal(t)
        or pa.types.is_boolean(t)
    )


def is_numeric_dtype(dtype) -> bool:
    """Whether dkmeans converts a pandas/NumPy dtype to floats (bools included, complex not)."""
    arrow = _arrow_type(dtype)
    if arrow is not None:
        return is_numeric_arrow_type(arrow)
    try:
        if pd.api.types.is_complex_dtype(dtype):
            return False
        return bool(pd.api.types.is_numeric_dtype(dtype) or pd.api.types.is_bool_dtype(dtype))
    except TypeError:
        return False


def is_float32(dtype) -> bool:
    """NumPy's float32, pandas' ``Float32`` or Arrow's ``float``."""
    arrow = _arrow_type(dtype)
    if arrow is not None:
        import pyarrow as pa

        return arrow == pa.float32()
    if str(dtype) in ("float32", "Float32"):
        return True
    return getattr(dtype, "numpy_dtype", None) == np.dtype(np.float32)


def result_dtype(dtypes, wanted=None) -> np.dtype:
    """float32 when every column is float32, else float64 (``wanted``: that dtype)."""
    if wanted is not None:
        return np.dtype(wanted)
    dtypes = list(dtypes)
    float32 = dtypes and all(is_float32(t) for t in dtypes)
    return np.dtype(np.float32) if float32 else np.dtype(np.float64)


def missing_message(name: str, counts: dict, where: str = "") -> str:
    """The one message about missing values: the columns and how many values each lacks."""
    listed = ", ".join(f"{column!r} ({int(n)})" for column, n in counts.items())
    return (
        f"{name}: missing values (NaN or null) in column(s) {listed}{where}: "
        "remove or impute them, or pass missing='skip' to leave such rows out of the fit "
        "(predict labels them -1)"
    )


def check_missing(name: str, counts: dict, missing: str, where: str = "") -> None:
    """Raise the missing-values error when ``missing="error"`` and a column has a missing value."""
    found = {column: n for column, n in counts.items() if n}
    if found and missing == "error":
        raise InvalidDataError(missing_message(name, found, where))


def series_to_array(series: pd.Series, dtype) -> np.ndarray:
    """One column as a float array of ``dtype``, NaN where a value is missing."""
    dtype = np.dtype(dtype)
    arrow = _arrow_type(series.dtype)
    if arrow is not None:
        import pyarrow as pa

        return arrow_to_numpy(pa.array(series.array), dtype)  # the array's __arrow_array__: no copy
    if isinstance(series.dtype, np.dtype):
        return series.to_numpy().astype(dtype, copy=False)
    return series.to_numpy(dtype=dtype, na_value=np.nan)


def arrow_to_numpy(column, dtype) -> np.ndarray:
    """An Arrow (chunked) array of numbers, bools or decimals as floats of ``dtype`` (null: NaN)."""
    import pyarrow as pa

    t = column.type
    if pa.types.is_decimal(t) or pa.types.is_boolean(t) or column.null_count:
        column = column.cast(pa.float64())  # nulls stay nulls, which to_numpy makes NaN
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.dtype(dtype))


def frame_to_array(
    df: pd.DataFrame, dtype, *, name: str = "X", missing: str = "error", where: str = ""
) -> np.ndarray:
    """A pandas DataFrame of numeric columns as a C-ordered ``(rows, columns)`` float array.

    Missing values are counted per column and handled by ``missing`` (see the module
    docstring); with ``"skip"`` they are NaN in the result. ``where``: said in the message
    (which partition of lazy data).
    """
    dtype = np.dtype(dtype)
    out = np.empty((len(df), df.shape[1]), dtype=dtype)
    counts = {}
    for j, column in enumerate(df.columns):
        values = series_to_array(df.iloc[:, j], dtype)
        counts[column] = int(np.count_nonzero(np.isnan(values))) if values.size else 0
        out[:, j] = values
    check_missing(name, counts, missing, where)
    return out


def batch_to_array(
    batch, dtype, *, name: str = "X", missing: str = "error", where: str = ""
) -> np.ndarray:
    """A pyarrow RecordBatch or Table as a C-ordered ``(rows, columns)`` array, column by column."""
    dtype = np.dtype(dtype)
    out = np.empty((batch.num_rows, batch.num_columns), dtype=dtype)
    counts = {}
    for j, column_name in enumerate(batch.schema.names):
        values = arrow_to_numpy(batch.column(j), dtype)
        counts[column_name] = int(np.count_nonzero(np.isnan(values))) if values.size else 0
        out[:, j] = values
    check_missing(name, counts, missing, where)
    return out


def complete_rows(X: np.ndarray) -> np.ndarray:
    """A boolean mask of the rows of a float array with no NaN."""
    return ~np.isnan(X).any(axis=1) if X.size else np.ones(X.shape[0], dtype=bool)


def partition_to_float_frame(
    part: pd.DataFrame, dtype, name: str, missing: str, drop: bool
) -> pd.DataFrame:
    """A partition of a Dask DataFrame as a frame of float columns (runs in tasks).

    ``missing="error"`` raises here on a missing value; ``"skip"`` keeps them as NaN (a fit's
    first pass finds them: no task fails), and ``drop`` leaves their rows out (a fit with
    ``missing="skip"``).
    """
    X = frame_to_array(part, dtype, name=name, missing=missing, where=" of a partition read")
    index = part.index
    if drop:
        keep = complete_rows(X)
        if not keep.all():
            X, index = X[keep], index[keep]
    return pd.DataFrame(X, index=index, columns=part.columns, copy=False)


def missing_counts_partition(part: pd.DataFrame) -> pd.DataFrame:
    """Missing values (NaN or null) per column of a partition: a one-row frame (runs in tasks)."""
    X = frame_to_array(part, np.float64, missing="skip")
    return pd.DataFrame([np.isnan(X).sum(axis=0)], columns=part.columns)


def float_frame_meta(columns, dtype) -> pd.DataFrame:
    """The empty frame :func:`partition_to_float_frame` returns (a Dask meta)."""
    return pd.DataFrame({c: np.empty(0, dtype=np.dtype(dtype)) for c in columns})


__all__ = [
    "MISSING",
    "arrow_to_numpy",
    "batch_to_array",
    "check_missing",
    "complete_rows",
    "float_frame_meta",
    "frame_to_array",
    "is_float32",
    "is_numeric_arrow_type",
    "is_numeric_dtype",
    "missing_counts_partition",
    "missing_message",
    "partition_to_float_frame",
    "result_dtype",
    "series_to_array",
]
