"""``dkmeans.MiniBatchKMeans``: scikit-learn's ``MiniBatchKMeans`` on Dask, with a decaying stream mode.

This module maps scikit-learn's mini-batch names onto the fit service (``algorithm=
"minibatch"``, :func:`dkmeans.fit.options.minibatch_options`); everything else (data checks,
inference, model files) is shared with :class:`dkmeans.KMeans`.
"""

from __future__ import annotations

import warnings

import numpy as np

from dkmeans._lazy import lazy_module
from dkmeans.errors import DataTypeError, InvalidParameterError
from dkmeans.estimator import _finish_progress, _inputs, _KMeansBase, _progress_for, _service
from dkmeans.fit.options import DEFAULT_BATCH_SIZE, init_options, minibatch_options, resolve_seed
from dkmeans.fit.progress import history_dicts
from dkmeans.fit.spec import FitSpec

# loads Dask's collections: imported at the first partial_fit (see dkmeans._lazy)
_partial_fit = lazy_module("dkmeans.fit.partial_fit")
_results = lazy_module("dkmeans.fit.results")


def resolve_decay(decay, half_life, time_unit: str) -> float:
    """The discount per time unit ``a``: ``decay``, or ``0.5 ** (1 / half_life)``, else 1 (no decay)."""
    if decay is not None and half_life is not None:
        raise InvalidParameterError("give decay or half_life, not both")
    if decay is not None:
        if not 0.0 <= decay <= 1.0:
            raise InvalidParameterError(f"decay must be in [0, 1], got {decay}")
        return float(decay)
    if half_life is not None:
        return 0.5 ** (1.0 / half_life)
    return 1.0


#: scikit-learn's words for a mini-batch run's early stop (printed with ``verbose``)
_CONVERGED = {
    "centroid-shift": "small centers change",
    "no-improvement": "lack of improvement in inertia",
}


class MiniBatchKMeans(_KMeansBase):
    """Mini-batch k-means on a Dask cluster, scikit-learn compatible.

    scikit-learn's algorithm and parameters: each step draws ``batch_size`` rows with
    replacement (in proportion to ``sample_weight`` where given), assigns them to the
    nearest centers and moves each center toward the mean of its batch rows with a
    per-center learning rate; centers whose accumulated weight falls below
    ``reassignment_ratio`` times the largest are moved to random batch rows. The same
    inputs and outputs as :class:`dkmeans.KMeans`; on Dask the steps run on the workers
    and the batches do not depend on the chunking. ``partial_fit`` with ``decay`` or
    ``half_life`` follows drifting streams.

    Read more in the :ref:`User Guide <guide-minibatch>`.

    Parameters
    ----------
    n_clusters : int, default 8
    init : {"k-means||", "k-means++", "random", "random-partition"}, callable or array-like, default "k-means||"
        Run on a sample of ``init_size`` rows (see :class:`dkmeans.KMeans` for the strategies).
        The default departs from scikit-learn's ``"k-means++"``, from which mini-batch steps
        often stay in a poor local minimum (see :ref:`guide-minibatch`).
    max_iter : int, default 100
        Maximum number of epochs (passes' worth of rows): ``max_iter * n_samples //
        batch_size`` steps at most.
    batch_size : int, default 4096
        Rows per step, drawn with replacement (scikit-learn's meaning; its default is 1024,
        which needed about three times the steps in the measurements of the guide).
    verbose : int or bool, default 0
        One line per step when > 0 (or True), and at an early stop scikit-learn's
        ``Converged (small centers change) at step i/n`` or ``Converged (lack of improvement
        in inertia) at step i/n``.
    compute_labels : bool, default True
        End with a pass over the data for ``labels_`` and ``inertia_``; else ``inertia_``
        is the smoothed batch objective times the data's weight and there is no ``labels_``.
    random_state : int, Generator, RandomState or None
    tol : float, default 0.0
        Stop when the squared change of the centers in a step is at most ``tol`` times the
        mean feature variance (0 disables the rule).
    max_no_improvement : int or None, default 10
        Stop after this many steps without improvement of the smoothed batch objective.
    init_size : int, optional
        Rows of the sample each initialisation runs on (default ``3 * batch_size``, at least
        ``3 * n_clusters``). Below ``n_clusters`` it becomes ``3 * n_clusters`` with
        scikit-learn's ``RuntimeWarning``.
    n_init : "auto" or int, default "auto"
        Initialisations (each on its own sample), the best on a further sample is kept;
        "auto": 1 for "k-means++" and given centers, 3 otherwise (scikit-learn's rule for
        "random" and a callable, and for the default "k-means||").
    reassignment_ratio : float, default 0.01
    decay : float in [0, 1], optional
        Forgetting for streams (Spark ``StreamingKMeans``'s ``decayFactor``): before a
        batch, every center's count ``n`` becomes ``a n`` with ``a = decay`` per
        ``time_unit``. 1 (or None) is scikit-learn's rule; 0 forgets everything before the
        batch. See :ref:`guide-minibatch`.
    half_life : float, optional
        Instead of ``decay``: the time units after which past data has half its weight,
        ``a = 0.5 ** (1 / half_life)``.
    time_unit : {"batches", "points"}, default "batches"
        ``"batches"``: the discount is ``a`` per batch; ``"points"``: ``a ** m`` for a
        batch of ``m`` rows (Spark's two units).
    checkpoint : str or path-like, optional
        A checkpoint file (exactly this path): the fit writes its state there after the
        initialisation, every ``checkpoint_every`` steps and at the end of the run. If the
        file exists when ``fit`` starts, the fit continues the run, ending with the same
        result as an uninterrupted fit. A checkpoint of another job is refused with
        :class:`dkmeans.io.checkpoint.CheckpointError` naming what differs. ``partial_fit``
        does not use it. See :ref:`guide-long-jobs`.
    checkpoint_every : int, default 100
        Mini-batch steps between checkpoint writes (out of core: at least this many,
        written when the state comes back between groups of chunks).
    out_of_core : {"auto", True, False}, default "auto"
        As :class:`dkmeans.KMeans`: persist the data when it fits the cluster's memory,
        else stream it (the sequential mode above).
    device : {None, "cpu", "gpu"}, default None
    missing : {"error", "skip"}, default "error"
        As :class:`dkmeans.KMeans`: rows with a missing value raise, or are left out of the
        fit (``partial_fit`` too) and labelled -1 by ``predict``.

    Attributes
    ----------
    cluster_centers_, labels_, inertia_, n_features_in_, feature_names_in_
        As scikit-learn's.
    n_iter_ : int
        Epochs run, at most ``max_iter``: ``ceil(n_steps_ * batch_size / n_samples)`` as in
        scikit-learn (out of core: the sequential passes begun); the initialisation steps nothing.
    n_steps_ : int
        Mini-batch steps run (over all ``partial_fit`` calls too).
    history_ : list of dict
        Per step: its batch objective (per row), the smoothed objective, center shift,
        reassigned centers and seconds (``algorithm="minibatch"``).
    stop_reason_ : {"no-improvement", "centroid-shift", "max_iter"}
    data_mode_, n_passes_
        As :class:`dkmeans.KMeans`.

    Examples
    --------
    >>> from dkmeans import MiniBatchKMeans
    >>> mbk = MiniBatchKMeans(n_clusters=3, batch_size=256, random_state=0)   # doctest: +SKIP
    >>> mbk.fit(X).cluster_centers_                                            # doctest: +SKIP
    >>> for batch in stream:                                                   # doctest: +SKIP
    ...     mbk.partial_fit(batch)
    """

    _metric = "euclidean"

    def __init__(
        self,
        n_clusters=8,
        *,
        init="k-means||",
        max_iter=100,
        batch_size=DEFAULT_BATCH_SIZE,
        verbose=0,
        compute_labels=True,
        random_state=None,
        tol=0.0,
        max_no_improvement=10,
        init_size=None,
        n_init="auto",
        reassignment_ratio=0.01,
        decay=None,
        half_life=None,
        time_unit="batches",
        checkpoint=None,
        checkpoint_every=100,
        out_of_core="auto",
        device=None,
        missing="error",
    ):
        self.n_clusters = n_clusters
        self.init = init
        self.max_iter = max_iter
        self.batch_size = batch_size
        self.verbose = verbose
        self.compute_labels = compute_labels
        self.random_state = random_state
        self.tol = tol
        self.max_no_improvement = max_no_improvement
        self.init_size = init_size
        self.n_init = n_init
        self.reassignment_ratio = reassignment_ratio
        self.decay = decay
        self.half_life = half_life
        self.time_unit = time_unit
        self.checkpoint = checkpoint
        self.checkpoint_every = checkpoint_every
        self.out_of_core = out_of_core
        self.device = device
        self.missing = missing

    def _fit_spec(self, warn_init: bool = True) -> FitSpec:
        p = self._checked_params()
        init = self.init
        is_array = hasattr(init, "__array__") or isinstance(init, (list, tuple))
        decay = resolve_decay(p["decay"], p["half_life"], p["time_unit"])
        n_init = p["n_init"]
        if n_init == "auto":
            n_init = 1 if (isinstance(init, str) and init == "k-means++") or is_array else 3
        if is_array and not isinstance(init, str) and n_init > 1:
            if warn_init:
                warnings.warn(
                    "Explicit initial center position passed: performing only one init in "
                    f"{type(self).__name__} instead of n_init={n_init}.",
                    RuntimeWarning,
                    stacklevel=3,
                )
            n_init = 1
        if is_array:
            init = np.asarray(init)
        return FitSpec(
            n_clusters=p["n_clusters"],
            init=init,
            n_init=n_init,
            max_iter=p["max_iter"],
            tol=p["tol"],
            stop_rule="centroid-shift",
            tol_relative=True,
            algorithm="minibatch",
            local_search=False,
            init_options=init_options(),
            random_state=self.random_state,
            out_of_core=p["out_of_core"],
            checkpoint=p["checkpoint"],
            checkpoint_every=p["checkpoint_every"],
            on_iteration=_progress_for(p["verbose"], p["max_iter"]),
            job={"estimator": "dkmeans.MiniBatchKMeans", "params": self._job_params()},
            minibatch=minibatch_options(
                batch_size=p["batch_size"],
                max_no_improvement=p["max_no_improvement"],
                reassignment_ratio=p["reassignment_ratio"],
                decay=decay,
                time_unit=p["time_unit"],
            ),
            init_size=p["init_size"],
            compute_labels=p["compute_labels"],
        )

    def _fit(self, X, sample_weight, spec: FitSpec):
        dataset = self._fit_dataset(X)
        result = _service.run_fit(spec, dataset, sample_weight)
        _finish_progress(spec)
        if self.verbose and result.stop_reason in _CONVERGED:
            n_steps = result.minibatch_state.n_steps
            of = ""
            if dataset.n_rows is not None:
                b = min(spec.minibatch.batch_size, dataset.n_rows)
                total = (
                    spec.max_iter * (-(-dataset.n_rows // b))
                    if result.data_mode == "out-of-core"
                    else (spec.max_iter * dataset.n_rows) // b
                )
                of = f"/{total}"
            print(f"Converged ({_CONVERGED[result.stop_reason]}) at step {n_steps}{of}", flush=True)
        self.cluster_centers_ = result.centroids
        if result.labels is not None:
            self.labels_ = result.labels
        elif hasattr(self, "labels_"):
            del self.labels_
        self._n_features_out = result.centroids.shape[0]
        self.inertia_ = result.objective
        self.n_iter_ = result.n_iter
        self.n_steps_ = result.minibatch_state.n_steps
        self.history_ = history_dicts(result.history)
        self.stop_reason_ = result.stop_reason
        self.data_mode_ = result.data_mode
        self.n_passes_ = result.n_passes
        self._loop_modes = list(
            result.loop_modes
        )  # how the engine ran the steps (one-task, spmd, graph)
        self._stream = result.minibatch_state  # partial_fit continues from here
        self._counts = result.minibatch_state.counts
        self._seed = resolve_seed(self.random_state)
        self._batch_size = spec.minibatch.batch_size
        return self

    def partial_fit(self, X, y=None, sample_weight=None):
        """Update the centers with one batch ``X`` (one mini-batch step), as scikit-learn does.

        ``X`` may be a NumPy array, a SciPy sparse matrix (CSR), a pandas DataFrame, a CuPy
        array (the step runs in host memory, ``labels_`` is CuPy), or a Dask array or Dask
        DataFrame (a partition: it is computed here, so it must fit in memory). The first call
        initialises the centers from ``X``. With ``decay`` or ``half_life`` the centers
        follow a drifting stream (see the class docstring). ``labels_`` and ``inertia_``
        are those of this batch when ``compute_labels``.

        Parameters
        ----------
        X : {array-like, sparse matrix, DataFrame, Dask array} of shape (n_samples, n_features)
            One batch of rows.
        y : ignored
            Not used, present for scikit-learn's API.
        sample_weight : array-like of shape (n_samples,), optional
            Weights of the batch's rows.

        Returns
        -------
        self : MiniBatchKMeans
            The updated estimator.
        """
        spec = self._fit_spec(warn_init=not hasattr(self, "cluster_centers_"))
        if _inputs.is_dask_collection(X):
            X = X.compute()
        if _inputs.is_dask_collection(sample_weight):
            sample_weight = sample_weight.compute()
        first = not hasattr(self, "cluster_centers_")
        on_gpu = _inputs.is_cupy_array(X)
        if on_gpu:  # a batch steps in host memory (it is small); its labels go back to the GPU
            X, sample_weight = _inputs.to_host(X), _inputs.to_host(sample_weight)
        batch = self._fit_dataset(X, reset=first, in_memory=True).local  # the one dataset check
        if batch is None:
            raise DataTypeError(
                "partial_fit takes rows in memory (NumPy, SciPy CSR, pandas, CuPy, or a Dask "
                f"collection it computes), got {type(X).__name__}"
            )
        X = batch
        step = _partial_fit.partial_fit_step(
            spec,
            X,
            sample_weight,
            random_state=self.random_state,
            compute_labels=self.compute_labels,
            stream=getattr(self, "_stream", None),
            seed=getattr(self, "_seed", None),
            batch_size=getattr(self, "_batch_size", None),
            centers=None if first else self.cluster_centers_,
            counts=getattr(self, "_counts", None),
        )
        state = self._stream = step.state
        self._seed, self._batch_size = step.seed, step.batch_size
        self._counts = state.counts
        self.cluster_centers_ = state.centroids.astype(X.dtype)
        self._n_features_out = self.cluster_centers_.shape[0]
        self.n_steps_ = state.n_steps
        self.n_iter_ = getattr(self, "n_iter_", 0)
        self.history_ = list(getattr(self, "history_", [])) + step.history
        if self.compute_labels:
            labels = _results.labels_on_device(step.labels) if on_gpu else step.labels
            self.labels_, self.inertia_ = labels, step.inertia
        return self


__all__ = ["MiniBatchKMeans", "resolve_decay"]
