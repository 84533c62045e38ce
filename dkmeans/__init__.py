"""dkmeans: distributed k-means clustering on Dask.

Public names: :class:`KMeans`, :class:`MiniBatchKMeans`, :class:`BisectingKMeans` (scikit-learn estimators), :class:`Descriptor`,
:func:`train`, :func:`infer`, :class:`Model`, :class:`TrainResult`,
:class:`InferResult` (oneDAL-style functional API), :func:`sweep` and :class:`SweepResult` (several
values of k fitted together, sharing their passes over the data), :func:`get_client`.

Submodules are reached as attributes once ``dkmeans`` is imported, each loaded on first use:
``dkmeans.plot`` (matplotlib figures), ``dkmeans.metrics`` (clustering scores), ``dkmeans.io``
(model files), ``dkmeans.testing`` (test data), ``dkmeans.config`` (the Dask config keys).
"""

from dkmeans.engine.client import get_client
from dkmeans.estimator import KMeans
from dkmeans.minibatch_estimator import MiniBatchKMeans
from dkmeans.bisecting_estimator import BisectingKMeans
from dkmeans.functional import Descriptor, infer, train
from dkmeans.ksweep import SweepResult, sweep
from dkmeans.model import InferResult, Model, TrainResult

from dkmeans._version import __version__

#: Public submodules, imported on first use (``dkmeans.plot``, ``dkmeans.metrics``, ...) as
#: scikit-learn does: ``import dkmeans`` stays light (matplotlib only with ``dkmeans.plot``).
_SUBMODULES = ("cli", "config", "errors", "functional", "io", "ksweep", "metrics", "model", "plot",
               "testing")


def __getattr__(name: str):
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"dkmeans.{name}")
    raise AttributeError(f"module 'dkmeans' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_SUBMODULES))

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
