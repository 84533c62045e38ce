"""Plots of a fit (matplotlib, an optional dependency: ``pip install 'dkmeans[plot]'``).

:func:`plot_history` draws the objective per iteration; :func:`plot_clusters` draws 2-D
data (or a 2-D projection on the first two principal axes) coloured by cluster, with the
centroids; :func:`plot_fit` draws both for a fitted model (``KMeans.plot``);
:func:`plot_sweep` draws the objective per k of a sweep (:func:`dkmeans.sweep`) with the
suggested k. :func:`save_fit_plot` and :func:`save_sweep_plot` write them to PNG files.

In a notebook
-------------
Nothing here changes matplotlib's backend or pyplot's state: ``%matplotlib inline`` (or
``widget``) stays as the user set it, and so does a script's backend (matplotlib picks Agg by
itself where there is no display).

Without ``ax``, a plotting function draws a new figure and returns the
:class:`~matplotlib.figure.Figure`: Jupyter shows it once, as the cell's value (end the line
with ``;`` or assign it to show nothing). Under the inline backend the figure is not left open
in pyplot, which would show it a second time when the cell ends; elsewhere (a window backend,
ipympl) it is an ordinary pyplot figure that ``plt.show()`` shows. With ``ax``, the function
draws on that axes and returns it, as matplotlib's own functions do: the figure is the
caller's, and shown as the caller's figures are. The ``save_*`` functions draw on figures of
their own that pyplot never sees (no window, nothing left open).
"""

from __future__ import annotations

import numpy as np

from dkmeans.errors import DKMeansError


def _matplotlib():
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise DKMeansError("plots need matplotlib: pip install 'dkmeans[plot]'") from exc
    return matplotlib


def _new_figure(**kwargs):
    """A new figure to return: a pyplot figure, closed at once under the inline backend (see the
    module docstring), so that Jupyter shows it once, as the cell's value."""
    matplotlib = _matplotlib()
    import matplotlib.pyplot as plt  # the user's backend (and Jupyter's figure display), unchanged

    fig = plt.figure(**kwargs)
    if "inline" in str(matplotlib.get_backend()).lower():
        plt.close(fig)  # still displayable; pyplot's end-of-cell display no longer shows it again
    return fig


def _offscreen_figure(**kwargs):
    """A figure pyplot never sees (to write to a file): no backend, no window, nothing left open."""
    _matplotlib()
    from matplotlib.figure import Figure

    return Figure(**kwargs)


def _projection(X, centroids):
    """2-D coordinates of X and the centroids: the data itself, or its first two principal axes."""
    X = np.asarray(X, dtype=np.float64)
    C = np.asarray(centroids, dtype=np.float64)
    if X.shape[1] <= 2:
        pad = lambda A: np.hstack([A, np.zeros((A.shape[0], 2 - A.shape[1]))])  # noqa: E731
        return pad(X), pad(C), ("feature 0", "feature 1")
    mean = X.mean(axis=0)
    _, _, vt = np.linalg.svd(X - mean, full_matrices=False)
    axes = vt[:2].T
    return (X - mean) @ axes, (C - mean) @ axes, ("principal axis 1", "principal axis 2")


def _draw_history(ax, history) -> None:
    rows = [h if isinstance(h, dict) else h.as_dict() for h in history]
    ax.plot(np.arange(1, len(rows) + 1), [r["objective"] for r in rows], marker="o")
    if rows and min(r["objective"] for r in rows) > 0:
        ax.set_yscale("log")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("step (Lloyd iterations, then swap rounds and Hartigan rounds if any)")
    ax.set_ylabel("objective (sum of squared distances)")
    ax.set_title("objective per iteration")


def _draw_clusters(ax, X, labels, centroids, max_points: int, seed: int) -> None:
    X = np.asarray(X)
    labels = np.asarray(labels)
    if len(X) > max_points:
        keep = np.random.default_rng(seed).choice(len(X), max_points, replace=False)
        X, labels = X[keep], labels[keep]
    P, Q, names = _projection(X, centroids)
    ax.scatter(P[:, 0], P[:, 1], c=labels, s=2, cmap="tab20", alpha=0.5)
    ax.scatter(Q[:, 0], Q[:, 1], c="black", marker="x", s=80, label="centroids")
    ax.set_xlabel(names[0])
    ax.set_ylabel(names[1])
    ax.set_title(f"{len(Q)} clusters")
    ax.legend(loc="best")


def _draw_sweep(ax, k_values, objectives, suggested_k) -> None:
    ax.plot(k_values, objectives, marker="o")
    if suggested_k is not None and suggested_k in list(k_values):
        ax.axvline(suggested_k, color="grey", linestyle="--", label=f"suggested k = {suggested_k}")
        ax.legend(loc="best")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("k (clusters)")
    ax.set_ylabel("objective (sum of squared distances)")
    ax.set_title("objective per k")


def plot_history(history, ax=None):
    """Objective per step (log scale) from ``KMeans.history_`` or ``TrainResult.history``.

    Steps are Lloyd iterations, local-search rounds and Hartigan rounds in the order they ran
    (each phase numbers its own records, so the position is the step).

    Parameters
    ----------
    history : list of dict or of records
        ``KMeans.history_``, ``TrainResult.history`` (or their records).
    ax : matplotlib.axes.Axes, optional
        Where to draw; default: a new Figure.

    Returns
    -------
    matplotlib.figure.Figure or matplotlib.axes.Axes
        A new Figure (a notebook shows it once, as the cell's value), or ``ax`` when given.
    """
    if ax is not None:
        _draw_history(ax, history)
        return ax
    fig = _new_figure(figsize=(6.4, 4.2))
    _draw_history(fig.add_subplot(), history)
    fig.tight_layout()
    return fig


def plot_clusters(X, labels, centroids, ax=None, max_points: int = 20_000, seed: int = 0):
    """Rows coloured by cluster (a random sample of at most ``max_points``) and the centroids.

    Data of more than two columns is drawn on its first two principal axes.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        The rows (in memory).
    labels : array-like of shape (n_samples,)
        Each row's cluster.
    centroids : array-like of shape (n_clusters, n_features)
        The centroids, drawn as crosses.
    ax : matplotlib.axes.Axes, optional
        Where to draw; default: a new Figure.
    max_points : int, default 20000
        The most rows drawn (a random sample of larger data).
    seed : int, default 0
        Seed of that sample.

    Returns
    -------
    matplotlib.figure.Figure or matplotlib.axes.Axes
        A new Figure (a notebook shows it once, as the cell's value), or ``ax`` when given.
    """
    if ax is not None:
        _draw_clusters(ax, X, labels, centroids, max_points, seed)
        return ax
    fig = _new_figure(figsize=(6.4, 5.0))
    _draw_clusters(fig.add_subplot(), X, labels, centroids, max_points, seed)
    fig.tight_layout()
    return fig


def plot_fit(history, X_sample=None, labels_sample=None, centroids=None, max_points: int = 20_000):
    """A fit's objective per step and, with rows given, its clusters beside it (a new Figure).

    ``KMeans.plot`` calls it with the model's history, centroids and a sample of the rows.

    Parameters
    ----------
    history : list of dict or of records
        The fit's history (as :func:`plot_history`).
    X_sample : array-like of shape (n_samples, n_features), optional
        Rows to draw beside the history (as :func:`plot_clusters`).
    labels_sample : array-like of shape (n_samples,), optional
        Their clusters.
    centroids : array-like of shape (n_clusters, n_features), optional
        The centroids.
    max_points : int, default 20000
        The most rows drawn.

    Returns
    -------
    matplotlib.figure.Figure
        The new Figure.
    """
    with_rows = X_sample is not None
    fig = _new_figure(figsize=(12, 5) if with_rows else (6.4, 4.2))
    _fill_fit(fig, history, X_sample, labels_sample, centroids, max_points)
    return fig


def _fill_fit(fig, history, X_sample, labels_sample, centroids, max_points: int = 20_000) -> None:
    if X_sample is None:
        _draw_history(fig.add_subplot(), history)
    else:
        left, right = fig.subplots(1, 2)
        _draw_history(left, history)
        _draw_clusters(right, X_sample, labels_sample, centroids, max_points, 0)
    fig.tight_layout()


def save_fit_plot(path, history, X_sample, labels_sample, centroids):
    """Write the objective history and the clusters side by side to ``path`` (PNG).

    Parameters
    ----------
    path : str or path-like
        The file to write.
    history : list of dict or of records
        The fit's history (as :func:`plot_history`).
    X_sample : array-like of shape (n_samples, n_features)
        Rows to draw (as :func:`plot_clusters`).
    labels_sample : array-like of shape (n_samples,)
        Their clusters.
    centroids : array-like of shape (n_clusters, n_features)
        The centroids.

    Returns
    -------
    str or path-like
        ``path``.
    """
    fig = _offscreen_figure(figsize=(12, 5))
    _fill_fit(fig, history, X_sample, labels_sample, centroids)
    fig.savefig(path, dpi=100)
    return path


def plot_sweep(k_values, objectives, suggested_k=None, ax=None):
    """The objective per k (a sweep's curve), the suggested k marked.

    Parameters
    ----------
    k_values : sequence of int
        The values of k (``SweepResult.k_values``).
    objectives : sequence of float
        The objective of each.
    suggested_k : int, optional
        Marked with a dashed line when given.
    ax : matplotlib.axes.Axes, optional
        Where to draw; default: a new Figure.

    Returns
    -------
    matplotlib.figure.Figure or matplotlib.axes.Axes
        A new Figure (a notebook shows it once, as the cell's value), or ``ax`` when given.
    """
    if ax is not None:
        _draw_sweep(ax, k_values, objectives, suggested_k)
        return ax
    fig = _new_figure(figsize=(6.4, 4.2))
    _draw_sweep(fig.add_subplot(), k_values, objectives, suggested_k)
    fig.tight_layout()
    return fig


def save_sweep_plot(path, k_values, objectives, suggested_k=None):
    """Write :func:`plot_sweep` to ``path`` (PNG).

    Parameters
    ----------
    path : str or path-like
        The file to write.
    k_values : sequence of int
        The values of k.
    objectives : sequence of float
        The objective of each.
    suggested_k : int, optional
        Marked with a dashed line when given.

    Returns
    -------
    str or path-like
        ``path``.
    """
    fig = _offscreen_figure(figsize=(7, 5))
    _draw_sweep(fig.add_subplot(), k_values, objectives, suggested_k)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def sweep_svg(k_values, objectives, suggested_k=None) -> str | None:
    """:func:`plot_sweep` as inline SVG (for ``SweepResult``'s HTML).

    Parameters
    ----------
    k_values : sequence of int
        The values of k.
    objectives : sequence of float
        The objective of each.
    suggested_k : int, optional
        Marked when given.

    Returns
    -------
    str or None
        The ``<svg>`` element, or None without matplotlib.
    """
    try:
        fig = _offscreen_figure(figsize=(5.5, 3.4))
    except DKMeansError:
        return None
    import io

    _draw_sweep(fig.add_subplot(), k_values, objectives, suggested_k)
    fig.tight_layout()
    out = io.StringIO()
    fig.savefig(out, format="svg")
    text = out.getvalue()
    return text[text.index("<svg") :] if "<svg" in text else None
