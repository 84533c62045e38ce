"""An estimator's fitted state in a model file: the parameters and attributes written, read back.

The faces keep their words (``cluster_centers_``, ``inertia_``); what a file holds of them, how
parameters that cannot be stored are written (an array ``init``, a generator ``random_state``, a
job's checkpoint) and the checks on reading are here, once for every estimator.
"""

from __future__ import annotations

import numpy as np

from dkmeans.io.model_file import ModelFileError, load_model, save_model
from dkmeans.kernels.quality import imbalance_factor
from dkmeans.model import Model


def stored_params(params: dict) -> dict:
    """``get_params()`` as a model file holds them: an array ``init`` as ``"array"`` (its rows are
    the centroids' place in the file), a generator ``random_state`` as None, no checkpoint file."""
    params = dict(params)
    if not isinstance(params["init"], str):
        params["init"] = "array"
    if not isinstance(params["random_state"], (int, type(None))):
        params["random_state"] = None
    if "checkpoint" in params:
        params["checkpoint"] = None  # a job's scratch file, not part of the model
    return params


def save_fitted(path, estimator: str, params: dict, fitted: dict):
    """Write a fitted estimator named ``estimator`` (``"dkmeans.KMeans"``) to ``path``.

    ``fitted`` holds its attributes without the trailing underscore: ``cluster_centers``,
    ``n_features_in``, ``feature_names`` (or None), ``inertia``, ``n_iter``, ``stop_reason``,
    ``history`` and, where the final pass gave them, ``cluster_sizes`` and ``cluster_inertia``.
    Returns the path written.
    """
    names = fitted.get("feature_names")
    meta = {
        "estimator": estimator,
        "params": stored_params(params),
        "n_features_in": int(fitted["n_features_in"]),
        "feature_names": None if names is None else [str(c) for c in names],
        "objective": float(fitted["inertia"]),
        "iteration_count": int(fitted["n_iter"]),
        "stop_reason": fitted["stop_reason"],
        "history": fitted["history"],
    }
    if (
        fitted.get("cluster_sizes") is not None
    ):  # from the final pass (absent: lazy out-of-core labels)
        meta["cluster_sizes"] = [float(v) for v in fitted["cluster_sizes"]]
        meta["cluster_inertia"] = [float(v) for v in fitted["cluster_inertia"]]
    return save_model(path, Model(fitted["cluster_centers"]), meta)


def read_fitted(path, estimator: str) -> tuple[dict, dict]:
    """``(params, attributes)`` of the estimator named ``estimator`` saved in ``path``.

    ``params`` are the constructor's (an array ``init`` is the centroids again); ``attributes``
    are the fitted ones, named as the estimator names them (``cluster_centers_``, ...).

    Raises
    ------
    dkmeans.io.ModelFileError
        The file is missing, damaged, altered, pickled, of another version or of another estimator.
    """
    model, meta = load_model(path)
    if meta.get("estimator") != estimator or not isinstance(meta.get("params"), dict):
        raise ModelFileError(f"{path}: not a saved {estimator} (use dkmeans.io.load_model)")
    params = dict(meta["params"])
    if params.get("init") == "array":
        params["init"] = model.centroids
    centroids = model.centroids
    fitted = {
        "cluster_centers_": centroids,
        "n_features_in_": int(meta.get("n_features_in", centroids.shape[1])),
    }
    if fitted["n_features_in_"] != centroids.shape[1]:
        raise ModelFileError(f"{path}: n_features_in does not match the centroids")
    if meta.get("feature_names"):
        fitted["feature_names_in_"] = np.asarray(meta["feature_names"], dtype=object)
    fitted.update(
        inertia_=float(meta.get("objective", np.nan)),
        n_iter_=int(meta.get("iteration_count", 0)),
        history_=list(meta.get("history") or []),
        stop_reason_=meta.get("stop_reason"),
    )
    if meta.get("cluster_sizes") is not None:
        fitted["cluster_sizes_"] = np.asarray(meta["cluster_sizes"], dtype=np.float64)
        fitted["cluster_inertia_"] = np.asarray(meta["cluster_inertia"], dtype=np.float64)
        fitted["imbalance_"] = imbalance_factor(fitted["cluster_sizes_"])
    return params, fitted


def saved_estimator(path) -> str | None:
    """The estimator saved in ``path`` (``"dkmeans.KMeans"``, ...; None where it does not say)."""
    _, meta = load_model(path)
    return meta.get("estimator")


__all__ = ["ModelFileError", "read_fitted", "save_fitted", "saved_estimator", "stored_params"]
