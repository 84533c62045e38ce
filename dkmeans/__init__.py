"""dkmeans: distributed k-means clustering on Dask.

Public names: :class:`KMeans` (scikit-learn estimator), :class:`Descriptor`,
:func:`train`, :func:`infer`, :class:`Model`, :class:`TrainResult`,
:class:`InferResult` (oneDAL-style functional API), :func:`get_client`.
"""

from dkmeans.cluster import get_client
from dkmeans.estimator import KMeans
from dkmeans.functional import Descriptor, infer, train
from dkmeans.model import InferResult, Model, TrainResult

from dkmeans._version import __version__

__all__ = [
    "__version__",
    "Descriptor",
    "InferResult",
    "KMeans",
    "Model",
    "TrainResult",
    "get_client",
    "infer",
    "train",
]
