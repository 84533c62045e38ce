"""The fit service of bisecting k-means: validate once, place the data, bisect, label by the tree.

The faces (:class:`dkmeans.BisectingKMeans`, :func:`dkmeans.train_bisecting`, ``dkmeans bisect``)
map their users' words onto a :class:`BisectingSpec` and call :func:`run_bisecting`. The data is
placed as for every fit (:func:`dkmeans.fit.placement.placed`: in this process, persisted on the
workers, or read from its source in every pass), the first pass checks it and gives the root's
centre (the unweighted mean), the driver (:mod:`dkmeans.drivers.bisecting`) grows the tree, and
a final pass labels every row by descending it (scikit-learn's ``labels_``), with the objective
and the per-cluster sums. :func:`tree_labels` is ``predict`` for every input kind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from dkmeans.drivers.bisecting import BisectingFit, bisecting
from dkmeans.drivers.streams import resolve_seed
from dkmeans.engine.place import labels_like
from dkmeans.engine.rowwise import index_meta, is_dask_array, map_partitions, map_row_blocks
from dkmeans.fit.first_pass import check_rows_when_placed, first_pass
from dkmeans.fit.inputs import Dataset, check_n_clusters_vs_rows, check_sample_weight
from dkmeans.fit.placement import placed
from dkmeans.fit.results import labels_on_device
from dkmeans.fit.spec import FitSpec, RunSpec
from dkmeans.io.dataframe import is_dask_dataframe
from dkmeans.kernels.bisecting import TreeArrays, leaf_labels, leaf_values


@dataclass(frozen=True)
class BisectingSpec(RunSpec):
    """What a face asks of a bisecting fit (the fit service's names, checked by the face)."""

    n_clusters: int
    init: str = "random"
    n_init: int = 1
    max_iter: int = 300
    tol: float = 1e-4
    random_state: Any = None
    bisecting_strategy: str = "biggest_inertia"
    out_of_core: Any = "auto"
    names: dict = field(default_factory=dict)


@dataclass
class BisectingResult:
    """A bisecting fit's result, in the data's coordinates and dtype."""

    centroids: np.ndarray  # (k, d) leaf centres, tree order
    labels: Any
    objective: float
    objectives: np.ndarray  # (k,) float64: the objective with 1 .. k clusters (the tree's)
    n_iter: int
    tree: BisectingFit
    arrays: TreeArrays
    data_mode: str
    n_passes: int
    cluster_sizes: np.ndarray
    cluster_objective: np.ndarray


def run_bisecting(spec: BisectingSpec, dataset: Dataset, sample_weight=None) -> BisectingResult:
    """Fit bisecting k-means on validated data (see the module docstring)."""
    k = spec.n_clusters
    name = spec.names.get("n_clusters", "n_clusters")
    if dataset.n_rows is not None:
        check_n_clusters_vs_rows(k, dataset.n_rows, name)
    weights = check_sample_weight(sample_weight, dataset.n_rows)
    seed = resolve_seed(spec.random_state)
    fit_spec = FitSpec(n_clusters=k, out_of_core=spec.out_of_core, names=spec.names)
    with placed(dataset, weights, out_of_core=spec.out_of_core, n_clusters=k) as (data, _):
        try:
            check_rows_when_placed(fit_spec, dataset, data)
            moments, _ = first_pass(data)
            tree = bisecting(
                data,
                k,
                mean=np.asarray(moments.mean, np.float64),
                init=spec.init,
                n_init=spec.n_init,
                max_iter=spec.max_iter,
                tol=spec.tol,
                strategy=spec.bisecting_strategy,
                seed=seed,
            )
            arrays = tree.arrays()
            labels, inertia, sums = data.labelled_pass(
                leaf_values, (arrays,), keep_labels=dataset.frame is None, per_label=k
            )
            n_passes = data.passes
            in_memory = data.in_memory
        finally:
            data.release()
    if dataset.frame is not None:  # on the DataFrame's index, from its partitions
        labels = tree_labels(dataset.frame, arrays)
    elif labels is None:  # rows read from their source: labels stay lazy, read when used
        labels = tree_labels(dataset.array, arrays)
    elif not dataset.is_dask and hasattr(labels, "compute"):
        labels = labels.compute()
    elif dataset.is_dask:  # a small Dask array fitted in this process: a Dask array all the same
        labels = labels_like(labels, dataset)
    if not dataset.is_dask and not hasattr(labels, "compute"):
        labels = np.asarray(labels, np.int32)
    if dataset.on_device:  # the tree is descended in host memory; the labels follow the input
        labels = labels_on_device(labels)
    centroids = tree.centres.astype(dataset.array.dtype)
    return BisectingResult(
        centroids,
        labels,
        float(inertia),
        tree.objectives,
        tree.n_iter,
        tree,
        arrays,
        "in-memory" if in_memory else "out-of-core",
        n_passes,
        sums[:, 1],
        sums[:, 0],
    )


def _labels_partition(part, tree, name):
    rows = np.ascontiguousarray(part.to_numpy(dtype=np.float64))
    return pd.Series(leaf_labels(rows, tree), index=part.index, name=name)


def tree_labels(X, tree: TreeArrays, *, name: str = "cluster"):
    """Each row's leaf, descending the tree (scikit-learn's ``BisectingKMeans.predict``), int32.

    A NumPy array for in-memory rows, a lazy Dask array for a Dask array, a Dask Series on the
    input's index for a Dask DataFrame.
    """
    if is_dask_dataframe(X):
        meta = pd.Series(np.empty(0, np.int32), name=name, index=index_meta(X))
        return map_partitions(X, _labels_partition, tree, name, meta=meta)
    if is_dask_array(X):
        return map_row_blocks(X, leaf_labels, tree, dtype=np.int32)
    return leaf_labels(X, tree)


__all__ = ["BisectingResult", "BisectingSpec", "run_bisecting", "tree_labels"]
