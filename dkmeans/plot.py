"""Plots of a fit (matplotlib, an optional dependency: ``pip install 'dkmeans[plot]'``).

:func:`plot_history` draws the objective per iteration; :func:`plot_clusters` draws 2-D
data (or a 2-D projection on the first two principal axes) coloured by cluster, with the
centroids; :func:`save_fit_plot` writes both side by side to a PNG. :func:`plot_sweep` draws the
objective per k of a sweep (:func:`dkmeans.sweep`) with the suggested k; :func:`save_sweep_plot`
writes it to a PNG.
"""

from __future__ import annotations

import numpy as np

from dkmeans.errors import DKMeansError


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise DKMeansError("plots need matplotlib: pip install 'dkmeans[plot]'") from exc
    return plt


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


def plot_history(history, ax=None):
    """Objective per step (log scale) from ``KMeans.history_`` or ``TrainResult.history``.

    Steps are Lloyd iterations, local-search rounds and Hartigan rounds in the order they ran
    (each phase numbers its own records, so the position is the step).

    Parameters
    ----------
    history : list of dict or of records
        ``KMeans.history_``, ``TrainResult.history`` (or their records).
    ax : matplotlib.axes.Axes, optional
        Where to draw (default: the current axes).

    Returns
    -------
    matplotlib.axes.Axes
        The axes drawn on.
    """
    plt = _pyplot()
    ax = ax or plt.gca()
    rows = [h if isinstance(h, dict) else h.as_dict() for h in history]
    ax.plot(np.arange(1, len(rows) + 1), [r["objective"] for r in rows], marker="o")
    ax.set_yscale("log")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("step (Lloyd iterations, then swap rounds and Hartigan rounds if any)")
    ax.set_ylabel("objective (sum of squared distances)")
    ax.set_title("objective per iteration")
    return ax


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
        Where to draw (default: the current axes).
    max_points : int, default 20000
        The most rows drawn (a random sample of larger data).
    seed : int, default 0
        Seed of that sample.

    Returns
    -------
    matplotlib.axes.Axes
        The axes drawn on.
    """
    plt = _pyplot()
    ax = ax or plt.gca()
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
    return ax


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
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    plot_history(history, left)
    plot_clusters(X_sample, labels_sample, centroids, right)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
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
        Where to draw (default: the current axes).

    Returns
    -------
    matplotlib.axes.Axes
        The axes drawn on.
    """
    plt = _pyplot()
    ax = ax or plt.gca()
    ax.plot(k_values, objectives, marker="o")
    if suggested_k is not None and suggested_k in list(k_values):
        ax.axvline(suggested_k, color="grey", linestyle="--", label=f"suggested k = {suggested_k}")
        ax.legend(loc="best")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("k (clusters)")
    ax.set_ylabel("objective (sum of squared distances)")
    ax.set_title("objective per k")
    return ax


def save_sweep_plot(path, k_values, objectives, suggested_k=None):
    """Write :func:`plot_sweep` to ``path`` (PNG); returns the path.

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
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 5))
    plot_sweep(k_values, objectives, suggested_k, ax)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
