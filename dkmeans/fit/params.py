"""The one table of fit parameters, shared by the faces (``KMeans``, ``Descriptor``/``train``, the CLI).

Each :class:`Param` holds a parameter's constraint, its documentation and its name in each
face (scikit-learn's words for the estimator, oneDAL's for the functional API, the shell's
for the CLI). A face validates its arguments with :func:`check` under its own names and
hands the fit service (:mod:`dkmeans.fit.service`) the service's names. A new fit parameter is a
row here, plus its name in the faces that offer it and a keyword in their signatures.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dkmeans.engine.columns import MISSING  # the policies the engine's conversions follow
from dkmeans.errors import InvalidParameterError


# -- constraints ------------------------------------------------------------------------
@dataclass(frozen=True)
class Int:
    """An integer (not a bool) ``>= minimum``."""

    minimum: int

    def __call__(self, name: str, value):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
            raise InvalidParameterError(
                f"{name} must be an integer >= {self.minimum}, got {value!r}"
            )
        if value < self.minimum:
            raise InvalidParameterError(f"{name} must be an integer >= {self.minimum}, got {value}")
        return int(value)

    def describe(self) -> str:
        return f"integer >= {self.minimum}"


@dataclass(frozen=True)
class Float:
    """A finite real ``>= minimum`` (``> minimum`` with ``open_below``)."""

    minimum: float = 0.0
    open_below: bool = False

    def __call__(self, name: str, value):
        if (
            isinstance(value, (bool, np.bool_))
            or not isinstance(value, numbers.Real)
            or not math.isfinite(value)
        ):
            raise InvalidParameterError(
                f"{name} must be a finite number {self._bound()}, got {value!r}"
            )
        if value < self.minimum or (self.open_below and value == self.minimum):
            raise InvalidParameterError(f"{name} must be {self._bound()}, got {value}")
        return float(value)

    def _bound(self) -> str:
        return f"{'>' if self.open_below else '>='} {self.minimum:g}"

    def describe(self) -> str:
        return f"number {self._bound()}"


@dataclass(frozen=True)
class OneOf:
    """One of a fixed set of values (compared with ``==`` and by type, so True is not 1)."""

    options: tuple

    def __call__(self, name: str, value):
        for option in self.options:
            if (
                type(option) is type(value)
                and option == value
                or (option is None and value is None)
            ):
                return value
        raise InvalidParameterError(f"{name} must be one of {self.options}, got {value!r}")

    def describe(self) -> str:
        return "one of " + ", ".join(repr(o) for o in self.options)


@dataclass(frozen=True)
class Either:
    """Satisfies any of the constraints (tried in order)."""

    constraints: tuple

    def __call__(self, name: str, value):
        for constraint in self.constraints:
            try:
                return constraint(name, value)
            except InvalidParameterError:
                continue
        raise InvalidParameterError(f"{name} must be {self.describe()}, got {value!r}")

    def describe(self) -> str:
        return " or ".join(c.describe() for c in self.constraints)


class PathOrNone:
    """A file path (str or path-like), or None."""

    def __call__(self, name: str, value):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise InvalidParameterError(
                f"{name} must be a file path or None, got {type(value).__name__}"
            )
        return value

    def describe(self) -> str:
        return "a file path or None"


class Anything:
    """Checked elsewhere (data-dependent: ``init`` arrays, ``random_state``)."""

    def __call__(self, name: str, value):
        return value

    def describe(self) -> str:
        return "see the documentation"


# -- the table --------------------------------------------------------------------------
@dataclass(frozen=True)
class Param:
    """A fit parameter: the fit service's name, constraint, documentation and its name per face."""

    name: str
    constraint: Callable
    doc: str
    estimator: str | None = None
    functional: str | None = None
    cli: str | None = None


INIT_STRATEGIES = ("k-means||", "k-means++", "random", "random-partition")
ALGORITHMS = ("lloyd", "hartigan", "minibatch")
TIME_UNITS = ("batches", "points")
HARTIGAN_MODES = ("safe", "unsafe")
STOP_RULES = ("objective-decrease", "centroid-shift")
OUT_OF_CORE = ("auto", True, False)
PRUNE = ("auto", True, False)
METRICS = ("euclidean", "cosine")
BISECTING_STRATEGIES = ("biggest_inertia", "largest_cluster")
BISECTING_INITS = ("k-means++", "random")
BISECTING_ALGORITHMS = ("lloyd", "elkan")  # scikit-learn's names; both run Lloyd (the same results)

PARAMS: dict[str, Param] = {
    p.name: p
    for p in (
        Param(
            "n_clusters",
            Int(1),
            "number of clusters k",
            estimator="n_clusters",
            functional="cluster_count",
            cli="-k",
        ),
        Param(
            "max_iter",
            Int(0),
            "maximum number of Lloyd iterations (and, separately, Hartigan rounds)",
            estimator="max_iter",
            functional="max_iteration_count",
            cli="--max-iter",
        ),
        Param(
            "tol",
            Float(0.0),
            "stop tolerance (see each face for its rule)",
            estimator="tol",
            functional="accuracy_threshold",
            cli="--tol",
        ),
        Param(
            "stop_rule",
            OneOf(STOP_RULES),
            "which quantity the tolerance bounds",
            functional="stop_rule",
        ),
        Param(
            "init",
            Anything(),
            "initialisation: " + ", ".join(INIT_STRATEGIES) + ", an array or a callable",
            estimator="init",
            functional="initial_centroids",
            cli="--init",
        ),
        Param(
            "n_init",
            Either((OneOf(("auto",)), Int(1))),
            "number of initialisations; the best run is kept",
            estimator="n_init",
            cli="--n-init",
        ),
        Param(
            "random_state",
            Anything(),
            "seed of the initialisation",
            estimator="random_state",
            functional="random_state",
            cli="--random-state",
        ),
        Param(
            "algorithm",
            OneOf(ALGORITHMS),
            "lloyd, or batch Hartigan from the initial centroids",
            estimator="algorithm",
            functional="method",
            cli="--algorithm",
        ),
        Param(
            "refine",
            OneOf((None, "hartigan")),
            "continue Lloyd's result with Hartigan's method",
            estimator="refine",
        ),
        Param(
            "local_search",
            OneOf(("auto", True, False)),
            "swap-based local search after Lloyd, then Lloyd again ('auto': when init is a seeding strategy)",
            estimator="local_search",
            functional="local_search",
            cli="--local-search",
        ),
        Param(
            "hartigan_mode",
            OneOf(HARTIGAN_MODES),
            "batch Hartigan: accept all moves (unsafe) or disjoint ones",
            estimator="hartigan_mode",
        ),
        Param(
            "oversampling_factor",
            Float(0.0, open_below=True),
            "k-means||: candidates per round, times k",
            estimator="oversampling_factor",
            functional="oversampling_factor",
        ),
        Param(
            "init_rounds",
            Int(1),
            "k-means||: sampling rounds",
            estimator="init_rounds",
            functional="init_rounds",
        ),
        Param(
            "checkpoint",
            PathOrNone(),
            "checkpoint file of the fit (resumed when it exists)",
            estimator="checkpoint",
            functional="checkpoint",
            cli="--checkpoint",
        ),
        Param(
            "checkpoint_every",
            Int(1),
            "Lloyd iterations (mini-batch: steps) between checkpoint writes",
            estimator="checkpoint_every",
            functional="checkpoint_every",
            cli="--checkpoint-every",
        ),
        Param(
            "device",
            OneOf((None, "cpu", "gpu")),
            "where chunks are processed (None: where the data is)",
            estimator="device",
            functional="device",
        ),
        Param(
            "out_of_core",
            OneOf(OUT_OF_CORE),
            "'auto': persist the data when it fits the cluster's memory budget, else read it from its source "
            "in every pass; True: always stream; False: always persist",
            estimator="out_of_core",
            functional="out_of_core",
            cli="--out-of-core",
        ),
        Param(
            "verbose",
            Either((OneOf((False, True)), Int(0))),
            "print one line per iteration when > 0 or True (scikit-learn accepts bools too)",
            estimator="verbose",
        ),
        Param(
            "batch_size",
            Int(1),
            "mini-batch: rows per batch",
            estimator="batch_size",
            functional="batch_size",
            cli="--batch-size",
        ),
        Param(
            "max_no_improvement",
            Either((OneOf((None,)), Int(0))),
            "mini-batch: steps without improvement of the smoothed batch objective before stopping (None: never)",
            estimator="max_no_improvement",
            functional="max_no_improvement",
            cli="--max-no-improvement",
        ),
        Param(
            "reassignment_ratio",
            Float(0.0),
            "mini-batch: centers whose count is below this fraction of the "
            "largest move to batch rows",
            estimator="reassignment_ratio",
            functional="reassignment_ratio",
        ),
        Param(
            "init_size",
            Either((OneOf((None,)), Int(1))),
            "mini-batch: rows of the sample each initialisation runs on (None: 3 * batch_size)",
            estimator="init_size",
        ),
        Param(
            "compute_labels",
            OneOf((True, False)),
            "mini-batch: end with a pass for labels and the objective",
            estimator="compute_labels",
        ),
        Param(
            "decay",
            Either((OneOf((None,)), Float(0.0))),
            "mini-batch: discount of past counts per time unit, "
            "in [0, 1] (Spark's decayFactor; None: 1, no decay)",
            estimator="decay",
        ),
        Param(
            "half_life",
            Either((OneOf((None,)), Float(0.0, open_below=True))),
            "mini-batch: time units after which past data has half its weight (instead of decay)",
            estimator="half_life",
        ),
        Param(
            "time_unit",
            OneOf(TIME_UNITS),
            "mini-batch: unit of decay and half_life: batches or points (rows)",
            estimator="time_unit",
        ),
        Param(
            "prune",
            OneOf(PRUNE),
            "Lloyd: skip the distances that cannot change a label (bounds kept with in-memory rows; the same "
            "results); 'auto': where it pays",
            estimator="prune",
            functional="prune",
            cli="--prune",
        ),
        Param(
            "bisecting_strategy",
            OneOf(BISECTING_STRATEGIES),
            "bisecting k-means: split the cluster of largest SSE ('biggest_inertia') or of most rows",
            estimator="bisecting_strategy",
            functional="bisecting_strategy",
            cli="--bisecting-strategy",
        ),
        Param(
            "copy_x",
            OneOf((True, False)),
            "accepted for scikit-learn's signature: the input is never modified",
            estimator="copy_x",
        ),
        Param(
            "missing",
            OneOf(MISSING),
            "rows with a missing value (NaN, null): 'error', or 'skip' (left out of the "
            "fit, labelled -1 by predict)",
            estimator="missing",
            functional="missing",
            cli="--missing",
        ),
        Param(
            "max_cluster_size",
            Either((OneOf((None,)), Int(1), Float(0.0, open_below=True))),
            "size cap: no cluster holds more rows (an integer), or more than this fraction of them (a float "
            "in (0, 1]); weighted rows count by weight",
            estimator="max_cluster_size",
            functional="max_cluster_size",
            cli="--max-cluster-size",
        ),
        Param(
            "min_cluster_size",
            Either((OneOf((None,)), Int(0), Float(0.0, open_below=True))),
            "size floor: every cluster holds at least this many rows (an integer), or this fraction of them "
            "(a float in (0, 1])",
            estimator="min_cluster_size",
            functional="min_cluster_size",
            cli="--min-cluster-size",
        ),
        Param(
            "balanced",
            OneOf((False, True)),
            "sizes within one row of n / k (caps of floor and ceiling of n / k)",
            estimator="balanced",
            functional="balanced",
            cli="--balanced",
        ),
        Param(
            "metric",
            OneOf(METRICS),
            "euclidean, or cosine (spherical k-means: unit rows and centroids, "
            "objective sum of w (1 - cos))",
            estimator="metric",
            functional="metric",
            cli="--metric",
        ),
    )
}


def face_names(face: str) -> dict[str, str]:
    """``{service name: face name}`` of the parameters ``face`` offers ("estimator", "functional", "cli")."""
    return {p.name: getattr(p, face) for p in PARAMS.values() if getattr(p, face)}


def check(face: str, values: dict[str, Any]) -> dict[str, Any]:
    """Validate ``{face name: value}`` against the table; return ``{service name: value}``.

    Errors name the parameter as the face calls it.
    """
    by_face = {getattr(p, face): p for p in PARAMS.values() if getattr(p, face)}
    out = {}
    for face_name, value in values.items():
        param = by_face[face_name]
        out[param.name] = param.constraint(face_name, value)
    return out


__all__ = [
    "BISECTING_ALGORITHMS",
    "BISECTING_INITS",
    "BISECTING_STRATEGIES",
    "TIME_UNITS",
    "ALGORITHMS",
    "HARTIGAN_MODES",
    "INIT_STRATEGIES",
    "METRICS",
    "MISSING",
    "OUT_OF_CORE",
    "PARAMS",
    "PRUNE",
    "Param",
    "STOP_RULES",
    "check",
    "face_names",
]
