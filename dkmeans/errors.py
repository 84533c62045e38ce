"""Exception types raised by dkmeans.

Each subclasses the built-in type a user would already catch (``ValueError`` or
``TypeError``), so ``except ValueError`` keeps working, while ``except DKMeansError``
catches everything this package raises on purpose.
"""

from __future__ import annotations


class DKMeansError(Exception):
    """Base class of every error dkmeans raises on purpose.

    Read more in the :ref:`User Guide <guide-long-jobs>`.
    """


class InvalidParameterError(DKMeansError, ValueError, TypeError):
    """A parameter has a value or type outside its documented domain.

    Both a ``ValueError`` and a ``TypeError``, like scikit-learn's ``InvalidParameterError``,
    so code written against either library catches it.
    """


class InvalidDataError(DKMeansError, ValueError):
    """Input data (or centroids, or weights) has the wrong shape or content."""


class DataSourceError(InvalidDataError, OSError):
    """A path could not be read or written: no such file or bucket, a glob matching nothing, wrong
    credentials, an unreachable endpoint (local files and object stores alike)."""


class DataTypeError(DKMeansError, TypeError):
    """Input data has a type or dtype dkmeans cannot work with."""


class ClusterError(DKMeansError, RuntimeError):
    """The Dask cluster could not finish the work (data lost, restarted, no workers)."""


class InputLostError(ClusterError):
    """Input chunks were lost with a worker and cannot be recomputed (scattered data)."""


class ClusterRestartedError(ClusterError):
    """The cluster was restarted (``client.restart()``) while dkmeans was using it."""


class NoWorkersError(ClusterError, TimeoutError):
    """Every worker was gone for longer than the ``dkmeans.worker-timeout`` setting."""


class WorkersPausedError(ClusterError, TimeoutError):
    """Every worker was paused by distributed's memory monitor for longer than ``dkmeans.worker-timeout``."""


class ChunkTooLargeError(DKMeansError, MemoryError):
    """One chunk of the input alone exceeds a worker's memory budget for a task (nothing was run)."""


class JobInterrupted(BaseException):
    """The command line was asked to stop (SIGTERM or SIGINT): raised in its main thread.

    A ``BaseException``, like ``KeyboardInterrupt``, so that ``except Exception`` does not
    swallow it; not a ``KeyboardInterrupt``, so that distributed's blocking calls do not take
    it for a Ctrl-C of their own (their cancellation can fail with a traceback when the
    interruption comes early).

    Parameters
    ----------
    signum : int
        The signal received (kept as ``signum``).
    """

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = int(signum)


#: What stops a fit from outside: a fit that keeps a checkpoint writes its last state on the way
#: out.
INTERRUPTIONS = (KeyboardInterrupt, JobInterrupted)


def distinct_clusters_message(found: int, n_clusters: int) -> str:
    """scikit-learn's warning text (users filter it), then what dkmeans did."""
    return (
        f"Number of distinct clusters ({found}) found smaller than n_clusters ({n_clusters}). Possibly due to "
        f"duplicate points in X. The data has fewer distinct points than n_clusters: some centres coincide."
    )


def warn_distinct_clusters(found: int, n_clusters: int, stacklevel: int = 1) -> None:
    """scikit-learn's ``ConvergenceWarning`` that only ``found`` of ``n_clusters`` centres are
    distinct (:func:`distinct_clusters_message`), attributed as ``warnings.warn`` with
    ``stacklevel`` would be in the caller.

    scikit-learn is imported here, where the warning is given (in the client): the drivers'
    modules are imported by workers, which never import scikit-learn.
    """
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    warnings.warn(
        distinct_clusters_message(found, n_clusters), ConvergenceWarning, stacklevel=stacklevel + 1
    )


#: The one message of every error about NaN or infinity in the data, whether found in a fit's
#: first pass or when a lazy result (labels, distances) is computed.
NON_FINITE_INPUT = "Input contains NaN or infinity: remove or impute non-finite values before clustering or predicting."
