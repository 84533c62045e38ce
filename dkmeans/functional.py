"""The oneDAL-style functional API: ``Descriptor``, ``train``, ``infer``.

Names follow the oneDAL K-Means specification (``cluster_count``,
``max_iteration_count``, ``accuracy_threshold``, ``objective_function_value``); every
invariant and precondition of the specification is checked before any work is submitted.

Examples
--------
>>> import numpy as np, dkmeans
>>> X = np.random.default_rng(0).normal(size=(1000, 2))
>>> desc = dkmeans.Descriptor(cluster_count=3, max_iteration_count=50, accuracy_threshold=1e-6)
>>> result = dkmeans.train(desc, X, X[:3])                 # doctest: +SKIP
>>> dkmeans.infer(desc, result.model, X).labels[:5]       # doctest: +SKIP
"""

from __future__ import annotations

import numbers
import os
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dkmeans import init as init_strategies
from dkmeans._graph import PersistedData
from dkmeans.init import InitOptions
from dkmeans.io.dataframe import predict_series
from dkmeans._random import resolve_seed
from dkmeans._validation import (
    as_dataset,
    check_centroids,
    check_float,
    check_float_dtype,
    check_int,
    check_n_clusters_vs_rows,
    check_sample_weight,
)
from dkmeans.cluster import get_client
from dkmeans.errors import DataTypeError, InvalidDataError, InvalidParameterError
from dkmeans._device import check_device
from dkmeans.checkpoint import Checkpointer, FitState, data_fingerprint
from dkmeans.io.model_file import digest
from dkmeans.kernels import column_moments, combine_moments
from dkmeans.lloyd import CentroidShift, ObjectiveDecrease, assign_dataset
from dkmeans.runs import FitPlan, fit_runs
from dkmeans.model import InferResult, Model, TrainResult

STOP_RULES = ("objective-decrease", "centroid-shift")
METHODS = ("lloyd", "hartigan")


@dataclass(frozen=True)
class Descriptor:
    """Parameters of the K-Means algorithm (oneDAL ``kmeans::desc``).

    Parameters
    ----------
    cluster_count : int, default 2
        Number of clusters ``k`` (invariant: ``> 0``).
    max_iteration_count : int, default 100
        Maximum number of iterations ``T`` (invariant: ``>= 0``).
    accuracy_threshold : float, default 0.0
        Threshold ``eps`` of the stop condition (invariant: ``>= 0``).
    dtype : {numpy.float32, numpy.float64}, default numpy.float32
        Floating-point type of the computation (the specification's ``Float``); data of
        another type is converted chunk by chunk on the workers.
    stop_rule : {"objective-decrease", "centroid-shift"}, default "objective-decrease"
        ``"objective-decrease"`` stops when ``Phi(C_t) - Phi(C_t+1) < eps`` (the oneDAL
        developer guide); ``"centroid-shift"`` when ``sum_j ||c_j(t) - c_j(t+1)||^2 < eps``
        (the older specification). Either way the run also stops at a fixed point, where
        no centroid moves and further iterations cannot change the result.
    method : {"lloyd", "hartigan"}, default "lloyd"
        The spec's method tag. ``"hartigan"``: batch Hartigan (unsafe mode) from the
        initial centroids, stopping when no single move improves, when a round lowers the
        objective by less than ``accuracy_threshold``, or after ``max_iteration_count``
        rounds.
    """

    cluster_count: int = 2
    max_iteration_count: int = 100
    accuracy_threshold: float = 0.0
    dtype: Any = np.float32
    stop_rule: str = "objective-decrease"
    method: str = "lloyd"

    def __post_init__(self):
        object.__setattr__(self, "cluster_count", check_int("cluster_count", self.cluster_count, 1))
        object.__setattr__(
            self, "max_iteration_count", check_int("max_iteration_count", self.max_iteration_count, 0)
        )
        object.__setattr__(
            self, "accuracy_threshold", check_float("accuracy_threshold", self.accuracy_threshold, 0.0)
        )
        object.__setattr__(self, "dtype", check_float_dtype(self.dtype).type)
        if self.stop_rule not in STOP_RULES:
            raise InvalidParameterError(f"stop_rule must be one of {STOP_RULES}, got {self.stop_rule!r}")
        if self.method not in METHODS:
            raise InvalidParameterError(f"method must be one of {METHODS}, got {self.method!r}")

    def _stop_rule(self):
        if self.stop_rule == "centroid-shift":
            return CentroidShift(self.accuracy_threshold, inclusive=False)
        return ObjectiveDecrease(self.accuracy_threshold)


def _check_descriptor(desc) -> Descriptor:
    if not isinstance(desc, Descriptor):
        raise DataTypeError(f"desc must be a dkmeans.Descriptor, got {type(desc).__name__}")
    return desc


def _moments_chunk(X, w, offset):
    return column_moments(X)


def _n_workers(client) -> int:
    return max(1, len(client.scheduler_info(n_workers=-1)["workers"]))


def train(desc: Descriptor, data, initial_centroids="k-means||", *, sample_weight=None, random_state=None,
          oversampling_factor: float = 2.0, init_rounds: int = 5, columns=None, checkpoint=None,
          checkpoint_every: int = 10, device=None) -> TrainResult:
    """Train a K-Means model with Lloyd's method (oneDAL ``train``).

    Parameters
    ----------
    desc : Descriptor
    data : array-like, pandas DataFrame, Dask array or Dask DataFrame, shape (n, p)
    initial_centroids : array-like of shape (cluster_count, p), or str, default "k-means||"
        The starting centroids, or the name of an initialisation strategy:
        ``"k-means||"``, ``"k-means++"``, ``"random"``, ``"random-partition"``
        (see :class:`dkmeans.KMeans`). ``None`` means the default strategy.
    sample_weight : array-like or Dask array of shape (n,), optional
        Non-negative weights; the objective and the means are weighted.
    random_state : int, numpy.random.Generator or None
        Seed of a named initialisation strategy.
    oversampling_factor, init_rounds
        Options of ``"k-means||"`` (see :class:`dkmeans.KMeans`).
    columns : list of str, optional
        For DataFrame input: the (numeric) columns to cluster on (default: all).
    checkpoint : str or path-like, optional
        Checkpoint file: the state is written after the initialisation and every
        ``checkpoint_every`` iterations, and a run that finds the file resumes from it
        (see :class:`dkmeans.KMeans`). A checkpoint of another job is refused.
    checkpoint_every : int, default 10
        Iterations between checkpoint writes.
    device : {None, "cpu", "gpu"}, default None
        Where the chunks are processed. None: where the data is (CuPy arrays and
        CuPy-backed Dask arrays on the GPU, the rest on the CPU); "gpu": NumPy/Dask data is
        moved to the workers' GPUs once, chunk by chunk (needs CuPy); "cpu": CuPy data is
        moved to host memory. Centroids are always NumPy.

    Returns
    -------
    TrainResult
        ``labels`` is NumPy for in-memory data, a persisted Dask array for a Dask array,
        and a lazy Dask Series on the input's index and partitions for a Dask DataFrame;
        ``objective_function_value`` and ``labels`` are what :func:`infer` returns for
        ``model`` on the same data.

    Raises
    ------
    InvalidParameterError, InvalidDataError, DataTypeError
        When a precondition of the specification does not hold (before any work runs).
    """
    desc = _check_descriptor(desc)
    client = get_client()
    dataset = as_dataset(data, n_workers=_n_workers(client), dtype=desc.dtype, name="data", columns=columns,
                         device=check_device(device))
    k = desc.cluster_count
    options = InitOptions(
        oversampling_factor=check_float("oversampling_factor", oversampling_factor, 0.0),
        init_rounds=check_int("init_rounds", init_rounds, 1),
    )
    if options.oversampling_factor <= 0:
        raise InvalidParameterError(f"oversampling_factor must be > 0, got {oversampling_factor}")
    checkpoint_every = check_int("checkpoint_every", checkpoint_every, 1)
    if checkpoint is not None and not isinstance(checkpoint, (str, os.PathLike)):
        raise InvalidParameterError(f"checkpoint must be a file path or None, got {type(checkpoint).__name__}")
    if initial_centroids is None:
        initial_centroids = "k-means||"
    if isinstance(initial_centroids, str):
        try:
            strategy = init_strategies.get_strategy(initial_centroids)
        except KeyError:
            raise InvalidParameterError(
                f"initial_centroids: unknown strategy {initial_centroids!r}; "
                f"use an array or one of {sorted(init_strategies.STRATEGIES)}"
            ) from None
        C0, strategy_name = None, initial_centroids
        seed = resolve_seed(random_state)
    else:
        C0 = check_centroids(initial_centroids, k, dataset.n_features, desc.dtype, name="initial_centroids")
        seed, strategy_name = 0, "array sha256 " + digest(np.asarray(C0))
    if dataset.n_rows is not None:
        check_n_clusters_vs_rows(k, dataset.n_rows, "cluster_count")
    weights = check_sample_weight(sample_weight, dataset)
    persisted = PersistedData(client, dataset.array, weights)
    try:
        check_n_clusters_vs_rows(k, persisted.n_rows, "cluster_count")
        checkpointer, state = None, FitState(seed)
        if checkpoint is not None:
            job = {"function": "dkmeans.train", "descriptor": {**asdict(desc), "dtype": np.dtype(desc.dtype).name},
                   "initial_centroids": strategy_name, "oversampling_factor": options.oversampling_factor,
                   "init_rounds": options.init_rounds,
                   "random_state": int(random_state) if isinstance(random_state, numbers.Integral) else None,
                   "n_rows": persisted.n_rows, "n_features": persisted.n_features,
                   "weighted": persisted.weights is not None,
                   "data": data_fingerprint(persisted.map_reduce(_moments_chunk, combine_moments))}
            checkpointer = Checkpointer(checkpoint, checkpoint_every, job)
            if checkpointer.exists():
                state = checkpointer.load()
        plan = FitPlan(
            n_init=1,
            initialise=lambda run: C0 if C0 is not None else strategy(persisted, k, state.seed, options),
            max_iter=desc.max_iteration_count,
            stop_rule=desc._stop_rule(),
            lloyd=desc.method == "lloyd",
            hartigan_mode="unsafe" if desc.method == "hartigan" else None,
            hartigan_tol=desc.accuracy_threshold,
        )
        run = fit_runs(persisted, plan, state, checkpointer)
        fit_labels, objective = assign_dataset(client, persisted.X, run.centroids, persisted.weights,
                                               keep_labels=dataset.frame is None, generation=persisted.generation)
    finally:
        persisted.release()
    if dataset.frame is not None:  # labels on the DataFrame's index, computed from its partitions
        labels = predict_series(dataset.frame, run.centroids)
    else:
        labels = fit_labels if dataset.is_dask else fit_labels.compute()
    return TrainResult(
        model=Model(np.asarray(run.centroids).astype(desc.dtype)),
        labels=labels,
        iteration_count=run.n_iter,
        objective_function_value=objective,
        history=run.history,
        stop_reason=run.stop_reason,
        converged=run.converged,
    )


def infer(desc: Descriptor, model: Model, data, *, columns=None) -> InferResult:
    """Assign data to the nearest centroid of a model (oneDAL ``infer``).

    Parameters
    ----------
    desc : Descriptor
        ``desc.cluster_count`` must equal ``model.cluster_count``.
    model : Model
    data : array-like, pandas DataFrame, Dask array or Dask DataFrame, shape (m, p)
    columns : list of str, optional
        For DataFrame input: the (numeric) columns to use (default: all).

    Returns
    -------
    InferResult
        Labels (NumPy for in-memory data, Dask for Dask data) and the objective
        ``Phi_X(model.centroids)``.
    """
    desc = _check_descriptor(desc)
    if not isinstance(model, Model):
        raise DataTypeError(f"model must be a dkmeans.Model, got {type(model).__name__}")
    if model.cluster_count != desc.cluster_count:
        raise InvalidDataError(
            f"model has {model.cluster_count} centroids but desc.cluster_count is {desc.cluster_count}"
        )
    client = get_client()
    dataset = as_dataset(data, n_workers=_n_workers(client), dtype=desc.dtype, name="data", columns=columns)
    if model.centroids.shape[1] != dataset.n_features:
        raise InvalidDataError(
            f"data has {dataset.n_features} features but the model's centroids have {model.centroids.shape[1]}"
        )
    array = dataset.array
    labels, objective = assign_dataset(client, array, model.centroids, gather=not dataset.is_dask,
                                       keep_labels=dataset.frame is None)
    if dataset.frame is not None:
        labels = predict_series(dataset.frame, model.centroids.astype(array.dtype))
    return InferResult(labels=labels, objective_function_value=objective)
