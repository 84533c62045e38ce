"""When the compiled loops serve a call: at once, or once compiled in the background.

The compiled kernels (:mod:`._numba`) take seconds to compile the first time a process
uses them with a new dtype or width, and numba's disk cache makes later processes faster
but not free. Dask config ``dkmeans.compile`` (env ``DASK_DKMEANS__COMPILE``) says what a
call does meanwhile:

* ``"background"`` (default): the first call of a kind starts compiling that kind in a
  background thread (by running the kernels on a few rows) and is served by the NumPy
  code; calls after the compilation take the compiled path. A first fit on small data
  therefore costs what NumPy costs, not the compilation.
* ``"eager"``: compile on first use, in the call (results then never mix the two paths,
  which agree up to float rounding; the test suite uses this).
* ``"off"``: the NumPy code always.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Hashable

import dask

logger = logging.getLogger("dkmeans")

COMPILE_KEY = "dkmeans.compile"
MODES = ("background", "eager", "off")

_lock = threading.Lock()
_ready: set = set()
_started: set = set()
_local = threading.local()


def compile_mode() -> str:
    mode = str(dask.config.get(COMPILE_KEY, "background")).lower()
    if mode not in MODES:
        raise ValueError(f"Dask config {COMPILE_KEY!r} must be one of {MODES}, got {mode!r}")
    return mode


def compiled_ready(kind: Hashable, warm_up: Callable[[], None]) -> bool:
    """Whether the compiled loops of ``kind`` may serve this call (see the module docstring).

    ``warm_up()`` runs the kernels of ``kind`` once on a few rows; in the background mode
    it is started in a thread the first time ``kind`` is asked for.
    """
    mode = compile_mode()
    if mode == "eager" or getattr(_local, "warming", False):
        return True
    if mode == "off":
        return False
    if kind in _ready:
        return True
    with _lock:
        if kind in _started:
            return False
        _started.add(kind)
    threading.Thread(target=_warm, args=(kind, warm_up), name="dkmeans-compile", daemon=True).start()
    return False


def _warm(kind, warm_up) -> None:
    _local.warming = True
    try:
        warm_up()
    except Exception:  # the NumPy code keeps serving; say why once
        logger.warning("compiling the kernels for %s failed; the NumPy code serves instead", kind, exc_info=True)
        return
    _ready.add(kind)
    logger.debug("compiled kernels ready: %s", kind)


def wait_compiled(timeout: float | None = None) -> bool:
    """Wait until every background compilation started so far has ended; True if all succeeded."""
    for thread in [t for t in threading.enumerate() if t.name == "dkmeans-compile"]:
        thread.join(timeout)
    with _lock:
        return _started <= _ready


__all__ = ["COMPILE_KEY", "compile_mode", "compiled_ready", "wait_compiled"]
