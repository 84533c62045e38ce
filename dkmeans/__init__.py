"""dkmeans: distributed k-means clustering on Dask.

Public names: :class:`KMeans`, :class:`MiniBatchKMeans`, :class:`BisectingKMeans` (scikit-learn estimators), :class:`Descriptor`,
:func:`train`, :func:`infer`, :class:`Model`, :class:`TrainResult`,
:class:`InferResult` (oneDAL-style functional API), :func:`sweep` and :class:`SweepResult` (several
values of k fitted together, sharing their passes over the data), :func:`get_client`.
"""

from dkmeans.engine.client import get_client
from dkmeans.estimator import KMeans
from dkmeans.minibatch_estimator import MiniBatchKMeans
from dkmeans.bisecting_estimator import BisectingKMeans
from dkmeans.functional import Descriptor, infer, train
from dkmeans.ksweep import SweepResult, sweep
from dkmeans.model import InferResult, Model, TrainResult

from dkmeans._version import __version__

__all__ = [
    "__version__",
    "BisectingKMeans",
    "Descriptor",
    "InferResult",
    "KMeans",
    "MiniBatchKMeans",
    "Model",
    "SweepResult",
    "TrainResult",
    "get_client",
    "infer",
    "sweep",
    "train",
]
