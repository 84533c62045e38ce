"""Every ``dkmeans.*`` Dask configuration key: its default, its meaning and its check, in one table.

The keys are registered once with Dask's configuration when dkmeans is imported (as
distributed and dask-cuda register theirs), so they are set like any Dask setting::

    dask.config.set({"dkmeans.compile": "eager"})     # in code
    DASK_DKMEANS__COMPILE=eager                        # in the environment
    dkmeans: {compile: eager}                          # in a YAML file of Dask's config paths

Code reads a key only through :func:`get`, which returns the checked value and raises
:class:`~dkmeans.errors.InvalidParameterError` naming the key for a wrong one: a key's
name, default and rule live here alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dask.config
from dask.utils import parse_bytes, parse_timedelta

from dkmeans.errors import InvalidParameterError

_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _boolean(value) -> bool:
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE + _FALSE:
            return text in _TRUE
        raise ValueError("must be true or false")
    return bool(value)


def _one_of(*choices) -> Callable[[Any], Any]:
    def check(value):
        if isinstance(value, str):
            text = value.strip().lower()
            value = True if text == "true" else False if text == "false" else text
        if value not in choices:
            raise ValueError(f"must be one of {choices}")
        return value

    return check


def _positive_int(value) -> int:
    if int(value) < 1:
        raise ValueError("must be a positive integer")
    return int(value)


def _non_negative(value) -> float:
    if float(value) < 0:
        raise ValueError("must be non-negative")
    return float(value)


def _fraction(value) -> float:
    if not 0 < float(value) <= 1:
        raise ValueError("must be in (0, 1]")
    return float(value)


def _bytes(value) -> float:
    return float(parse_bytes(str(value)))


def _seconds(value) -> float:
    return float(parse_timedelta(value, default="s"))


@dataclass(frozen=True)
class Key:
    """One configuration key (``dkmeans.<name>``).

    Attributes
    ----------
    name : str
        The key without its ``dkmeans.`` prefix.
    default : object
        Its value when unset.
    check : callable
        Converts a value and raises ``ValueError`` for a wrong one.
    meaning : str
        What the key sets, as the configuration page shows it.
    """

    name: str
    default: Any
    check: Callable[[Any], Any]
    meaning: str


#: The table: every key dkmeans reads.
KEYS: dict[str, Key] = {
    key.name: key
    for key in (
        Key(
            "compile",
            "auto",
            _one_of("auto", "eager", "off", "background"),
            "which code path a fit's kernels take (dkmeans.kernels.plans): 'auto' (the compiled loops, "
            "built at their first need and kept in numba's disk cache, except small in-process fits in a "
            "process that has not loaded them: the NumPy code), 'eager' (the compiled loops always) or "
            "'off' (the NumPy code only); 'background', the former default, reads as 'auto'",
        ),
        Key(
            "kernels.backend",
            "auto",
            _one_of("auto", "blas", "numpy"),
            "which code the kernels run (dkmeans.kernels.backends.select): 'auto' (scipy.sparse rows the "
            "CSR kernels, CuPy the fused CUDA kernels, NumPy float32/float64 the compiled loops, chosen per "
            "shape, once compiled), 'blas' (as auto, but the nearest-centroid loops always around a BLAS "
            "product) or 'numpy' (the namespace code, NumPy or CuPy; scipy.sparse rows keep the CSR kernels); "
            "read where a fit starts and carried to its tasks",
        ),
        Key(
            "out-of-core",
            "auto",
            _one_of("auto", True, False),
            "the default of the out_of_core parameter: 'auto' (stream when the data does not fit the "
            "persist budget), True (always stream) or False (always persist)",
        ),
        Key(
            "prune",
            "auto",
            _one_of("auto", True, False),
            "the default of the prune parameter: 'auto' (prune Lloyd's passes over in-memory data where it "
            "pays, switching itself off when too few rows are settled), True (always) or False (never)",
        ),
        Key(
            "in-process-bytes",
            "32MiB",
            _bytes,
            "in-memory data up to this size is fitted in the calling process, in one thread (larger "
            "in-memory data too, on a thread per core, when no Dask client exists or every worker of "
            "the current client runs on this machine), and so is a dense Dask array of known "
            "chunk lengths up to this size, computed once, or a dd.read_parquet frame whose files' "
            "footers say it is that small, read once; 0 sends all data to a cluster",
        ),
        Key(
            "embedded-cluster.set-as-default",
            True,
            _boolean,
            "whether the embedded LocalCluster's client becomes Dask's default scheduler",
        ),
        Key("spmd", True, _boolean, "run large Lloyd loops SPMD (True) or as one graph per pass"),
        Key(
            "spmd-max-ranks",
            16,
            _positive_int,
            "the most ranks (worker threads) an SPMD loop uses; more run one graph per pass",
        ),
        Key(
            "spmd-wait",
            "10s",
            _seconds,
            "how long an SPMD rank waits for its peers (beyond four times its own pass)",
        ),
        Key(
            "single-task-work",
            2e8,
            _non_negative,
            "a loop over persisted data of at most this many multiply-adds (rows x centroids x "
            "features) runs inside one task",
        ),
        Key("worker-timeout", "120s", _seconds, "how long a pass may wait with no worker"),
        Key(
            "lost-worker-grace",
            "5s",
            _seconds,
            "after every worker of the cluster died (none left as planned), how long a call waits "
            "for one to come back (a nanny restarting it) before it says so, instead of waiting "
            "worker-timeout",
        ),
        Key(
            "stall-timeout",
            "30s",
            _seconds,
            "how long a wait may see no running worker process anything while our tasks are pending",
        ),
        Key(
            "shared-pass-wait",
            "60s",
            _seconds,
            "a sweep's combined pass waits at most this long for the fits still computing between "
            "passes (such as a local search on a sample); then it runs without them, and they join the next",
        ),
        Key(
            "memory.task-fraction",
            0.25,
            _fraction,
            "the share of a worker's memory limit one task may take",
        ),
        Key(
            "memory.persist-fraction",
            0.5,
            _fraction,
            "the share of the workers' memory persisted data may take",
        ),
        Key(
            "init.two-level-clusters",
            4096,
            _positive_int,
            "k-means|| takes its two-level path from this n_clusters",
        ),
    )
}


def _nested(keys) -> dict:
    tree: dict = {}
    for key in keys:
        *parents, leaf = key.name.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = key.default
    return tree


dask.config.update_defaults({"dkmeans": _nested(KEYS.values())})


def name(key: str) -> str:
    """The full Dask name of ``key``: ``dkmeans.<key>``.

    Parameters
    ----------
    key : str
        A key of ``dkmeans.config.KEYS``, without the ``dkmeans.`` prefix.

    Returns
    -------
    str
        ``"dkmeans." + key``.
    """
    if key not in KEYS:
        raise KeyError(f"no dkmeans configuration key {key!r}; the keys are {sorted(KEYS)}")
    return f"dkmeans.{key}"


def get(key: str) -> Any:
    """The checked value of ``dkmeans.<key>`` (the table's default when unset).

    Read more in the :ref:`User Guide <guide-configuration>`.

    Parameters
    ----------
    key : str
        A key of ``dkmeans.config.KEYS``, without the ``dkmeans.`` prefix.

    Returns
    -------
    object
        The value, converted and checked by the key's rule.
    """
    full, spec = name(key), KEYS[key]
    value = dask.config.get(full, spec.default)
    try:
        return spec.check(value)
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError(f"Dask config {full!r} {exc}, got {value!r}") from None


__all__ = ["KEYS", "Key", "get", "name"]
