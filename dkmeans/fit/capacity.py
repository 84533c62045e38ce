"""Size-capped fits: the caps resolved against the data, and the final capacitated assignment.

The caps' arithmetic (:func:`resolve_capacity`) runs once the rows' count and total weight
are known, and names the numbers where the caps cannot hold. Lloyd then assigns under the
caps (:class:`~dkmeans.drivers.capacitated.CapacitatedPasses`), and the fit ends with the
same assignment for the kept centroids (:func:`capacitated_assignment`): labels, objective
and sizes under the caps, not the nearest-centroid labels ``predict`` gives.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from dkmeans.drivers.capacitated import CapacitatedPasses, Capacity
from dkmeans.engine.columns import frame_to_array
from dkmeans.engine.device import is_cupy_backed, to_device
from dkmeans.engine.rowwise import index_meta, is_dask_array, map_partitions_at, map_row_blocks_at
from dkmeans.errors import InvalidParameterError
from dkmeans.fit.inputs import Dataset
from dkmeans.fit.results import FinalAssignment
from dkmeans.fit.spec import FitSpec
from dkmeans.kernels.capacitated import priced_labels
from dkmeans.kernels.cosine import normalize_rows


def check_capped_spec(spec: FitSpec, sparse: bool, frame: bool) -> None:
    """The parameter combinations size caps take (raised before any work)."""
    if not spec.capped:
        return
    name = (
        "balanced"
        if spec.balanced
        else "max_cluster_size"
        if spec.max_cluster_size is not None
        else "min_cluster_size"
    )
    if spec.balanced and (spec.max_cluster_size is not None or spec.min_cluster_size is not None):
        raise InvalidParameterError(
            "balanced=True sets both size caps: give it alone, or "
            "max_cluster_size/min_cluster_size instead"
        )
    if spec.algorithm != "lloyd" or spec.refine is not None:
        raise InvalidParameterError(
            f"{name} needs Lloyd's algorithm (not {spec.algorithm!r}, refine="
            f"{spec.refine!r}): Hartigan and mini-batch moves ignore the caps"
        )
    if spec.local_search is True:
        raise InvalidParameterError(
            f"{name} and local_search=True: the local search ignores the caps"
        )
    if sparse:
        raise InvalidParameterError(
            f"{name} needs dense rows (the capacitated assignment has no sparse kernel)"
        )
    if frame:
        raise InvalidParameterError(
            f"{name} and missing='skip' on a Dask input: the capped assignment "
            "splits ties by global row index, which rows left out would shift; "
            "drop the incomplete rows first (or missing='error')"
        )
    for key in ("max_cluster_size", "min_cluster_size"):
        value = getattr(spec, key)
        if isinstance(value, float) and value > 1.0:
            raise InvalidParameterError(
                f"{key} as a fraction of the rows must be in (0, 1], got {value}; "
                "give a count as an integer"
            )


def capped_rows(spec: FitSpec, dataset: Dataset) -> Dataset:
    """``dataset`` with its rows in host memory where a capped fit would read them on a GPU.

    The capacitated assignment's kernels are compiled loops over host memory (the kept costs,
    the exchange lists, the moves): CuPy rows are copied to the host once, chunk by chunk, as
    they are placed, and the labels go back to the GPU at the end
    (:func:`~dkmeans.fit.results.fit_result`: labels follow the input).
    """
    if not spec.capped or not is_cupy_backed(dataset.array):
        return dataset
    return dataclasses.replace(dataset, array=to_device(dataset.array, "cpu"))


def resolve_capacity(
    spec: FitSpec, n_rows: int, total_weight: float, max_weight: float, weighted: bool
) -> Capacity | None:
    """The caps in rows (weighted rows with weights), checked against ``n_clusters`` and the data.

    Raises
    ------
    InvalidParameterError
        Where no assignment meets the caps, naming the numbers.
    """
    if not spec.capped:
        return None
    k = spec.n_clusters

    def amount(value, up: bool) -> float:
        if isinstance(value, float):
            exact = value * total_weight
            return (
                float(math.ceil(exact - 1e-9) if up else math.floor(exact + 1e-9))
                if not weighted
                else exact
            )
        return float(value)

    if spec.balanced:  # sizes within one of the share (within the largest weight with weights)
        share = total_weight / k
        if weighted:
            return Capacity(max(0.0, share - max_weight), share + max_weight, total_weight)
        return Capacity(
            float(math.floor(share + 1e-9)), float(math.ceil(share - 1e-9)), total_weight
        )
    upper = math.inf if spec.max_cluster_size is None else amount(spec.max_cluster_size, True)
    lower = 0.0 if spec.min_cluster_size is None else amount(spec.min_cluster_size, False)
    unit = "weight" if weighted else "rows"
    if upper * k < total_weight * (1 - 1e-12):
        raise InvalidParameterError(
            f"max_cluster_size={spec.max_cluster_size!r} ({upper:g} {unit}) with n_clusters={k} holds at most "
            f"{upper * k:g} {unit}, fewer than the data's {total_weight:g}"
        )
    if lower * k > total_weight * (1 + 1e-12):
        raise InvalidParameterError(
            f"min_cluster_size={spec.min_cluster_size!r} ({lower:g} {unit}) with n_clusters={k} needs at least "
            f"{lower * k:g} {unit}, more than the data's {total_weight:g}"
        )
    if lower > upper:
        raise InvalidParameterError(
            f"min_cluster_size ({lower:g}) above max_cluster_size ({upper:g})"
        )
    if weighted and upper < max_weight:
        raise InvalidParameterError(
            f"max_cluster_size ({upper:g}) below the largest sample weight ({max_weight:g})"
        )
    if weighted and math.isfinite(upper) and upper - lower < max_weight and lower > 0:
        raise InvalidParameterError(
            f"with sample weights the size caps must be at least the largest weight ({max_weight:g}) apart, "
            f"got [{lower:g}, {upper:g}]"
        )
    return Capacity(lower, min(upper, total_weight), total_weight)


def _weights_chunk(X, w, offset):
    if w is None:
        return np.array([X.shape[0], 1.0 if X.shape[0] else 0.0])
    w = np.asarray(w, dtype=np.float64)
    return np.array([float(w.sum()), float(w.max()) if w.shape[0] else 0.0])


def _weights_combine(parts):
    parts = [p for p in parts if p is not None]
    return np.array([sum(p[0] for p in parts), max(p[1] for p in parts)])


def data_capacity(spec: FitSpec, data) -> Capacity | None:
    """:func:`resolve_capacity` for placed data (a pass for the weights' total where rows are weighted)."""
    if not spec.capped:
        return None
    if data.has_weights:
        total, largest = data.map_reduce(_weights_chunk, _weights_combine)
    else:
        total, largest = float(data.n_rows), 1.0
    return resolve_capacity(spec, data.n_rows, float(total), float(largest), data.has_weights)


def _block_labels(X, row_offset, C, P, Q, q, cosine, overrides):
    return priced_labels(normalize_rows(X) if cosine else X, C, P, Q, q, row_offset, overrides)


def _partition_labels(part, row_offset, C, P, Q, q, cosine, overrides, dtype, name):
    X = frame_to_array(part, dtype)
    labels = priced_labels(normalize_rows(X) if cosine else X, C, P, Q, q, row_offset, overrides)
    return pd.Series(labels, index=part.index, name=name)


def capacitated_assignment(
    spec: FitSpec, dataset, data, passes: CapacitatedPasses, centroids
) -> FinalAssignment:
    """The capacitated assignment to ``centroids``: labels, objective, passes, per-cluster sums.

    Prices are solved on the placed data (warm from the last Lloyd iteration); the labels are
    then those prices' priced labels, with the final repair's moved rows (by global row index):
    for rows in this process (an in-memory input, or a Dask array fitted here) in the same pass
    as the per-cluster sums, lazily per block (by the block's global row offset) for a Dask
    array on the workers, and per partition on the index of a Dask DataFrame.
    """
    C = np.asarray(centroids).astype(data.dtype)
    passes.solve(data, C)
    P, Q = passes.prices
    cosine = spec.metric == "cosine"
    if (
        dataset.frame is not None
    ):  # on the DataFrame's index, each partition by its first row's index
        per = passes.sums(data, C)
        meta = pd.Series(np.empty(0, np.int32), name="cluster", index=index_meta(dataset.frame))
        labels = map_partitions_at(
            dataset.frame,
            _partition_labels,
            C,
            P,
            Q,
            passes.quantum,
            cosine,
            passes.overrides,
            np.dtype(data.dtype),
            "cluster",
            meta=meta,
        )
    elif is_dask_array(dataset.array) and data.kind != "local":
        # rows on the workers or read from their source: the labels lazily, per block
        per = passes.sums(data, C)
        labels = map_row_blocks_at(
            dataset.array,
            _block_labels,
            C,
            P,
            Q,
            passes.quantum,
            spec.metric == "cosine",
            passes.overrides,
            dtype=np.int32,
        )
    else:
        labels, per = passes.labels(data, C)
    half = 0.5 if spec.metric == "cosine" else 1.0
    return FinalAssignment(
        labels,
        float(per[:, 0].sum()) * half,
        data.passes,
        cluster_sizes=per[:, 1],
        cluster_objective=per[:, 0] * half,
        capacity_passes=list(passes.passes_per_solve),
    )


__all__ = [
    "capacitated_assignment",
    "capped_rows",
    "check_capped_spec",
    "data_capacity",
    "resolve_capacity",
]
