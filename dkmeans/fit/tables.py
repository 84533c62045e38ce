"""The tables a command reads and writes: Parquet or CSV in, feature columns chosen, Parquet out.

The reading itself is the engine's (:mod:`dkmeans.engine.files`: local paths and object stores);
this is what the command line asks of it.
"""

from __future__ import annotations

from dkmeans.engine.columns import is_numeric_dtype
from dkmeans.engine.files import read_table, write_labels_parquet, write_parquet
from dkmeans.errors import InvalidParameterError
from dkmeans.io.dataframe import select_columns


def numeric_columns(df) -> tuple[list, list]:
    """``(numeric, others)``: the columns of ``df`` dkmeans clusters on by default (numeric, bools
    left out) and the rest.

    Raises
    ------
    InvalidParameterError
        If no column is numeric.
    """
    numeric = [c for c, t in df.dtypes.items() if is_numeric_dtype(t) and "bool" not in str(t)]
    if not numeric:
        raise InvalidParameterError("the input has no numeric column; name columns with --columns")
    return numeric, [c for c in df.columns if c not in numeric]


__all__ = [
    "numeric_columns",
    "read_table",
    "select_columns",
    "write_labels_parquet",
    "write_parquet",
]
