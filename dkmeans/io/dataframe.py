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

from dkmeans.errors import DataTypeError, InvalidDataError, InvalidParameterError


def is_dask_dataframe(data) -> bool:
    return hasattr(data, "__dask_graph__") and hasattr(data, "columns") and hasattr(data, "map_partitions")


def is_dataframe(data) -> bool:
    return isinstance(data, pd.DataFrame) or is_dask_dataframe(data)


def _is_numeric(dtype) -> bool:
    try:
        return bool(pd.api.types.is_numeric_dtype(dtype)) and not pd.api.types.is_complex_dtype(dtype)
    except TypeError:
        return False


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
        raise DataTypeError(
            f"{name}: columns {non_numeric} are not numeric; select numeric columns"
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
