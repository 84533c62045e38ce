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
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dkmeans.engine.client import get_client
from dkmeans.errors import DataTypeError, InvalidDataError, InvalidParameterError
from dkmeans.fit import inference
from dkmeans.fit import params as _params
from dkmeans.fit.inputs import as_dataset, check_float_dtype, expand_labels, named_missing
from dkmeans.fit.options import DEFAULT_BATCH_SIZE, init_options, minibatch_options
from dkmeans.fit.service import run_fit
from dkmeans.fit.spec import FitSpec
from dkmeans.model import InferResult, Model, TrainResult


@dataclass(frozen=True)
class Descriptor:
    """Parameters of the K-Means algorithm (oneDAL ``kmeans::desc``).

    Read more in the :ref:`User Guide <guide-functional>`.

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
    method : {"lloyd", "hartigan", "minibatch"}, default "lloyd"
        The spec's method tag. ``"hartigan"``: batch Hartigan (unsafe mode) from the
        initial centroids, stopping when no single move improves, when a round lowers the
        objective by less than ``accuracy_threshold``, or after ``max_iteration_count``
        rounds. ``"minibatch"``: scikit-learn's mini-batch k-means (see
        :class:`dkmeans.MiniBatchKMeans`; ``train``'s ``batch_size``,
        ``max_no_improvement`` and ``reassignment_ratio``): ``max_iteration_count`` counts
        epochs, ``accuracy_threshold`` bounds the squared center change of a step (0: only
        the no-improvement rule), a seeding strategy runs on a sample of ``3 *
        batch_size`` rows; out-of-core data is read once per epoch.
    metric : {"euclidean", "cosine"}, default "euclidean"
        ``"cosine"``: spherical k-means (see :class:`dkmeans.KMeans`): rows normalised to
        unit length (a row of zeros is an error), unit centroids, objective
        ``sum w (1 - cos)`` (also the objective ``accuracy_threshold`` bounds with
        ``stop_rule="objective-decrease"``); :func:`infer` uses the same metric.
    """

    cluster_count: int = 2
    max_iteration_count: int = 100
    accuracy_threshold: float = 0.0
    dtype: Any = np.float32
    stop_rule: str = "objective-decrease"
    method: str = "lloyd"
    metric: str = "euclidean"

    def __post_init__(self):
        checked = _params.check(
            "functional",
            {
                "cluster_count": self.cluster_count,
                "max_iteration_count": self.max_iteration_count,
                "accuracy_threshold": self.accuracy_threshold,
                "stop_rule": self.stop_rule,
                "method": self.method,
                "metric": self.metric,
            },
        )
        object.__setattr__(self, "cluster_count", checked["n_clusters"])
        object.__setattr__(self, "max_iteration_count", checked["max_iter"])
        object.__setattr__(self, "accuracy_threshold", checked["tol"])
        object.__setattr__(self, "dtype", check_float_dtype(self.dtype).type)


def _check_descriptor(desc) -> Descriptor:
    if not isinstance(desc, Descriptor):
        raise DataTypeError(f"desc must be a dkmeans.Descriptor, got {type(desc).__name__}")
    return desc


def train(
    desc: Descriptor,
    data,
    initial_centroids="k-means||",
    *,
    sample_weight=None,
    random_state=None,
    oversampling_factor: float = 2.0,
    init_rounds: int = 5,
    columns=None,
    checkpoint=None,
    checkpoint_every: int = 10,
    device=None,
    out_of_core="auto",
    local_search=False,
    prune="auto",
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_no_improvement=10,
    reassignment_ratio: float = 0.01,
    missing="error",
    max_cluster_size=None,
    min_cluster_size=None,
    balanced: bool = False,
) -> TrainResult:
    """Train a K-Means model with Lloyd's method (oneDAL ``train``).

    Read more in the :ref:`User Guide <guide-functional>`.

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
        (see :class:`dkmeans.KMeans`, and :class:`dkmeans.MiniBatchKMeans` for
        ``method="minibatch"``). A checkpoint of another job is refused.
    checkpoint_every : int, default 10
        Iterations (``method="minibatch"``: steps) between checkpoint writes.
    device : {None, "cpu", "gpu"}, default None
        Where the chunks are processed. None: where the data is (CuPy arrays and
        CuPy-backed Dask arrays on the GPU, the rest on the CPU); "gpu": NumPy/Dask data is
        moved to the workers' GPUs once, chunk by chunk (needs CuPy); "cpu": CuPy data is
        moved to host memory. Centroids are always NumPy.
    out_of_core : {"auto", True, False}, default "auto"
        Persist the data for the fit, or read it from its source in every pass (see
        :class:`dkmeans.KMeans`); the mode taken is ``TrainResult.data_mode``.
    local_search : {"auto", True, False}, default False
        Swap-based local search after Lloyd, then Lloyd again (see :class:`dkmeans.KMeans`);
        off by default, so that ``train`` is oneDAL's Lloyd.
    prune : {"auto", True, False}, default "auto"
        Skip the distances that cannot change a label in Lloyd's iterations over data kept in
        memory (see :class:`dkmeans.KMeans`); the results are the same either way.
    batch_size, max_no_improvement, reassignment_ratio
        With ``desc.method == "minibatch"`` (see :class:`dkmeans.MiniBatchKMeans`).
    missing : {"error", "skip"}, default "error"
        Rows with a missing value (NaN, ``pd.NA``, Arrow null): an error naming the columns,
        or left out of the fit (``labels`` -1 for them), as :class:`dkmeans.KMeans` does.
    max_cluster_size, min_cluster_size : int, float or None, default None
        Size caps: a count of rows, or a fraction of them in (0, 1] (see
        :class:`dkmeans.KMeans`); each iteration assigns under them, and ``labels`` and
        ``objective_function_value`` are the capped assignment's (not :func:`infer`'s).
    balanced : bool, default False
        Sizes within one row of ``n / cluster_count``.

    Returns
    -------
    TrainResult
        ``labels`` is NumPy for in-memory data, a Dask array for a Dask array, and a lazy
        Dask Series on the input's index and partitions for a Dask DataFrame;
        ``objective_function_value`` and ``labels`` are what :func:`infer` returns for
        ``model`` on the same data.

    Raises
    ------
    InvalidParameterError, InvalidDataError, DataTypeError
        When a precondition of the specification does not hold (before any work runs).
    """
    desc = _check_descriptor(desc)
    p = _params.check(
        "functional",
        {
            "oversampling_factor": oversampling_factor,
            "init_rounds": init_rounds,
            "checkpoint": checkpoint,
            "checkpoint_every": checkpoint_every,
            "device": device,
            "out_of_core": out_of_core,
            "local_search": local_search,
            "batch_size": batch_size,
            "max_no_improvement": max_no_improvement,
            "reassignment_ratio": reassignment_ratio,
            "prune": prune,
            "missing": missing,
            "max_cluster_size": max_cluster_size,
            "min_cluster_size": min_cluster_size,
            "balanced": balanced,
        },
    )
    minibatch = None
    if desc.method == "minibatch":
        if desc.metric != "euclidean":
            raise InvalidParameterError("method='minibatch' is Euclidean only")
        minibatch = minibatch_options(
            batch_size=p["batch_size"],
            max_no_improvement=p["max_no_improvement"],
            reassignment_ratio=p["reassignment_ratio"],
        )
    if initial_centroids is None:
        initial_centroids = "k-means||"
    if isinstance(initial_centroids, str) and initial_centroids not in _params.INIT_STRATEGIES:
        raise InvalidParameterError(
            f"initial_centroids: unknown strategy {initial_centroids!r}; "
            f"use an array or one of {sorted(_params.INIT_STRATEGIES)}"
        )
    dataset = as_dataset(
        data,
        dtype=desc.dtype,
        name="data",
        columns=columns,
        device=p["device"],
        missing=p["missing"],
    )
    job = {
        "function": "dkmeans.train",
        "descriptor": {**asdict(desc), "dtype": np.dtype(desc.dtype).name},
        "initial_centroids": initial_centroids if isinstance(initial_centroids, str) else "array",
        "oversampling_factor": p["oversampling_factor"],
        "init_rounds": p["init_rounds"],
        "local_search": p["local_search"],
        "random_state": int(random_state) if isinstance(random_state, numbers.Integral) else None,
    }
    if minibatch is not None:  # only then: Lloyd checkpoints of earlier versions keep their job
        job["minibatch"] = asdict(minibatch)
    caps = {
        name: p[name] for name in ("max_cluster_size", "min_cluster_size") if p[name] is not None
    }
    if p["balanced"]:
        caps["balanced"] = True
    job.update(caps)  # only where set: uncapped checkpoints of earlier versions keep their job
    spec = FitSpec(
        n_clusters=desc.cluster_count,
        init=initial_centroids,
        n_init=1,
        max_iter=desc.max_iteration_count,
        tol=desc.accuracy_threshold,
        stop_rule=desc.stop_rule,
        tol_relative=False,
        tol_inclusive=False,
        algorithm=desc.method,
        hartigan_mode="unsafe",
        hartigan_tol=desc.accuracy_threshold,
        local_search=p["local_search"],
        init_options=init_options(
            oversampling_factor=p["oversampling_factor"], init_rounds=p["init_rounds"]
        ),
        random_state=random_state
        if isinstance(initial_centroids, str) or desc.method == "minibatch"
        else 0,
        checkpoint=p["checkpoint"],
        checkpoint_every=p["checkpoint_every"],
        out_of_core=p["out_of_core"],
        job=job,
        names={"n_clusters": "cluster_count", "init": "initial_centroids"},
        metric=desc.metric,
        minibatch=minibatch,
        prune=p["prune"],
        max_cluster_size=p["max_cluster_size"],
        min_cluster_size=p["min_cluster_size"],
        balanced=p["balanced"],
    )
    result = run_fit(spec, dataset, sample_weight)
    return TrainResult(
        model=Model(np.asarray(result.centroids).astype(desc.dtype)),
        labels=result.labels,
        iteration_count=result.n_iter,
        objective_function_value=result.objective,
        history=result.history,
        stop_reason=result.stop_reason,
        converged=result.converged,
        data_mode=result.data_mode,
        pass_count=result.n_passes,
    )


def infer(desc: Descriptor, model: Model, data, *, columns=None, missing="error") -> InferResult:
    """Assign data to the nearest centroid of a model (oneDAL ``infer``).

    Read more in the :ref:`User Guide <guide-functional>`.

    Parameters
    ----------
    desc : Descriptor
        ``desc.cluster_count`` must equal ``model.cluster_count``.
    model : Model
    data : array-like, pandas DataFrame, Dask array or Dask DataFrame, shape (m, p)
    columns : list of str, optional
        For DataFrame input: the (numeric) columns to use (default: all).
    missing : {"error", "skip"}, default "error"
        Rows with a missing value: an error naming the columns, or label -1 (left out of the
        objective).

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
    missing = _params.check("functional", {"missing": missing})["missing"]
    dataset = as_dataset(data, dtype=desc.dtype, name="data", columns=columns, missing=missing)
    if model.centroids.shape[1] != dataset.n_features:
        raise InvalidDataError(
            f"data has {dataset.n_features} features but the model's centroids have {model.centroids.shape[1]}"
        )
    if (
        dataset.local is not None
    ):  # in-memory data: assigned right here, as the estimator's predict does
        labels, objective = inference.labels_and_objective(
            dataset.local, model.centroids, desc.metric
        )
        return InferResult(
            labels=expand_labels(labels, dataset.kept), objective_function_value=objective
        )
    keep = "none" if dataset.frame is not None else "persist" if dataset.is_dask else "gather"
    with named_missing(dataset):
        labels, objective = inference.labels_and_objective(
            dataset.array, model.centroids, desc.metric, client=get_client(), keep=keep
        )
    if dataset.frame is not None:  # on the DataFrame's index
        labels = inference.labels(
            dataset.frame, model.centroids.astype(dataset.array.dtype), desc.metric, missing=missing
        )
    elif (
        dataset.unfiltered is not None
    ):  # missing="skip": every input row, -1 where one has a missing value
        labels = inference.labels(
            dataset.unfiltered,
            model.centroids.astype(dataset.array.dtype),
            desc.metric,
            missing="skip",
        )
    return InferResult(labels=labels, objective_function_value=objective)
