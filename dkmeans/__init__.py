"""dkmeans: distributed k-means clustering on Dask.

Public names: :class:`KMeans`, :class:`MiniBatchKMeans`, :class:`BisectingKMeans` (scikit-learn
estimators), :class:`Descriptor`,
:func:`train`, :func:`infer`, :class:`Model`, :class:`TrainResult`,
:class:`InferResult` (oneDAL-style functional API), :func:`sweep` and :class:`SweepResult` (several
values of k fitted together, sharing their passes over the data), :func:`get_client`.

Names and submodules are reached as attributes once ``dkmeans`` is imported, each loaded on first use:
``dkmeans.plot`` (matplotlib figures), ``dkmeans.metrics`` (clustering scores), ``dkmeans.io``
(model files), ``dkmeans.testing`` (test data), ``dkmeans.config`` (the Dask config keys).
"""

from dkmeans._lazy import lazy_attributes as _lazy_attributes
from dkmeans._version import __version__

#: The public names, each imported from its module on first use (PEP 562), so that ``import
#: dkmeans`` costs next to nothing: the estimators' modules load scikit-learn, Dask and the
#: kernels when first reached (``dkmeans.KMeans``, ``from dkmeans import KMeans``).
_NAMES = {
    "get_client": "dkmeans.engine.client",
    "KMeans": "dkmeans.estimator",
    "MiniBatchKMeans": "dkmeans.minibatch_estimator",
    "BisectingKMeans": "dkmeans.bisecting_estimator",
    "Descriptor": "dkmeans.functional",
    "infer": "dkmeans.functional",
    "train": "dkmeans.functional",
    "SweepResult": "dkmeans.ksweep",
    "sweep": "dkmeans.ksweep",
    "InferResult": "dkmeans.model",
    "Model": "dkmeans.model",
    "TrainResult": "dkmeans.model",
}

#: Public submodules, imported on first use (``dkmeans.plot``, ``dkmeans.metrics``, ...) as
#: scikit-learn does: ``import dkmeans`` stays light (matplotlib only with ``dkmeans.plot``).
_SUBMODULES = (
    "cli",
    "config",
    "errors",
    "functional",
    "io",
    "ksweep",
    "metrics",
    "model",
    "plot",
    "testing",
)


__getattr__ = _lazy_attributes(__name__, _NAMES, globals(), _SUBMODULES)


def __dir__():
    return sorted(set(globals()) | set(_NAMES) | set(_SUBMODULES))


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
