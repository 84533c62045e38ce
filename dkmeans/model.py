"""Plain result types shared by every layer: Model, TrainResult, InferResult."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dkmeans.errors import InvalidDataError


@dataclass(frozen=True)
class Model:
    """A trained k-means model (oneDAL ``kmeans::model``).

    Read more in the :ref:`User Guide <guide-functional>`.

    Parameters
    ----------
    centroids : ndarray, shape (k, d)
        One centroid per row (host NumPy array, float32 or float64).
    cluster_count : int, optional
        Must equal ``centroids.shape[0]`` when given (the spec's invariant).
    """

    centroids: np.ndarray
    cluster_count: int = None  # type: ignore[assignment]

    def __post_init__(self):
        C = np.asarray(self.centroids)
        if C.ndim != 2 or C.shape[0] == 0 or C.shape[1] == 0:
            raise InvalidDataError(
                f"Model centroids must be a non-empty 2-D array, got shape {C.shape}"
            )
        if self.cluster_count is not None and int(self.cluster_count) != C.shape[0]:
            raise InvalidDataError(
                f"Model cluster_count={self.cluster_count} does not match the {C.shape[0]} centroid rows"
            )
        object.__setattr__(self, "centroids", C)
        object.__setattr__(self, "cluster_count", int(C.shape[0]))


@dataclass(frozen=True)
class TrainResult:
    """Result of :func:`dkmeans.train` (oneDAL ``kmeans::train_result``).

    Read more in the :ref:`User Guide <guide-functional>`.

    Attributes
    ----------
    model : Model
    labels : ndarray or dask.array.Array, shape (n,), int32
        NumPy for in-memory input, a (persisted) Dask array for Dask input.
    iteration_count : int
        Centroid updates performed (``<= max_iteration_count``).
    objective_function_value : float
        ``Phi_X(model.centroids)``: what :func:`dkmeans.infer` returns for the same data.
    history : list of IterationRecord or HartiganRecord
        Per iteration: objective and seconds; Lloyd adds the centroid shift and empty
        clusters fixed, Hartigan the moves made per round.
    stop_reason : str
        ``"objective-decrease"``, ``"centroid-shift"``, ``"fixed-point"``,
        ``"no-improving-move"`` (Hartigan) or ``"max_iter"``.
    converged : bool
        False only when the run stopped at ``max_iteration_count``.
    data_mode : {"in-memory", "out-of-core"}
        Whether the data was persisted for the training or read from its source in every pass.
    pass_count : int
        Passes over the data (moments, seeding, iterations, final assignment).
    """

    model: Model
    labels: Any
    iteration_count: int
    objective_function_value: float
    history: list = field(default_factory=list)
    stop_reason: str = "max_iter"
    converged: bool = False
    data_mode: str = "in-memory"
    pass_count: int = 0


@dataclass(frozen=True)
class InferResult:
    """Result of :func:`dkmeans.infer` (oneDAL ``kmeans::infer_result``).

    Read more in the :ref:`User Guide <guide-functional>`.

    Attributes
    ----------
    labels : ndarray or dask.array.Array, shape (n,), int32
    objective_function_value : float
    """

    labels: Any
    objective_function_value: float
