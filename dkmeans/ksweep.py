"""``dkmeans.sweep``: fit k-means for several values of k at once, every pass over the data serving them all.

(The module is ``dkmeans.ksweep``, so that the function ``dkmeans.sweep`` does not hide it.) The face of :func:`dkmeans.fit.sweep.run_sweep`: scikit-learn's words (``KMeans`` keywords) in,
one :class:`SweepResult` out, with the fitted :class:`~dkmeans.KMeans` of every k, the
objective curve, per-k metrics and a suggested k.
"""

from __future__ import annotations

import dataclasses
import logging
import numbers
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from dkmeans.drivers.streams import resolve_seed
from dkmeans.errors import InvalidParameterError
from dkmeans.estimator import KMeans, _record_line
from dkmeans.fit.sweep import run_sweep

logger = logging.getLogger("dkmeans")

#: The rule :func:`elbow` applies, as :attr:`SweepResult.rule` states it.
ELBOW_RULE = ("elbow of the objective curve: the k farthest below the straight line from the first to the last "
              "point, with k and the logarithm of the objective each scaled to [0, 1] (Kneedle on the log "
              "objective; the objective itself where one is 0); none where no point lies below that line")


def elbow(k_values, objectives) -> int | None:
    """The elbow of a decreasing objective curve (:data:`ELBOW_RULE`), or None.

    ``k`` and ``log(objective)`` are each scaled to [0, 1]; the elbow is the k whose point
    lies farthest below the chord from the first point to the last (the largest vertical
    gap, which is the largest distance to the chord: the chord's slope is fixed). The
    logarithm weighs each added cluster by the factor it cuts the objective by, so the
    last of several large relative drops (well separated clusters found) stands out from
    the slow tail after it; on the objective itself the tail's small absolute values hide
    that last drop (20,000 rows of 6 blobs, k = 2..10: the objective's elbow is 5, the log
    objective's 6). Where an objective is 0 (as many distinct rows as clusters) the objective
    itself is scaled. None for fewer than three values, a flat curve, or a curve with no
    point below the chord (straight or concave: no k after which clusters start to pay less).

    Parameters
    ----------
    k_values : sequence of int, increasing
    objectives : sequence of float
    """
    k = np.asarray(k_values, dtype=np.float64)
    f = np.asarray(objectives, dtype=np.float64)
    if k.size < 3 or not np.all(np.isfinite(f)) or f.max() == f.min():
        return None
    if f.min() > 0:
        f = np.log(f)
    x = (k - k[0]) / (k[-1] - k[0])
    y = (f - f.min()) / (f.max() - f.min())
    gap = (y[0] + (y[-1] - y[0]) * x) - y  # chord minus curve: positive below the chord
    best = int(np.argmax(gap))
    return int(k_values[best]) if gap[best] > 1e-12 else None


class _Progress:
    """One k's progress lines: logged (logger ``dkmeans``, INFO) with the k in front; printed with ``verbose``."""

    def __init__(self, k: int, verbose):
        self.k, self.verbose = k, verbose

    def __call__(self, record) -> None:
        line = f"k={self.k:<4d} {_record_line(record)}"
        logger.info(line)
        if self.verbose:
            print(line, file=sys.stdout, flush=True)


@dataclass
class SweepResult:
    """What :func:`sweep` found, per value of k (all mappings are keyed by k).

    Attributes
    ----------
    k_values : list of int
        Increasing.
    models : dict of int to KMeans
        The fitted model of each k: each is the model ``KMeans(n_clusters=k, random_state=
        random_state, **kmeans_params).fit(X)`` gives (see :func:`sweep`).
    objective : dict of int to float
        ``inertia_`` of each model.
    n_iter : dict of int to int
    passes : dict of int to int
        Passes over the data the single fit of that k makes (the first pass included).
    metrics : dict of int to dict
        Per-k metrics: the objective and :func:`dkmeans.metrics.cluster_scores`' Calinski-Harabasz,
        Davies-Bouldin, simplified silhouette and imbalance factor (two passes for every k together).
    suggested_k : int or None
        By :attr:`rule`.
    rule : str
        How ``suggested_k`` was chosen.
    n_passes : int
        Passes over the data the whole sweep made.
    data_mode : {"in-memory", "out-of-core"}
    seconds : float
        Wall time of the sweep.
    random_state : int
        The seed every k was fitted with.
    """

    k_values: list
    models: dict
    objective: dict
    n_iter: dict
    passes: dict
    metrics: dict
    suggested_k: int | None
    rule: str
    n_passes: int
    data_mode: str
    seconds: float
    random_state: int
    stop_reason: dict = field(default_factory=dict)

    def rows(self) -> list[dict]:
        """One dict per k: k, objective, n_iter, passes, stop_reason and the metrics."""
        return [{"k": k, "objective": self.objective[k], "n_iter": self.n_iter[k], "passes": self.passes[k],
                 "stop_reason": self.stop_reason.get(k),
                 **{name: value for name, value in self.metrics[k].items() if name != "objective"}}
                for k in self.k_values]

    def format_table(self) -> str:
        """The per-k table as text, with the suggested k and the passes made."""
        rows = self.rows()
        extra = [name for name in rows[0] if name not in ("k", "objective", "n_iter", "passes", "stop_reason")]
        head = f"{'k':>6}  {'objective':>14}  {'iterations':>10}  {'passes':>6}  {'stopped by':<16}" + "".join(
            f"  {name:>14}" for name in extra)
        lines = [head]
        for row in rows:
            mark = "  <- suggested" if row["k"] == self.suggested_k else ""
            lines.append(f"{row['k']:>6}  {row['objective']:>14.6e}  {row['n_iter']:>10}  {row['passes']:>6}  "
                         f"{str(row['stop_reason']):<16}" + "".join(f"  {_cell(row[n]):>14}" for n in extra) + mark)
        longest = max(self.passes.values())
        lines.append(f"suggested k: {self.suggested_k if self.suggested_k is not None else 'none'} ({self.rule})")
        lines.append(f"passes over the data: {self.n_passes} in all ({self.n_passes / longest:.2f}x the longest single "
                     f"fit's {longest}; fitted one by one: {sum(self.passes.values())})")
        return "\n".join(lines)

    def plot(self, path=None, ax=None):
        """The objective per k with the suggested k marked (:func:`dkmeans.plot.plot_sweep`; needs matplotlib).

        With ``path``: written there as a PNG (returns the path); else drawn on ``ax`` (or
        the current axes), which is returned.
        """
        from dkmeans.plot import plot_sweep, save_sweep_plot

        objectives = [self.objective[k] for k in self.k_values]
        if path is not None:
            return save_sweep_plot(path, self.k_values, objectives, self.suggested_k)
        return plot_sweep(self.k_values, objectives, self.suggested_k, ax=ax)


def _cell(value) -> str:
    return f"{value:.6g}" if isinstance(value, numbers.Real) else str(value)


def check_k_values(k_values) -> list[int]:
    """The values of k, increasing: integers >= 1, distinct, at least one."""
    if isinstance(k_values, (str, bytes)) or not hasattr(k_values, "__iter__"):
        raise InvalidParameterError(f"k_values must be a sequence of integers >= 1, got {k_values!r}")
    values = []
    for k in k_values:
        if isinstance(k, (bool, np.bool_)) or not isinstance(k, numbers.Integral) or k < 1:
            raise InvalidParameterError(f"k_values must hold integers >= 1, got {k!r}")
        values.append(int(k))
    if not values:
        raise InvalidParameterError("k_values is empty: give at least one value of k")
    if len(set(values)) != len(values):
        raise InvalidParameterError(f"k_values must be distinct, got {values}")
    return sorted(values)


def sweep(X, k_values, *, sample_weight=None, random_state=None, storage_options=None,
          **kmeans_params) -> SweepResult:
    """Fit k-means for every k of ``k_values`` on ``X``, every pass over the data serving all of them.

    Each k's fit runs as ``KMeans(n_clusters=k, random_state=random_state, **kmeans_params)``
    would run it, in a thread of its own; whenever each k waits on a pass over the data, one
    combined pass serves them all (:mod:`dkmeans.engine.shared_passes`). So the data is placed
    and checked once, and read about as many times as the longest single fit reads it, not the
    sum; each k's model is that single fit's model (the same centroids, labels and iterations;
    on persisted data up to float rounding, where a single fit's loop ran inside one task or
    SPMD and combined its sums in another order).

    Parameters
    ----------
    X : array-like, pandas or Dask DataFrame, Dask array, or a path
        As :meth:`KMeans.fit <dkmeans.KMeans.fit>` takes it, or a Parquet/CSV file, folder or
        glob as ``dkmeans fit`` takes it (every column must then be numeric; select columns
        with ``dd.read_parquet(path, columns=[...])`` otherwise).
    k_values : sequence of int
        Distinct values of k (``n_clusters``), each at most the number of rows.
    sample_weight : array-like or Dask array, optional
    storage_options : dict, optional
        When ``X`` is a path: options of its filesystem (fsspec; credentials, ``endpoint_url``),
        as :func:`dkmeans.engine.files.read_table` takes them.
    random_state : int, Generator, RandomState or None
        Resolved once to one seed that every k's fit uses (``SweepResult.random_state``):
        ``KMeans(n_clusters=k, random_state=result.random_state)`` refits any k alone.
    **kmeans_params
        Any other :class:`~dkmeans.KMeans` parameter, the same for every k (not
        ``n_clusters``; not ``checkpoint``; ``init`` a strategy name or a callable, not
        centroids).

    Returns
    -------
    SweepResult
        ``suggested_k`` by the elbow of the objective curve (:func:`elbow`, stated in
        ``rule``); per-k metrics with the cluster scores, which add two combined passes for
        every k together.

    Raises
    ------
    InvalidParameterError
        Bad ``k_values`` or parameters; a k larger than the rows (before any pass where the
        row count is known). An error in one k's fit stops the others; it is raised with a
        note naming the k.

    Examples
    --------
    >>> import dkmeans
    >>> result = dkmeans.sweep(X, [2, 4, 8, 16], random_state=0)      # doctest: +SKIP
    >>> result.suggested_k, result.n_passes                           # doctest: +SKIP
    >>> result.models[8].predict(X_new)                               # doctest: +SKIP
    >>> result.plot("sweep.png")                                      # doctest: +SKIP
    """
    ks = check_k_values(k_values)
    for name in ("n_clusters", "checkpoint"):
        if kmeans_params.get(name) is not None:
            raise InvalidParameterError(f"sweep takes no {name}: " + (
                "the values of k are k_values" if name == "n_clusters" else "a sweep is not checkpointed"))
    kmeans_params.pop("checkpoint", None)
    init = kmeans_params.get("init", "k-means||")
    if not isinstance(init, str) and not callable(init):
        raise InvalidParameterError("sweep: init must be a strategy name or a callable; initial centroids fit one k")
    t0 = time.perf_counter()
    if isinstance(X, (str, os.PathLike)):
        from dkmeans.engine.files import read_table
        from dkmeans.io.dataframe import select_columns

        X = select_columns(read_table(str(X), storage_options=storage_options), name=str(X))
    elif storage_options is not None:
        raise InvalidParameterError("storage_options applies to a path; pass them to the reader of X")
    seed = resolve_seed(random_state)
    verbose = kmeans_params.pop("verbose", 0)
    models = {k: KMeans(n_clusters=k, random_state=seed, verbose=verbose, **kmeans_params) for k in ks}
    template = models[ks[-1]]
    dataset = template._fit_dataset(X)  # validated once; records n_features_in_ and the feature names
    specs = [dataclasses.replace(models[k]._fit_spec(), on_iteration=_Progress(k, verbose)) for k in ks]
    run = run_sweep(specs, dataset, sample_weight)
    for k, spec, fit in zip(ks, specs, run.fits):
        model = models[k]
        for name in ("n_features_in_", "feature_names_in_"):
            if hasattr(template, name):
                setattr(model, name, getattr(template, name))
        model._fitted(fit.result, spec)
    objective = {k: float(models[k].inertia_) for k in ks}
    return SweepResult(
        k_values=ks, models=models, objective=objective, n_iter={k: int(models[k].n_iter_) for k in ks},
        passes={k: int(fit.result.n_passes) for k, fit in zip(ks, run.fits)},
        metrics={k: dict(fit.metrics) for k, fit in zip(ks, run.fits)},
        suggested_k=elbow(ks, [objective[k] for k in ks]), rule=ELBOW_RULE, n_passes=run.n_passes,
        data_mode=run.data_mode, seconds=time.perf_counter() - t0, random_state=seed,
        stop_reason={k: models[k].stop_reason_ for k in ks},
    )


__all__ = ["ELBOW_RULE", "SweepResult", "check_k_values", "elbow", "sweep"]
