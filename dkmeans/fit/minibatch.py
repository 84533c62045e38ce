"""The mini-batch fit service: ``MiniBatchKMeans.fit``, its ``partial_fit`` and the out-of-core pass."""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
from threadpoolctl import threadpool_limits

from dkmeans.drivers import init as init_strategies
from dkmeans.drivers.minibatch import (
    MiniBatchOptions,
    advance,
    gather_rows,
    minibatch,
    minibatch_pass,
    step_rng,
)
from dkmeans.drivers.state import MiniBatchState, PassState, RunSummary
from dkmeans.drivers.streams import STREAMS, derive_seed
from dkmeans.engine.local import ChunkList
from dkmeans.engine.sparse_rows import is_sparse_array
from dkmeans.errors import NON_FINITE_INPUT, InvalidDataError
from dkmeans.fit.checkpoint_job import checkpoint_job
from dkmeans.fit.first_pass import check_rows_when_placed, moments_chunk
from dkmeans.fit.inputs import Dataset, check_user_centroids
from dkmeans.fit.metric_inputs import prepare_centroids
from dkmeans.fit.results import FinalAssignment, final_assignment, fit_result
from dkmeans.fit.spec import FitResult, FitSpec
from dkmeans.kernels import assign_partials, column_moments, combine_moments, take_rows

# -- mini-batch --------------------------------------------------------------------------
#: stream of the initialisation samples' draws (apart from the batches')
MINIBATCH_INIT_STREAM = STREAMS["minibatch.init"]()


def _weight_sum_chunk(X, w, offset):
    return float(w.sum())


def minibatch_sizes(spec: FitSpec, n_rows: int) -> tuple[int, int]:
    """scikit-learn's ``(batch_size, init_size)`` for ``n_rows`` rows (and its warning for ``init_size < k``)."""
    b = min(spec.minibatch.batch_size, n_rows)
    size = spec.init_size
    if size is None:
        size = 3 * b if 3 * b >= spec.n_clusters else 3 * spec.n_clusters
    elif size < spec.n_clusters:
        warnings.warn(
            f"init_size={size} should be larger than n_clusters={spec.n_clusters}. Setting it to "
            "min(3*n_clusters, n_samples)",
            RuntimeWarning,
            stacklevel=2,
        )  # scikit-learn's words
        size = 3 * spec.n_clusters
    return b, min(size, n_rows)


def minibatch_init(spec: FitSpec, X, w, seed: int, run: int) -> np.ndarray:
    """Initial centers from the rows ``X`` (weights ``w``) of a sample, by the spec's strategy."""
    if not isinstance(spec.init, str) and not callable(spec.init):
        return np.asarray(spec.init)
    sample = ChunkList.from_array(X, w)
    if callable(spec.init):
        C = spec.init(X, spec.n_clusters, np.random.RandomState(derive_seed(seed, run) % 2**32))
        C = check_user_centroids(
            C, spec.n_clusters, X.shape[1], X.dtype, name="init (the callable's result)"
        )
    else:
        options = dataclasses.replace(spec.init_options, metric=spec.metric)
        # a sample of a few thousand rows, on the caller: scikit-learn's OpenMP threads (k-means||'
        # recluster) only contend with the workers there (several times slower on a busy host)
        with threadpool_limits(limits=1):
            C = init_strategies.get_strategy(spec.init)(
                sample, spec.n_clusters, derive_seed(seed, run), options
            )
    return prepare_centroids(C, spec.metric)


def fit_minibatch(
    spec: FitSpec, dataset: Dataset, data, C0, seed: int, client, searches: bool
) -> FitResult:
    """Mini-batch k-means on placed data (:mod:`dkmeans.drivers.minibatch`).

    Data in memory (persisted or in this process): scikit-learn's scheme. A pass of column
    moments (finiteness, the scale of ``tol``); ``n_init`` initialisations, each on its own
    uniform sample of ``init_size`` rows, of which the one with the lowest objective on a
    further sample is kept; then the steps on batches drawn with replacement. Out-of-core
    data: the initialisation (and the scale of ``tol``) from the first ``init_size`` rows,
    then one sequential pass in row order per epoch (``max_iter`` at most), so a single
    epoch reads the data once. Then the final assignment (``compute_labels``).

    With a checkpoint the run's state is saved after the initialisation, every
    ``checkpoint_every`` steps and at its end; a fit that finds its checkpoint skips the
    initialisation and continues the run (the checkpoint's job check reads the moments
    pass, or the first ``init_size`` rows out of core).
    """
    opts: MiniBatchOptions = spec.minibatch
    k = spec.n_clusters
    one_pass = not data.in_memory  # rows read from their source: one sequential pass
    try:
        n = data.n_rows
        check_rows_when_placed(spec, dataset, data)
        b, init_size = minibatch_sizes(spec, n)
        opts = dataclasses.replace(opts, batch_size=b)
        if one_pass:  # the stream's head: no pass of its own
            head = np.asarray(data.rows(np.arange(init_size)))
            if not np.all(np.isfinite(head)):
                raise InvalidDataError(NON_FINITE_INPUT)
            moments = column_moments(head)
            mean_variance = float(np.mean(np.var(head.astype(np.float64), axis=0)))
        else:
            head = None
            with np.errstate(invalid="ignore", over="ignore"):
                moments = data.map_reduce(moments_chunk, combine_moments)
                mean_variance = float(np.mean(moments.m2 / moments.count))
            if not math.isfinite(mean_variance):
                raise InvalidDataError(NON_FINITE_INPUT)
        # the two ways of drawing batches give different runs: a checkpoint never crosses over
        checkpointer, state = checkpoint_job(
            spec, data, moments, C0, seed, batches="sequential" if one_pass else "random"
        )
        if spec.on_run_start is not None:  # the fit's one run (its n_init are initialisations only)
            spec.on_run_start(0)
        if state.minibatch is None:
            centers = _minibatch_centers(spec, data, C0, state.seed, head, init_size)
            state.phase, state.minibatch = (
                "minibatch",
                PassState(MiniBatchState(centers, np.zeros(k))),
            )
            if checkpointer is not None:
                checkpointer.save(state)
        tol = spec.tol * (mean_variance if spec.tol_relative else 1.0)
        resume = state.minibatch
        checkpointing = dict(
            on_state=checkpointer.minibatch_hook(state) if checkpointer else None,
            state_every=checkpointer.every if checkpointer else None,
        )
        if one_pass:
            result = minibatch_pass(
                data,
                resume.run,
                seed=state.seed,
                options=opts,
                tol=tol,
                max_passes=max(1, spec.max_iter),
                n_total=n,
                on_step=spec.on_iteration,
                resume=resume,
                **checkpointing,
            )
        else:
            result = minibatch(
                data,
                resume.run,
                n_steps=(spec.max_iter * n) // b,
                seed=state.seed,
                options=opts,
                tol=tol,
                on_step=spec.on_iteration,
                resume=resume,
                **checkpointing,
            )
        if spec.on_run_end is not None:
            spec.on_run_end(0)
        # scikit-learn's epochs: steps' worth of rows; out of core, a pass of ceil(n / b) steps each
        if one_pass:
            n_epochs = math.ceil(result.n_steps / math.ceil(n / b))
        else:
            n_epochs = math.ceil(result.n_steps * b / n)
        centroids = result.centroids.astype(data.dtype)
        if spec.compute_labels:
            assignment = final_assignment(spec, dataset, data, client, centroids)
        else:
            total_weight = (
                float(data.map_reduce(_weight_sum_chunk, sum)) if data.has_weights else float(n)
            )
            ewa = result.state.ewa_objective
            objective = float("nan") if ewa is None else ewa * total_weight
            assignment = FinalAssignment(None, objective, data.passes)
    finally:
        data.release()
    run = RunSummary(
        centroids,
        assignment.objective,
        n_epochs,
        result.stop_reason,
        result.converged,
        list(result.history),
    )
    return fit_result(
        spec,
        dataset,
        data,
        run,
        assignment,
        with_labels=spec.compute_labels,
        minibatch_state=result.state,
    )


def _minibatch_centers(spec: FitSpec, data, C0, seed: int, head, init_size: int) -> np.ndarray:
    """A mini-batch run's initial centers (float64): ``C0``, or the best of ``n_init`` initialisations.

    In memory each initialisation runs on its own uniform sample of ``init_size`` rows
    and is scored on a further sample; out of core (``head`` given) all run on the head.
    """
    if C0 is not None:
        return np.asarray(C0, dtype=np.float64)
    if head is not None:
        samples, valid = [(head, None)] * spec.n_init, (head, None)
    else:
        rng = np.random.default_rng([seed, MINIBATCH_INIT_STREAM])
        draws = [rng.integers(0, data.n_rows, init_size) for _ in range(1 + spec.n_init)]
        rows, weights = gather_rows(data, np.concatenate(draws))  # one pass for all the samples
        if len(weights) and np.all(
            weights == weights[0]
        ):  # equal weights: the unweighted fit's samples
            weights = np.ones_like(weights)
        cut = np.cumsum([len(d) for d in draws])[:-1]
        parts = list(zip(np.split(rows, cut), np.split(weights, cut)))
        valid, samples = parts[0], parts[1:]
    best = None
    for run, (Xs, ws) in enumerate(samples):
        C = minibatch_init(spec, Xs.astype(data.dtype), ws, seed, run)
        score = float(
            assign_partials(valid[0].astype(data.dtype), C.astype(data.dtype), valid[1]).objective
        )
        if best is None or score < best[0]:
            best = (score, C)
    return np.asarray(best[1], dtype=np.float64)


def run_partial_fit(spec: FitSpec, X, sample_weight, state: MiniBatchState | None, seed: int):
    """One mini-batch step on the in-memory batch ``X`` (``partial_fit``); returns ``(state, record)``.

    Without ``state`` (the first batch) the centers are initialised from ``X`` first, on a
    sample of ``init_size`` of its rows as scikit-learn does. ``spec.minibatch.batch_size``
    is the batch size the reassignment schedule counts (scikit-learn's ``_batch_size``).
    The step's draws are keyed by ``(seed, step)``.
    """
    X = X if is_sparse_array(X) else np.asarray(X)  # sparse (CSR) rows are assigned as they are
    w = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    if w is not None and np.all(
        w == 1.0
    ):  # unit weights: exactly the unweighted step (and initialisation)
        w = None
    if state is None:
        _, init_size = minibatch_sizes(spec, X.shape[0])
        if not isinstance(spec.init, str) and not callable(spec.init):
            centers = check_user_centroids(
                spec.init, spec.n_clusters, X.shape[1], X.dtype, name="init"
            )
        else:
            rng = np.random.default_rng([seed, MINIBATCH_INIT_STREAM])
            idx = (
                rng.integers(0, X.shape[0], init_size)
                if init_size < X.shape[0]
                else np.arange(X.shape[0])
            )
            centers = minibatch_init(
                spec, take_rows(X, idx), None if w is None else w[idx], seed, 0
            )
        state = MiniBatchState(np.asarray(centers, dtype=np.float64), np.zeros(spec.n_clusters))
    partials = assign_partials(X, state.centroids.astype(X.dtype), w)
    rng = step_rng(seed, state.n_steps)
    state, record, _ = advance(
        state,
        partials,
        X.shape[0],
        spec.minibatch,
        rng,
        lambda p: take_rows(X, p),
        X.shape[0],
        0.0,
        check_stop=False,
    )
    return state, record
