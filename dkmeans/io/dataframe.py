"""DataFrames in and out: column selection, and labels/distances aligned with the input.

pandas and Dask DataFrames are accepted wherever arrays are. Columns are chosen once
(all of them, or ``columns=``) and must be numeric. Dask DataFrames keep their index and
partitions: predicted labels come back as a Dask Series built partition by partition
(``df.assign(cluster=km.predict(df))`` needs no shuffle), and unknown partition lengths
are learned from the persisted chunks, not from an extra pass over the source. The
training labels of a Dask DataFrame are such a lazy Series too: computing them reads the
input partitions again, which is what a lazy Dask result means.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dkmeans.engine.columns import is_numeric_dtype
from dkmeans.errors import DataTypeError, InvalidDataError, InvalidParameterError


def is_dask_dataframe(data) -> bool:
    return (
        hasattr(data, "__dask_graph__")
        and hasattr(data, "columns")
        and hasattr(data, "map_partitions")
    )


def is_dataframe(data) -> bool:
    return isinstance(data, pd.DataFrame) or is_dask_dataframe(data)


def _is_numeric(dtype) -> bool:
    return is_numeric_dtype(dtype)


def is_other_frame(data) -> bool:
    """An eager frame of another library (polars, pyarrow, cuDF, modin...): one that converts to pandas."""
    if isinstance(data, pd.DataFrame) or hasattr(data, "__dask_graph__") or isinstance(data, type):
        return False
    return (
        callable(getattr(data, "to_pandas", None))
        and hasattr(data, "columns")
        and not hasattr(data, "to_frame")
    )  # a Series is one column, not a frame


def as_pandas(data):
    """A polars/pyarrow/other eager frame as a pandas DataFrame (nulls as NaN or pandas' NA); anything else as given.

    polars and pyarrow convert with their own ``to_pandas``; the column names and order are
    kept, so every frame library gets pandas' checks and messages (non-numeric columns
    named, missing values counted).
    """
    if not is_other_frame(data):
        return data
    module = type(data).__module__.split(".")[0]
    if module == "pyarrow":  # Arrow types kept (decimals, nulls): converted column by column later
        frame = data.to_pandas(types_mapper=pd.ArrowDtype)
    elif module == "polars":
        frame = data.to_pandas(use_pyarrow_extension_array=True)
    else:
        frame = data.to_pandas()
    if not isinstance(frame, pd.DataFrame):
        raise DataTypeError(
            f"{type(data).__name__}.to_pandas() gave a {type(frame).__name__}, not a DataFrame"
        )
    return frame


def select_columns(df, columns=None, name: str = "X"):
    """The DataFrame restricted to ``columns`` (default: all), all of them numeric.

    Raises
    ------
    InvalidParameterError
        A named column does not exist.
    DataTypeError
        A selected column is not numeric (the message lists them).
    """
    if columns is not None:
        if isinstance(columns, str):
            columns = [columns]
        columns = list(columns)
        missing = [c for c in columns if c not in df.columns]
        if missing:
            raise InvalidParameterError(
                f"{name}: columns {missing} not found; available columns: {list(df.columns)}"
            )
        if not columns:
            raise InvalidParameterError(f"{name}: columns= selects no column")
        df = df[columns]
    non_numeric = [c for c, t in df.dtypes.items() if not _is_numeric(t)]
    if non_numeric:
        types = ", ".join(f"{c!r} ({df.dtypes[c]})" for c in non_numeric)
        raise DataTypeError(
            f"{name}: columns {non_numeric} are not numeric ({types}); select numeric columns"
            + (" with columns=[...]" if columns is None else "")
        )
    return df


def feature_names(df) -> np.ndarray:
    return np.asarray([str(c) for c in df.columns], dtype=object)


def check_feature_names(df, expected, name: str = "X") -> None:
    """Columns of ``df`` must equal the fitted ones, in the same order."""
    got = [str(c) for c in df.columns]
    want = [str(c) for c in expected]
    if got != want:
        detail = "reordered" if sorted(got) == sorted(want) else "renamed, added or removed"
        raise InvalidDataError(
            f"{name}: the feature names should match those that were passed during fit "
            f"(columns are {detail}): expected {want}, got {got}"
        )
