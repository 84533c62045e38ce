"""``dkmeans.sweep``: fit k-means for several values of k at once, every pass over the data serving them all.

(The module is ``dkmeans.ksweep``, so that the function ``dkmeans.sweep`` does not hide it.) The
face of :func:`dkmeans.fit.sweep.run_sweep`: scikit-learn's words (``KMeans`` keywords) in,
one :class:`SweepResult` out, with the fitted :class:`~dkmeans.KMeans` of every k, the
objective curve, per-k metrics, every rule's k and a suggested k (:mod:`dkmeans.fit.krules`).
"""

from __future__ import annotations

import dataclasses
import html
import numbers
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dkmeans import _callbacks
from dkmeans.errors import InvalidParameterError
from dkmeans.estimator import KMeans
from dkmeans.fit.gap import ReferenceCurve
from dkmeans.fit.krules import RULE_TEXT, Scores, answers, elbow, suggest
from dkmeans.fit.options import resolve_seed
from dkmeans.fit.progress import Progress
from dkmeans.fit.sweep import run_sweep, score_centroids

#: The rule :func:`elbow` applies (one of the rules in :attr:`SweepResult.answers`).
ELBOW_RULE = RULE_TEXT["elbow"]
#: How :func:`sweep` fits the values of k.
METHODS = ("refit", "bisecting")


def _k_progress(k: int, verbose, tasks) -> Progress:
    """One k's progress: its lines logged (logger ``dkmeans``, INFO) with the k in front and
    printed with ``verbose``; its events to the k's task tree (scikit-learn's callbacks)."""
    progress = Progress(verbose)
    progress.prefix = f"k={k:<4d} "
    progress.tasks = tasks
    return progress


@dataclass
class SweepResult:
    """What :func:`sweep` found, per value of k (all mappings are keyed by k).

    Read more in the :ref:`User Guide <guide-sweep>`.

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
        By ``rule``; None where the data shows no clear k (no cluster structure by the
        gap statistic, or no rule finds a k).
    rule : str
        How ``suggested_k`` was chosen, and why.
    n_passes : int
        Passes over the data the whole sweep made.
    data_mode : {"in-memory", "out-of-core"}
    seconds : float
        Wall time of the sweep.
    random_state : int
        The seed every k was fitted with.
    stop_reason : dict of int to str
    answers : dict of str to int or None
        Every rule's k (``dkmeans.fit.krules.RULE_TEXT`` says what each does): ``elbow``,
        ``calinski_harabasz``, ``davies_bouldin``, ``silhouette``, ``gap``, ``bic``.
    scores : Scores
        The per-k criteria the rules read (``dkmeans.fit.krules.Scores``), with the gap at
        k = 1.
    reference : ReferenceCurve or None
        The gap statistic's reference fits (``dkmeans.fit.gap.ReferenceCurve``: per k the
        mean and spread of their log objective, the passes they made); None without reference
        draws (``reference_draws=0``) or for cosine.
    method : {"refit", "bisecting"}
        How the values of k were fitted (:func:`sweep`'s ``method``).
    tree : BisectingKMeans or None
        With ``method="bisecting"``: the one bisecting fit whose first ``k - 1`` splits gave
        each k's centroids (``tree.cluster_centers_at(k)``, ``tree.inertia_per_k_``).
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
    answers: dict = field(default_factory=dict)
    scores: Scores | None = None
    reference: ReferenceCurve | None = None
    method: str = "refit"
    tree: Any = None

    def rows(self) -> list[dict]:
        """One dict per k: k, objective, n_iter, passes, stop_reason and the metrics."""
        return [
            {
                "k": k,
                "objective": self.objective[k],
                "n_iter": self.n_iter[k],
                "passes": self.passes[k],
                "stop_reason": self.stop_reason.get(k),
                **{name: value for name, value in self.metrics[k].items() if name != "objective"},
            }
            for k in self.k_values
        ]

    def format_table(self) -> str:
        """The per-k table as text, with the suggested k and the passes made."""
        rows = self.rows()
        extra = [
            name
            for name in rows[0]
            if name not in ("k", "objective", "n_iter", "passes", "stop_reason")
        ]
        head = (
            f"{'k':>6}  {'objective':>14}  {'iterations':>10}  {'passes':>6}  {'stopped by':<16}"
            + "".join(f"  {name:>14}" for name in extra)
        )
        lines = [head]
        for row in rows:
            mark = "  <- suggested" if row["k"] == self.suggested_k else ""
            lines.append(
                f"{row['k']:>6}  {row['objective']:>14.6e}  {row['n_iter']:>10}  {row['passes']:>6}  "
                f"{str(row['stop_reason']):<16}"
                + "".join(f"  {_cell(row[n]):>14}" for n in extra)
                + mark
            )
        longest = max(self.passes.values())
        lines.append(
            f"suggested k: {self.suggested_k if self.suggested_k is not None else 'none'} ({self.rule})"
        )
        if self.answers:
            lines.append(
                "each rule's k: "
                + ", ".join(
                    f"{name} {'none' if k is None else k}" for name, k in self.answers.items()
                )
            )
        if self.method == "bisecting":
            refit = "" if self.suggested_k is None else f", the refit of k = {self.suggested_k}"
            lines.append(
                f"passes over the data: {self.n_passes} in all (one bisecting fit of "
                f"{longest} passes for every k, the scores{refit})"
            )
        else:
            lines.append(
                f"passes over the data: {self.n_passes} in all "
                f"({self.n_passes / longest:.2f}x the longest single fit's {longest}; "
                f"fitted one by one: {sum(self.passes.values())})"
            )
        return "\n".join(lines)

    def plot(self, path=None, ax=None):
        """The objective per k with the suggested k marked (:func:`dkmeans.plot.plot_sweep`; needs matplotlib).

        With ``path``: written there as a PNG (returns the path). With ``ax``: drawn on it
        (returns it). Else a new :class:`~matplotlib.figure.Figure`, returned (a notebook
        shows it once, as the cell's value).

        Parameters
        ----------
        path : str or path-like, optional
            A PNG file to write.
        ax : matplotlib.axes.Axes, optional
            Where to draw when no ``path`` is given.

        Returns
        -------
        path, matplotlib.axes.Axes or matplotlib.figure.Figure
            The file written, the axes drawn on, or the new Figure.
        """
        from dkmeans.plot import plot_sweep, save_sweep_plot

        objectives = [self.objective[k] for k in self.k_values]
        if path is not None:
            return save_sweep_plot(path, self.k_values, objectives, self.suggested_k)
        return plot_sweep(self.k_values, objectives, self.suggested_k, ax=ax)

    def _repr_html_(self) -> str:
        """A notebook's view: the per-k table (the suggested k marked) and the objective curve."""
        rows = self.rows()
        shown = ("k", "objective", "n_iter", "passes", "stop_reason")
        extra = [name for name in rows[0] if name not in shown]
        heads = ["k", "objective", "iterations", "passes", "stopped by", *extra]
        body = []
        for row in rows:
            mark = row["k"] == self.suggested_k
            style = ' style="font-weight:bold;background:#e8f0fe"' if mark else ""
            cells = [
                row["k"],
                f"{row['objective']:.6e}",
                row["n_iter"],
                row["passes"],
                row["stop_reason"],
                *(_cell(row[n]) for n in extra),
            ]
            body.append(
                f"<tr{style}>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>"
            )
        longest = max(self.passes.values())
        suggested = "none" if self.suggested_k is None else self.suggested_k
        curve = [self.objective[k] for k in self.k_values]
        figure = _sweep_svg(self.k_values, curve, self.suggested_k)
        rule = html.escape(self.rule)
        return (
            f"<div><p><b>dkmeans.SweepResult</b>: k = {html.escape(str(self.k_values))}, "
            f'suggested k = <b>{suggested}</b> (<span title="{rule}">why</span>); '
            f"{self.n_passes} passes over the data ({self.n_passes / longest:.2f}x the longest "
            f"single fit's {longest}), {html.escape(self.data_mode)}, {self.seconds:.1f} s</p>"
            + (f"<div>{figure}</div>" if figure else "")
            + "<table><thead><tr>"
            + "".join(f"<th>{html.escape(h)}</th>" for h in heads)
            + "</tr></thead><tbody>"
            + "".join(body)
            + "</tbody></table></div>"
        )


def _sweep_svg(k_values, objectives, suggested_k) -> str | None:
    """The objective curve as inline SVG; None without matplotlib (the table alone is shown)."""
    try:
        from dkmeans.plot import sweep_svg
    except ImportError:  # pragma: no cover - the module imports nothing optional at its top
        return None
    return sweep_svg(k_values, objectives, suggested_k)


def _cell(value) -> str:
    return f"{value:.6g}" if isinstance(value, numbers.Real) else str(value)


def check_k_values(k_values) -> list[int]:
    """The values of k, increasing: integers >= 1, distinct, at least one."""
    if isinstance(k_values, (str, bytes)) or not hasattr(k_values, "__iter__"):
        raise InvalidParameterError(
            f"k_values must be a sequence of integers >= 1, got {k_values!r}"
        )
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


def sweep(
    X,
    k_values,
    *,
    sample_weight=None,
    random_state=None,
    storage_options=None,
    reference_draws: int = 5,
    reference_rows: int = 20_000,
    silhouette_rows: int = 2_000,
    method: str = "refit",
    callbacks=None,
    **kmeans_params,
) -> SweepResult:
    """Fit k-means for every k of ``k_values`` on ``X``, every pass over the data serving all of them.

    Read more in the :ref:`User Guide <guide-sweep>`.

    Each k's fit runs as ``KMeans(n_clusters=k, random_state=random_state, **kmeans_params)``
    would run it, in a thread of its own; whenever each k waits on a pass over the data, one
    combined pass serves them all (``dkmeans.engine.shared_passes``). So the data is placed
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
    reference_draws : int, default 5
        Reference data sets of the gap statistic (uniform in the data's principal box, made
        inside the passes, keyed by row index); 0: no gap (then no "no clear k" either). The
        gap is Euclidean: none for ``metric="cosine"`` or sparse data.
    reference_rows : int, default 20,000
        Rows of each reference data set (those of the first global row indices).
    silhouette_rows : int, default 2,000
        Rows of the sample every k's silhouette is computed on (one pass, then scikit-learn's
        ``silhouette_score`` on the caller, O(silhouette_rows^2) per k); 0: no silhouette.
    method : {"refit", "bisecting"}, default "refit"
        ``"refit"``: a k-means fit of every k, sharing their passes (``models`` holds every
        k). ``"bisecting"``: one :class:`~dkmeans.BisectingKMeans` fit to the largest k
        (``BisectingKMeans(max(k_values), random_state=random_state)``; Euclidean, dense
        rows) gives the centroids of every k, its first ``k - 1`` splits; each k is scored with
        every row at its nearest centroid (the objective, the indices, the gap and the
        silhouette of those labels, in shared passes), the rules choose k on those scores, and
        only the suggested k is fitted again with ``KMeans(n_clusters=k, random_state=
        random_state, **kmeans_params)`` (``models`` holds that one fit; none for no clear k).
        Faster where many k are swept; the suggestion agrees with ``"refit"``'s on most sets
        of ``benchmarks/choose_k.py`` (see the User Guide for the figures).
    callbacks : sequence of scikit-learn callbacks, optional
        ``sklearn.callback`` objects (``ProgressBar()``, ``ScoringMonitor(...)``; scikit-learn
        1.9 or later) for the sweep's task tree: ``sweep``, one ``k=<k>`` task per k, and under
        each the k's fit as :meth:`KMeans.fit <dkmeans.KMeans.fit>` reports it (auto-propagated
        callbacks such as ``ProgressBar`` reach it). A stop request ends that k's run or runs
        as in a single fit. See the :ref:`notebooks guide <guide-notebooks>`.
    **kmeans_params
        Any other :class:`~dkmeans.KMeans` parameter, the same for every k (not
        ``n_clusters``; not ``checkpoint``; ``init`` a strategy name or a callable, not
        centroids).

    Returns
    -------
    SweepResult
        ``suggested_k`` by ``dkmeans.fit.krules.suggest``, its reason in ``rule``: None
        ("no clear k") where the gap statistic finds the data no more clustered than uniform
        data, else the k most of Calinski-Harabasz, Davies-Bouldin, the elbow and the gap rule
        choose (the rule that ``benchmarks/choose_k.py`` measured best); every rule's own k in
        ``answers``. The cluster scores add two combined passes for every k together; the gap's
        reference fits and the silhouette's sample ride the fits' passes (the sweep makes more
        passes only where the reference fits take longer than the longest k's fit).

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
    if method not in METHODS:
        raise InvalidParameterError(
            f"method must be one of {', '.join(map(repr, METHODS))}, got {method!r}"
        )
    counts = (
        ("reference_draws", reference_draws, 0),
        ("reference_rows", reference_rows, 1),
        ("silhouette_rows", silhouette_rows, 0),
    )
    for name, value, low in counts:
        integral = isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))
        if not integral or value < low:
            raise InvalidParameterError(f"{name} must be an integer >= {low}, got {value!r}")
    for name in ("n_clusters", "checkpoint"):
        if kmeans_params.get(name) is not None:
            raise InvalidParameterError(
                f"sweep takes no {name}: "
                + (
                    "the values of k are k_values"
                    if name == "n_clusters"
                    else "a sweep is not checkpointed"
                )
            )
    kmeans_params.pop("checkpoint", None)
    init = kmeans_params.get("init", "k-means||")
    if not isinstance(init, str) and not callable(init):
        raise InvalidParameterError(
            "sweep: init must be a strategy name or a callable; initial centroids fit one k"
        )
    t0 = time.perf_counter()
    if isinstance(X, (str, os.PathLike)):
        from dkmeans.fit.tables import read_table, select_columns

        X = select_columns(read_table(str(X), storage_options=storage_options), name=str(X))
    elif storage_options is not None:
        raise InvalidParameterError(
            "storage_options applies to a path; pass them to the reader of X"
        )
    seed = resolve_seed(random_state)
    verbose = kmeans_params.pop("verbose", 0)
    if method == "bisecting":
        if callbacks:
            raise InvalidParameterError(
                "callbacks report the fits of method='refit'; "
                "method='bisecting' reports with verbose only"
            )
        return _bisecting_sweep(
            X,
            ks,
            seed,
            t0,
            sample_weight,
            verbose,
            kmeans_params,
            reference_draws=reference_draws,
            reference_rows=reference_rows,
            silhouette_rows=silhouette_rows,
        )
    models = {
        k: KMeans(n_clusters=k, random_state=seed, verbose=verbose, **kmeans_params) for k in ks
    }
    template = models[ks[-1]]
    dataset = template._fit_dataset(
        X
    )  # validated once; records n_features_in_ and the feature names
    runs = template._fit_spec().n_init
    tasks = _callbacks.SweepTasks.start(callbacks, models, X, sample_weight, runs)
    fitted = False
    try:
        specs = []
        for k in ks:
            progress = _k_progress(k, verbose, tasks.fits[k] if tasks is not None else None)
            hooks = {name: hook for name, hook in progress.hooks().items() if name != "on_pass"}
            specs.append(dataclasses.replace(models[k]._fit_spec(), **hooks))
        run = run_sweep(
            specs,
            dataset,
            sample_weight,
            reference_draws=reference_draws,
            reference_rows=reference_rows,
            silhouette_rows=silhouette_rows,
        )
        for k, spec, fit in zip(ks, specs, run.fits):
            model = models[k]
            for name in ("n_features_in_", "feature_names_in_"):
                if hasattr(template, name):
                    setattr(model, name, getattr(template, name))
            model._fitted(fit.result, spec)
            spec.on_iteration.finish()
        fitted = True
    finally:
        if tasks is not None:  # every task ended, the callbacks torn down (after an error too)
            tasks.close(fitted)
    objective = {k: float(models[k].inertia_) for k in ks}
    metrics = {k: dict(fit.metrics) for k, fit in zip(ks, run.fits)}
    scores = sweep_scores(ks, objective, metrics, run.reference)
    suggested, rule = suggest(scores)
    return SweepResult(
        k_values=ks,
        models=models,
        objective=objective,
        n_iter={k: int(models[k].n_iter_) for k in ks},
        passes={k: int(fit.result.n_passes) for k, fit in zip(ks, run.fits)},
        metrics=metrics,
        suggested_k=suggested,
        rule=rule,
        n_passes=run.n_passes,
        data_mode=run.data_mode,
        seconds=time.perf_counter() - t0,
        random_state=seed,
        stop_reason={k: models[k].stop_reason_ for k in ks},
        answers=answers(scores),
        scores=scores,
        reference=run.reference,
    )


def _bisecting_sweep(
    X, ks, seed: int, t0: float, sample_weight, verbose, kmeans_params, **counts
) -> SweepResult:
    """``sweep(method="bisecting")``: every k from one bisecting fit, the suggested k refitted."""
    from dkmeans.bisecting_estimator import BisectingKMeans

    if kmeans_params.get("metric", "euclidean") != "euclidean":
        raise InvalidParameterError(
            "method='bisecting' is Euclidean: bisecting k-means has no "
            f"metric={kmeans_params['metric']!r}; use method='refit'"
        )
    out_of_core = kmeans_params.get("out_of_core", "auto")
    template = KMeans(n_clusters=ks[-1], random_state=seed, **kmeans_params)
    dataset = template._fit_dataset(X)  # checks the KMeans parameters too, before any fit
    tree = BisectingKMeans(ks[-1], random_state=seed, out_of_core=out_of_core, verbose=verbose)
    tree.fit(X, sample_weight=sample_weight)
    centroids = {k: tree.cluster_centers_at(k) for k in ks}
    scored = score_centroids(
        centroids, dataset, sample_weight, seed=seed, out_of_core=out_of_core, **counts
    )
    objective = {k: float(scored.metrics[k]["objective"]) for k in ks}
    scores = sweep_scores(ks, objective, scored.metrics, scored.reference)
    suggested, rule = suggest(scores)
    models, n_passes = {}, tree.n_passes_ + scored.n_passes
    if suggested is not None:
        model = KMeans(n_clusters=suggested, random_state=seed, verbose=verbose, **kmeans_params)
        models[suggested] = model.fit(X, sample_weight=sample_weight)
        n_passes += model.n_passes_
    return SweepResult(
        k_values=ks,
        models=models,
        objective=objective,
        n_iter={k: int(tree.n_iter_) for k in ks},
        passes={k: int(tree.n_passes_) for k in ks},
        metrics=scored.metrics,
        suggested_k=suggested,
        rule=rule,
        n_passes=int(n_passes),
        data_mode=scored.data_mode,
        seconds=time.perf_counter() - t0,
        random_state=seed,
        stop_reason={k: "bisecting tree" for k in ks},
        answers=answers(scores),
        scores=scores,
        reference=scored.reference,
        method="bisecting",
        tree=tree,
    )


def sweep_scores(ks, objective: dict, metrics: dict, reference=None) -> Scores:
    """The rules' ``Scores`` (``dkmeans.fit.krules``) from a sweep's per-k objective and metrics."""

    def column(name):
        return [float(metrics[k].get(name, float("nan"))) for k in ks]

    gap_at_1 = sd_at_1 = float("nan")
    if reference is not None:
        gap_at_1 = reference.gap(1, reference.total_scatter)
        sd_at_1 = reference.sd_log[1] * float(np.sqrt(1 + 1 / reference.draws))
    return Scores(
        ks=list(ks),
        objective=[objective[k] for k in ks],
        calinski_harabasz=column("calinski_harabasz"),
        davies_bouldin=column("davies_bouldin"),
        silhouette=column("silhouette"),
        bic=column("bic"),
        gap=column("gap"),
        gap_sd=column("gap_sd"),
        gap_at_1=gap_at_1,
        gap_sd_at_1=sd_at_1,
    )


__all__ = [
    "ELBOW_RULE",
    "METHODS",
    "SweepResult",
    "check_k_values",
    "elbow",
    "sweep",
    "sweep_scores",
]
