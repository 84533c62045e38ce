"""When the compiled loops serve a call: at once, or once compiled in the background.

The compiled kernels (:mod:`._numba`) take seconds to compile the first time a process
uses them with a new dtype or width, and numba's disk cache makes later processes faster
but not free. Dask config ``dkmeans.compile`` (env ``DASK_DKMEANS__COMPILE``) says what a
call does meanwhile:

* ``"background"`` (default): the first call of a kind starts compiling that kind in a
  background thread (by running the kernels on a few rows) and is served by the NumPy
  code; calls after the compilation take the compiled path. A fit chooses by its size
  (:func:`resolve_path`): a small one runs the NumPy code unless the loops are compiled
  already, and starts no compilation (a first fit on small data costs what NumPy costs, not
  the compilation, nor a compiling thread's hold on the GIL); a larger one starts the
  compilation, and waits for it as long as it pays.
* ``"eager"``: compile on first use, in the call (results then never mix the two paths,
  which agree up to float rounding; the test suite uses this).
* ``"off"``: the NumPy code always.

Whatever the mode, one fit takes one code path from start to end: the fit service resolves
the path once (:func:`resolve_path`) and runs every kernel call of the fit, on the client and
in its tasks, under :func:`pinned` (a context variable, so concurrent fits in other threads
keep their own). Results then never depend on when a background compilation ended; a fit
that starts after it took the compiled path.

The pin also carries the Dask config ``dkmeans.kernels.backend`` as the client read it when
the fit started (:class:`Pin`): the tasks of a fit run on workers whose own Dask config the
client's ``dask.config.set`` never reaches, so the value travels with the chunk functions
(:func:`call_pinned`) like the path. Kernel calls outside a pin read the key where they run.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import logging
import multiprocessing
import threading
import time
from typing import Callable, Hashable, Iterable, NamedTuple

from dkmeans import config

logger = logging.getLogger("dkmeans")

#: The code paths a call can be pinned to.
PATHS = ("compiled", "numpy")

#: Background mode: data of at least this many elements (rows x features) compiles first
#: (the fit waits for the compilation, however long) instead of running on the NumPy code.
#: Measured on 2 cores: a default fit on the NumPy code costs about 0.5-1.3 us per element
#: more than on the compiled loops (100,000 x 8, k = 10: 1.15 s against 0.13 s), and
#: compiling costs 0.2-0.3 s from numba's disk cache, 6-9 s cold (once per machine): from
#: about 2^22 elements even a cold compilation is paid back.
COMPILE_FIRST_ELEMENTS = 2**22
#: Below that, a fit waits for the compilation at most as long as the NumPy code would cost
#: it (this many seconds per element): a compilation from the disk cache then serves the fit,
#: a cold one is left to finish in the background for the next fit.
NUMPY_SECONDS_PER_ELEMENT = 0.5e-6
#: Background mode: a fit of less work than this (elements x centroids x runs) runs on the
#: NumPy code unless the compiled loops are ready, and starts no compilation. Loading the
#: compiled loops costs a fresh process 0.12-0.16 s of CPU even from numba's disk cache (its
#: type registries: most of it is numba's first dispatch in the process), and a compilation
#: thread holds the GIL against the fit it would serve. Measured on 2 cores (a warm process,
#: one BLAS thread, CPU seconds of a default fit, NumPy against compiled): 100,000 x 8, k = 10
#: (8e6): 0.076 against 0.046; 200,000 x 8, k = 10 (1.6e7): 0.145 against 0.075; 400,000 x 8,
#: k = 10 (3.2e7): 0.24 against 0.135; 100,000 x 8, k = 100 (8e7): 0.35 against 0.14. The
#: NumPy code costs less than the load plus the compiled fit up to about 3e7; the bound keeps
#: a margin below that (the NumPy code's BLAS products suffer more from a busy machine than
#: the compiled loops). Fits on a cluster are not weighed so (their workers load the loops).
NUMPY_FIT_WORK = 2**24

#: Background mode: small fits (below :data:`NUMPY_FIT_WORK`) a process ends before their kinds
#: start compiling in the background, for its later fits (:func:`after_small_fit`). A script
#: that fits a few times never pays for the compiled loops; one that fits in a loop gets them:
#: at 100,000 x 8, k = 10, a warm fit takes 0.043 s compiled against 0.072 s on the NumPy code
#: (in one process, 2 cores), so the load (0.12-0.16 s) is paid back within 5 fits. The
#: compilation starts when a fit has ended, never while one runs.
SMALL_FITS_BEFORE_COMPILING = 4

#: A process waits at its exit at most this long for the background compilation it started:
#: numba writes its disk cache as each kernel compiles, so a compilation cut short is redone by
#: the next process, and scripts shorter than a cold compilation (6-9 s on 2 cores) would each
#: start it again and never leave the cache for the next (:func:`finish_at_exit`).
COMPILE_AT_EXIT_SECONDS = 30.0

_lock = threading.Lock()
_at_exit: list = []
_small_fits = 0
_ready: set = set()
_started: set = set()
_local = threading.local()
_pinned: contextvars.ContextVar = contextvars.ContextVar("dkmeans_kernel_pin", default=None)


class Pin(NamedTuple):
    """What every kernel call of one fit runs under, wherever it runs (resolved once, on the client).

    Attributes
    ----------
    path : str or None
        ``"compiled"`` or ``"numpy"`` (:data:`PATHS`); None: each call asks :func:`compiled_ready`.
    backend : str
        The value of Dask config ``dkmeans.kernels.backend`` (``"auto"``, ``"blas"`` or ``"numpy"``).
    """

    path: str | None
    backend: str


def compile_mode() -> str:
    """The checked value of Dask config ``dkmeans.compile``."""
    return config.get("compile")


def backend_setting() -> str:
    """``dkmeans.kernels.backend`` for this call: the pinned value in a fit, else the config's here."""
    pin = _pinned.get()
    return pin.backend if pin is not None else config.get("kernels.backend")


def compiled_ready(kind: Hashable, warm_up: Callable[[], None]) -> bool:
    """Whether the compiled loops of ``kind`` may serve this call (see the module docstring).

    ``warm_up()`` runs the kernels of ``kind`` once on a few rows; in the background mode
    it is started in a thread the first time ``kind`` is asked for.
    """
    pin = _pinned.get()
    if pin is not None and pin.path is not None:  # a fit's path: compiled loops compile in the call when needed
        return pin.path == "compiled"
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
        if not _at_exit and multiprocessing.parent_process() is None:  # a worker process's exit waits for nothing
            _at_exit.append(atexit.register(finish_at_exit))
    # the thread starts with an empty context: it gets this call's backend setting (which loops to compile)
    threading.Thread(target=_warm, args=(kind, warm_up, backend_setting()), name="dkmeans-compile",
                     daemon=True).start()
    return False


@contextlib.contextmanager
def pinned(path: str | None, backend: str | None = None):
    """Run the enclosed kernel calls on one code path and one backend setting.

    Parameters
    ----------
    path : {"compiled", "numpy"} or None
        None: each call asks :func:`compiled_ready`.
    backend : {"auto", "blas", "numpy"}, optional
        The ``dkmeans.kernels.backend`` setting of the calls; by default the one in force
        here (an enclosing pin's, else this process's Dask config), read once, now.
    """
    if path is not None and path not in PATHS:
        raise ValueError(f"kernel path must be one of {PATHS}, got {path!r}")
    backend = backend_setting() if backend is None else config.KEYS["kernels.backend"].check(backend)
    token = _pinned.set(Pin(path, backend))
    try:
        yield
    finally:
        _pinned.reset(token)


def current_path() -> str | None:
    """The path :func:`pinned` set for this thread's context, or None."""
    pin = _pinned.get()
    return None if pin is None else pin.path


def current_pin() -> Pin:
    """The :class:`Pin` of this context (outside :func:`pinned`: no path, the config's backend setting).

    Read on the client and handed to :func:`call_pinned`, it takes both to the tasks.
    """
    pin = _pinned.get()
    return pin if pin is not None else Pin(None, backend_setting())


def call_pinned(pin: Pin | str | None, fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` under :func:`pinned` (picklable with ``functools.partial``: tasks take it).

    ``pin``: a :class:`Pin` (:func:`current_pin` on the client), or a bare path whose calls
    keep the backend setting of the context they run in.
    """
    path, backend = pin if isinstance(pin, Pin) else (pin, None)
    with pinned(path, backend):
        return fn(*args, **kwargs)


def resolve_path(kinds: Iterable[tuple[Hashable, Callable[[], None]]], n_elements: int,
                 n_clusters: int | None = None) -> str:
    """The one code path of a fit over ``n_elements`` (rows x features) whose kernels are ``kinds``.

    ``kinds``: the compiled kinds the fit's kernels may take, each with its warm-up;
    ``n_clusters``: the centroids the fit computes (times its runs), None when unknown.
    Eager mode: compiled; off: NumPy. Background mode (unless ``dkmeans.kernels.backend`` is
    ``"numpy"``, which takes no compiled loops: NumPy): compiled when every kind is compiled
    already. Otherwise by size: below :data:`NUMPY_FIT_WORK` (``n_elements x n_clusters``)
    NumPy, without waiting and without starting a compilation (none competes with the fit
    for the GIL; the first larger fit starts it, or :func:`after_small_fit` once the process
    has fitted small data repeatedly); from :data:`COMPILE_FIRST_ELEMENTS`
    elements compiled (the fit compiles first); between the two the kinds start compiling,
    and the fit waits for them at most what the NumPy code would cost it
    (:data:`NUMPY_SECONDS_PER_ELEMENT`): compiled if they are ready by then, NumPy otherwise
    (they go on compiling for later fits, and the process finishes them before it exits,
    :func:`finish_at_exit`, so that numba's disk cache serves the next process).
    """
    mode = compile_mode()
    if mode != "background":
        return "compiled" if mode == "eager" else "numpy"
    if backend_setting() == "numpy":  # no kernel takes the compiled loops: neither wait for nor start them
        return "numpy"
    kinds = list(kinds)
    if all(kind in _ready for kind, _ in kinds):
        return "compiled"
    if small_fit(n_elements, n_clusters):
        return "numpy"
    if n_elements >= COMPILE_FIRST_ELEMENTS:
        return "compiled"
    with pinned(None):  # not an enclosing fit's path: really start what is missing
        for kind, warm_up in kinds:
            compiled_ready(kind, warm_up)  # starts the background compilation of what is missing
    wait_compiled(timeout=n_elements * NUMPY_SECONDS_PER_ELEMENT)
    return "compiled" if all(kind in _ready for kind, _ in kinds) else "numpy"


def after_small_fit(kinds: Iterable[tuple[Hashable, Callable[[], None]]]) -> None:
    """Count a small fit that has ended (background mode); after :data:`SMALL_FITS_BEFORE_COMPILING`
    of them, start compiling ``kinds`` in the background for the next fits (see there)."""
    global _small_fits
    if compile_mode() != "background" or backend_setting() == "numpy":
        return
    with _lock:
        _small_fits += 1
        if _small_fits < SMALL_FITS_BEFORE_COMPILING:
            return
    with pinned(None):  # not an enclosing fit's path: really start what is missing
        for kind, warm_up in kinds:
            compiled_ready(kind, warm_up)


def small_fit(n_elements: int, n_clusters: int | None) -> bool:
    """Whether a fit over ``n_elements`` computing ``n_clusters`` centroids (times its runs; None:
    unknown) is below :data:`NUMPY_FIT_WORK`, where the NumPy code serves it best."""
    return n_clusters is not None and n_elements * max(1, n_clusters) < NUMPY_FIT_WORK


def _warm(kind, warm_up, backend: str) -> None:
    _local.warming = True
    try:
        with pinned(None, backend):
            warm_up()
    except Exception:  # the NumPy code keeps serving; say why once
        logger.warning("compiling the kernels for %s failed; the NumPy code serves instead", kind, exc_info=True)
        return
    _ready.add(kind)
    logger.debug("compiled kernels ready: %s", kind)


def finish_at_exit(timeout: float | None = None) -> bool:
    """Let the background compilations end (at most ``timeout``, default :data:`COMPILE_AT_EXIT_SECONDS`).

    Registered with :mod:`atexit` when a process (not a worker process) starts one, so that
    numba's disk cache serves the next process. True if none is left running.
    """
    if any(t.name == "dkmeans-compile" and t.is_alive() for t in threading.enumerate()):
        logger.info("finishing the compilation of the kernels for the next processes (numba's disk cache)")
        wait_compiled(COMPILE_AT_EXIT_SECONDS if timeout is None else timeout)
    return not any(t.name == "dkmeans-compile" and t.is_alive() for t in threading.enumerate())


def wait_compiled(timeout: float | None = None) -> bool:
    """Wait until every background compilation started so far has ended (at most ``timeout``
    seconds in all); True if all succeeded."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for thread in [t for t in threading.enumerate() if t.name == "dkmeans-compile"]:
        thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    with _lock:
        return _started <= _ready


__all__ = ["COMPILE_FIRST_ELEMENTS", "NUMPY_FIT_WORK", "PATHS", "Pin", "after_small_fit", "backend_setting",
           "call_pinned", "compile_mode", "compiled_ready", "current_path", "current_pin", "finish_at_exit", "pinned",
           "resolve_path", "small_fit", "wait_compiled"]
