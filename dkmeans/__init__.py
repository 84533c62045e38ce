"""dkmeans: distributed k-means clustering on Dask.

Public names: :class:`KMeans`, :class:`MiniBatchKMeans` (scikit-learn estimators), :class:`Descriptor`,
:func:`train`, :func:`infer`, :class:`Model`, :class:`TrainResult`,
:class:`InferResult` (oneDAL-style functional API), :func:`get_client`.
"""

from dkmeans.engine.client import get_client
from dkmeans.estimator import KMeans
from dkmeans.minibatch_estimator import MiniBatchKMeans
from dkmeans.functional import Descriptor, infer, train
from dkmeans.model import InferResult, Model, TrainResult

from dkmeans._version import __version__

__all__ = [
    "__version__",
    "Descriptor",
    "InferResult",
    "KMeans",
    "MiniBatchKMeans",
    "Model",
    "TrainResult",
    "get_client",
    "infer",
    "train",
]
