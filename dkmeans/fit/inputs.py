"""Parameter and data checks, run once at each public entry.

Everything here raises :mod:`dkmeans.errors` types with a message that names the
parameter or the data problem. Data checks that need no pass over the data (shape,
dtype, sizes known from metadata) happen here, before any work is submitted; the
finiteness of distributed data is checked in the first pass (see :mod:`dkmeans.drivers.lloyd`).
"""

from __future__ import annotations

import math
import numbers
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.utils import check_array

from dkmeans.engine.columns import complete_rows, frame_to_array, result_dtype
from dkmeans.engine.device import check_cupy_array
from dkmeans.engine.rowwise import (
    chunked_rows,
    frame_rows,
    is_dask_array,
    skip_missing_rows,
    weight_stats,
)
from dkmeans.errors import DataTypeError, DKMeansError, InvalidDataError, InvalidParameterError

# the checks of a fitted model's feature names, for the faces (which import the fit service only)
from dkmeans.io.dataframe import (  # noqa: F401
    as_pandas,
    check_feature_names,
    feature_names,
    is_dask_dataframe,
    is_dataframe,
    select_columns,
)
from dkmeans.kernels.namespace import is_cupy_array, to_host

FLOAT_DTYPES = (np.float64, np.float32)


# -- parameters ----------------------------------------------------------------------
def check_int(name: str, value, minimum: int) -> int:
    """``value`` as an int ``>= minimum``; bools and non-integral numbers are rejected."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise InvalidParameterError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise InvalidParameterError(f"{name} must be an integer >= {minimum}, got {value}")
    return int(value)


def check_float(name: str, value, minimum: float = 0.0) -> float:
    """``value`` as a finite float ``>= minimum``."""
    if (
        isinstance(value, (bool, np.bool_))
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
    ):
        raise InvalidParameterError(f"{name} must be a finite number >= {minimum}, got {value!r}")
    if value < minimum:
        raise InvalidParameterError(f"{name} must be >= {minimum}, got {value}")
    return float(value)


def check_float_dtype(dtype) -> np.dtype:
    """float32 or float64 (given as a NumPy dtype, type or name)."""
    try:
        resolved = np.dtype(dtype)
    except TypeError as exc:
        raise InvalidParameterError(f"dtype must be float32 or float64, got {dtype!r}") from exc
    if resolved not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise InvalidParameterError(f"dtype must be float32 or float64, got {resolved}")
    return resolved


# -- data ----------------------------------------------------------------------------
@dataclass
class Dataset:
    """Validated input: a row-chunked Dask array plus what the faces need to know."""

    array: Any  # a row-chunked dask.array.Array
    is_dask: bool
    n_features: int
    n_rows: int | None  # None while a Dask input's row count is unknown
    frame: object = None  # the Dask DataFrame (selected columns) the array was taken from, if any
    local: object = None  # the validated in-memory NumPy array ``array`` was made from, if any
    on_device: bool = False  # the input itself was on a GPU (CuPy, or a CuPy-backed Dask array)
    missing: str = "error"  # the missing-value policy (:data:`dkmeans.engine.columns.MISSING`)
    kept: object = None  # missing="skip", in memory: the mask of the input rows fitted (None: all)
    unfiltered: object = (
        None  # missing="skip", a Dask array: its rows, those with NaN included (to label)
    )
    name: str = "X"  # the input's name in messages


def _result_dtype(dtype: np.dtype, wanted) -> np.dtype:
    return result_dtype(
        [dtype], wanted
    )  # ints, bools, float16: float64, as scikit-learn converts them


def check_missing_policy(missing) -> str:
    """``missing`` as the parameter table checks it (``"error"`` or ``"skip"``)."""
    from dkmeans.fit.params import PARAMS

    return PARAMS["missing"].constraint("missing", missing)


def frame_as_floats(df, *, dtype=None, name: str = "X", missing: str = "error"):
    """An in-memory pandas DataFrame (numeric columns) as a pandas DataFrame of float columns, same names.

    Every numeric type converts (:mod:`dkmeans.engine.columns`); missing values raise the
    one missing-values error (``missing="error"``) or are NaN (``"skip"``). The frame (not an
    array) keeps the column names for scikit-learn's feature-name checks.
    """
    import pandas as pd

    from dkmeans.engine.columns import check_missing

    if all(
        isinstance(t, np.dtype) and t.kind in "fiub" for t in df.dtypes
    ):  # NumPy columns: no copy here
        counts = {c: int(df[c].isna().sum()) if df[c].dtype.kind == "f" else 0 for c in df.columns}
        check_missing(name, counts, missing)
        return df
    X = frame_to_array(df, result_dtype(df.dtypes, dtype), name=name, missing=missing)
    return pd.DataFrame(X, index=df.index, columns=df.columns, copy=False)


def as_local_frame(data, name: str = "X"):
    """polars, pyarrow and other eager frames as a pandas DataFrame (pandas and Dask input unchanged)."""
    try:
        return as_pandas(data)
    except DKMeansError:
        raise
    except Exception as exc:  # noqa: BLE001 - the frame library's own failure, said with the input's name
        raise DataTypeError(
            f"{name}: cannot read the {type(data).__name__} as columns: {exc}"
        ) from exc


def _drop_incomplete(data, name: str, fit: bool = True):
    """In-memory rows without those holding NaN (``missing="skip"``): ``(rows, mask of kept rows)``.

    Only float NumPy arrays and pandas frames of floats hold NaN here (frames were converted
    first); anything else is returned as it is for the checks to judge.
    """
    import pandas as pd

    values = data.to_numpy() if isinstance(data, pd.DataFrame) else data
    if not isinstance(values, np.ndarray) or values.ndim != 2 or values.dtype.kind != "f":
        return data, None
    keep = complete_rows(values)
    if keep.all():
        return data, None
    if fit and not keep.any():
        raise InvalidDataError(
            f"{name}: every row has a missing value; no row is left to fit with missing='skip'"
        )
    return (data[keep] if isinstance(data, pd.DataFrame) else values[keep]), keep


def is_dask_collection(data) -> bool:
    return hasattr(data, "__dask_graph__")


@contextmanager
def data_errors(name: str):
    """Re-raise scikit-learn's data-check errors as dkmeans errors naming the input."""
    try:
        yield
    except DKMeansError:
        raise
    except TypeError as exc:
        raise DataTypeError(f"{name}: {exc}") from exc
    except ValueError as exc:
        if "Complex data not supported" in str(exc):
            raise InvalidDataError(
                f"{name}: Complex data not supported; pass real numbers"
            ) from None
        raise InvalidDataError(f"{name}: {exc}") from exc


def check_local_array(data, *, dtype=None, name: str = "X") -> np.ndarray:
    """An in-memory 2-D float array (scikit-learn's checks: finite, non-empty, numeric).

    ``scipy.sparse`` input of any format comes back as a CSR matrix (never densified).
    """
    with data_errors(name):
        return check_array(
            data,
            accept_sparse="csr",
            dtype=FLOAT_DTYPES if dtype is None else dtype,
            ensure_2d=True,
            ensure_all_finite=True,
            ensure_min_samples=1,
            ensure_min_features=1,
            input_name=name,
        )


def check_dask_array(
    data, *, dtype=None, name: str = "X", missing: str = "error", drop: bool = False
):
    """A 2-D numeric Dask array (metadata checks only), converted to float32/float64.

    A Dask DataFrame's partitions are converted column by column where the engine maps them
    (:func:`dkmeans.engine.rowwise.frame_rows`: every numeric type, missing values counted);
    ``drop``: rows with a missing value are left out (a fit with ``missing="skip"``).
    """
    if is_dask_dataframe(data):
        # one chunk per partition; unknown lengths are read off the persisted chunks later
        data = select_columns(data, name=name)
        data = frame_rows(
            data, result_dtype(data.dtypes, dtype), name=name, missing=missing, drop=drop
        )
    if not is_dask_array(data):
        raise DataTypeError(f"{name}: expected an array or DataFrame, got {type(data).__name__}")
    if data.ndim != 2:
        raise InvalidDataError(
            f"{name}: expected a 2-D array of shape (n_samples, n_features), "
            f"got {data.ndim}-D with shape {data.shape}; "
            "reshape 1-D data with X.reshape(-1, 1)"
        )
    kind = data.dtype.kind
    if kind == "c":
        raise InvalidDataError(f"{name}: Complex data not supported; pass real numbers")
    if kind not in "fiub":
        raise DataTypeError(f"{name}: dtype {data.dtype} is not numeric")
    if data.shape[1] == 0:
        raise InvalidDataError(
            f"{name}: 0 feature(s) (shape={data.shape}); a minimum of 1 is required"
        )
    if not math.isnan(data.shape[0]) and data.shape[0] == 0:
        raise InvalidDataError(
            f"{name}: 0 sample(s) (shape={data.shape}); a minimum of 1 is required"
        )
    target = _result_dtype(data.dtype, dtype)
    if data.dtype != target:
        data = data.astype(target)
    if data.numblocks[1] != 1:
        data = data.rechunk({1: -1})
    return data


def cluster_workers() -> int:
    """Workers of the cluster dkmeans runs on (starting the embedded one if need be)."""
    from dkmeans.engine.client import get_client
    from dkmeans.engine.workers import worker_info

    return max(1, len(worker_info(get_client())))


def local_dataset(X: np.ndarray, device=None) -> Dataset:
    """A validated in-memory array as a :class:`Dataset` (the Dask array is lazy: nothing is sent)."""
    from dkmeans.engine.device import to_device

    return Dataset(
        to_device(chunked_rows(X), device),
        False,
        X.shape[1],
        X.shape[0],
        local=X if device != "gpu" else None,
    )


def as_dataset(
    data,
    *,
    dtype=None,
    name: str = "X",
    columns=None,
    device=None,
    check_local=None,
    missing: str = "error",
) -> Dataset:
    """Validate any supported input and return it as a row-chunked Dask array.

    DataFrames are restricted to ``columns`` (default: all), which must be numeric;
    ``Dataset.frame`` keeps a Dask DataFrame (restricted) for index-aligned outputs.
    ``device`` ("cpu", "gpu" or None: where the data is) says where the chunks go.
    ``check_local`` checks in-memory input instead of :func:`check_local_array` (the
    estimators pass scikit-learn's ``validate_data``, which also records the feature
    names); every face and ``partial_fit`` validate through here.

    ``missing`` (:data:`dkmeans.engine.columns.MISSING`): ``"error"`` raises on a missing
    value (naming the columns of a frame, with counts); ``"skip"`` leaves rows with one out
    (``Dataset.kept``: which input rows remain, in memory; ``Dataset.unfiltered``: a Dask
    array's rows before, to label every input row).
    """
    from dkmeans.engine.device import chunk_cupy_array, is_cupy_backed, to_device

    if is_cupy_array(data):
        arr = to_device(
            chunk_cupy_array(check_cupy_array(data, dtype=dtype, name=name), cluster_workers()),
            device,
        )
        return Dataset(arr, False, int(arr.shape[1]), int(arr.shape[0]), on_device=True)
    missing = check_missing_policy(missing)
    frame = None
    data = as_local_frame(data, name)
    if is_dataframe(data):
        data = select_columns(data, columns, name)
        if is_dask_dataframe(data):
            frame = data
        else:
            data = frame_as_floats(data, dtype=dtype, name=name, missing=missing)
    elif columns is not None:
        raise InvalidParameterError(
            f"columns= selects DataFrame columns, but {name} is a {type(data).__name__}"
        )
    if is_dask_collection(data):
        unfiltered = None
        if missing == "skip" and frame is None and is_dask_array(data):
            unfiltered = check_dask_array(data, dtype=dtype, name=name)
            data = skip_missing_rows(unfiltered)
        # missing values stay NaN where the partitions are read (no task fails): the fit's first pass
        # finds them and the fit service names the columns (:func:`named_missing`)
        checked = check_dask_array(
            data, dtype=dtype, name=name, missing="skip", drop=missing == "skip"
        )
        arr = to_device(checked, device)
        n = None if math.isnan(arr.shape[0]) else int(arr.shape[0])
        return Dataset(
            arr,
            True,
            int(arr.shape[1]),
            n,
            frame=frame,
            missing=missing,
            unfiltered=unfiltered,
            name=name,
            on_device=is_cupy_backed(checked),
        )
    kept = None
    if missing == "skip":
        data, kept = _drop_incomplete(data, name)
    if check_local is None:
        dataset = local_dataset(check_local_array(data, dtype=dtype, name=name), device)
    else:
        with data_errors(name):
            dataset = local_dataset(check_local(data), device)
    dataset.missing, dataset.kept = missing, kept
    return dataset


def kept_weights(dataset: Dataset, sample_weight):
    """``sample_weight`` of the rows a fit keeps (``missing="skip"`` leaves rows with a missing value out)."""
    if sample_weight is None or (
        dataset.kept is None
        and dataset.unfiltered is None
        and (dataset.missing == "error" or dataset.frame is None)
    ):
        return sample_weight
    if dataset.kept is None:  # Dask rows left out where read: their weights cannot follow them
        raise InvalidParameterError(
            "sample_weight with missing='skip' needs in-memory data (NumPy or pandas); "
            "for Dask data, drop the rows with missing values and their weights first"
        )
    if is_dask_collection(sample_weight):
        sample_weight = sample_weight.compute()
    w = np.asarray(sample_weight)
    if w.ndim != 1 or w.shape[0] != dataset.kept.shape[0]:
        raise InvalidDataError(
            f"sample_weight has {w.shape[0] if w.ndim else 0} entries but X has "
            f"{dataset.kept.shape[0]} rows"
        )
    return w[dataset.kept]


@contextmanager
def named_missing(dataset: Dataset):
    """A fit's "Input contains NaN or infinity" on a Dask DataFrame as the missing-values error naming the
    columns with their counts (one more pass, only then); infinity keeps its message."""
    from dkmeans.engine.columns import missing_message
    from dkmeans.engine.rowwise import missing_counts
    from dkmeans.errors import NON_FINITE_INPUT

    try:
        yield
    except InvalidDataError as exc:
        if dataset.frame is None or str(exc) != NON_FINITE_INPUT:
            raise
        counts = {c: n for c, n in missing_counts(dataset.frame).items() if n}
        if not counts:
            raise
        raise InvalidDataError(missing_message(dataset.name, counts)) from None


def expand_labels(labels, kept):
    """Labels of the kept rows spread over every input row, -1 (no cluster) where a row was left out."""
    if kept is None or labels is None:
        return labels
    out = np.full(kept.shape[0], -1, dtype=np.asarray(labels).dtype)
    out[kept] = np.asarray(labels)
    return out


def test_rows(data, *, name: str = "X", missing: str = "error"):
    """Input to label, transform or score as a fit's checks would see it: ``(rows, kept)``.

    polars, pyarrow and pandas frames become pandas frames of float columns (every numeric
    type; missing values: the one error, or with ``missing="skip"`` NaN). ``kept``: with
    ``"skip"``, the mask of the in-memory rows with no missing value (None: all rows), so
    the caller labels those and gives the rest -1. Dask input is returned as it is (its
    partitions are converted where they are read).
    """
    missing = check_missing_policy(missing)
    data = as_local_frame(data, name)
    if is_dataframe(data) and not is_dask_dataframe(data):
        data = frame_as_floats(select_columns(data, name=name), name=name, missing=missing)
    if missing == "skip" and not is_dask_collection(data):
        return _drop_incomplete(data, name, fit=False)
    return data, None


def check_n_clusters_vs_rows(n_clusters: int, n_rows: int, name: str = "n_clusters") -> None:
    """scikit-learn's wording first (users match it), then ours."""
    if n_clusters > n_rows:
        raise InvalidParameterError(
            f"n_samples={n_rows} should be >= {name}={n_clusters}: the data has fewer samples than clusters; "
            f"use at most {n_rows} clusters"
        )


def check_user_centroids(
    C, n_clusters: int, n_features: int, dtype, name: str = "initial centroids"
) -> np.ndarray:
    """A finite (n_clusters, n_features) array in ``dtype`` (a copy; the user's array is untouched)."""
    if is_dask_collection(C):
        C = C.compute()
    with data_errors(name):
        C = check_array(
            C, dtype=dtype, ensure_2d=True, ensure_all_finite=True, copy=True, input_name=name
        )
    # scikit-learn's wording first (users match it), then ours
    if C.shape[0] != n_clusters:
        raise InvalidDataError(
            f"The shape of the initial centers {C.shape} does not match the number of clusters {n_clusters}: "
            f"{name} must have shape (n_clusters, n_features) = ({n_clusters}, {n_features})"
        )
    if C.shape[1] != n_features:
        raise InvalidDataError(
            f"The shape of the initial centers {C.shape} does not match the number of features of the data "
            f"{n_features}: {name} must have shape (n_clusters, n_features) = ({n_clusters}, {n_features})"
        )
    return C


def check_sample_weight(sample_weight, n_rows: int | None, *, positive_sum: bool = True):
    """The one check of ``sample_weight``: finite, non-negative, one per row (``n_rows``; None: unknown).

    Fits also need a positive sum (``positive_sum``); scoring does not. Returns float64
    weights, NumPy or Dask as given (NumPy weights stay NumPy: the fit service sends them
    with the rows).
    """
    if sample_weight is None:
        return None
    if is_dask_collection(sample_weight):
        w = sample_weight
        if hasattr(w, "to_dask_array"):
            w = w.to_dask_array()
        if w.ndim != 1:
            raise InvalidDataError(f"sample_weight must be 1-D, got shape {w.shape}")
        w = w.astype(np.float64)
        has_nan, w_min, w_sum = weight_stats(w)
    else:
        # CuPy weights (beside CuPy rows) are read on the host: n values, checked and
        # chunked like NumPy's (they follow the rows to the GPU when placed)
        w = np.asarray(to_host(sample_weight) if is_cupy_array(sample_weight) else sample_weight)
        if w.ndim != 1:
            raise InvalidDataError(f"sample_weight must be 1-D, got shape {w.shape}")
        if w.dtype.kind not in "fiub":
            raise DataTypeError(f"sample_weight must be numeric, got dtype {w.dtype}")
        w = w.astype(np.float64)
        has_nan, w_min, w_sum = (not np.all(np.isfinite(w))), (w.min() if w.size else 0.0), w.sum()
    n_w = w.shape[0]
    if n_rows is not None and not math.isnan(n_w) and n_w != n_rows:
        raise InvalidDataError(f"sample_weight has {n_w} entries but X has {n_rows} rows")
    if has_nan or not math.isfinite(w_sum):
        raise InvalidDataError("sample_weight contains NaN or infinity")
    if w_min < 0:
        raise InvalidDataError("sample_weight must be non-negative")
    if positive_sum and w_sum <= 0:
        raise InvalidDataError(
            "sample_weight sums to zero: at least one sample needs a positive weight"
        )
    return w
