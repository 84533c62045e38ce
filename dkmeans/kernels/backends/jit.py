"""numba's ``njit`` with its disk cache, and one compilation per machine.

Every compiled loop of the kernels is declared with :func:`njit`: numba's ``njit`` with
``cache=True`` (the compiled code is kept on disk; a later process loads it in milliseconds),
plus an inter-process lock around each compilation. A process about to compile a loop for a
signature takes a file lock named after the loop and the signature; another process needing
the same loop at that moment (the embedded cluster's workers and the caller start a fit's
kernels together) waits for the lock, and then finds the loop in numba's disk cache and loads
it instead of compiling it again. On 2 cores, three processes compiling the same loops at once
each took three times as long as one alone.

The lock is ``fcntl.flock`` on a file in :func:`lock_dir`: the system drops it when its holder
dies, so a killed process never leaves a lock behind. A wait is bounded by
:data:`COMPILE_WAIT_S` (a holder stopped, or compiling on an overloaded machine): past it the
process compiles the loop itself, as numba alone would. Where no lock directory is writable,
or on a system without ``fcntl`` (Windows), every process compiles on its own, and where
numba's cache is not writable numba compiles in each process: the lock only ever saves work,
results never depend on it.

Non-public numba used: ``numba.core.compiler_lock.global_compiler_lock`` (the process's own
compile lock, taken before the file lock so that one thread of a process holds file locks at a
time, and nested compilations of callees take theirs in call order: a process holding a
loop's lock waits only for the loops it calls, never the other way round, so two processes
cannot wait on each other). If numba renamed it, the import below fails loudly in the tests.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import threading
import time

import numba
from numba.core.compiler_lock import global_compiler_lock

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows: no inter-process lock
    fcntl = None

logger = logging.getLogger("dkmeans")

#: Seconds a process waits for another one's compilation of the same loop before compiling it
#: itself. Compiling one loop takes up to 15 s on a loaded 2-core machine.
COMPILE_WAIT_S = 120.0
#: Seconds between two tries of a held lock.
POLL_S = 0.05

#: Keys of the locks this process holds (nested compilations; at most one thread at a time,
#: under numba's compile lock).
_held: set = set()
_dir_lock = threading.Lock()
_dir: list = []  # the lock directory found, once per process ([] not yet looked, [None]: none)


def njit(*args, cache: bool = True, **options):
    """``numba.njit(cache=cache, **options)`` whose compilations are shared by the machine's processes.

    Use as ``@njit`` or ``@njit(nogil=True, ...)``. ``cache=False`` (code without a file, as the
    generated loops compiled in memory): numba's plain ``njit``, no lock.
    """

    def decorate(fn):
        dispatcher = numba.njit(cache=cache, **options)(fn)
        return share_compiles(dispatcher) if cache else dispatcher

    if args and callable(args[0]) and len(args) == 1:
        return decorate(args[0])
    if args:
        raise TypeError("njit takes the function, or options by keyword")
    return decorate


def share_compiles(dispatcher):
    """Compile ``dispatcher``'s signatures under the machine-wide lock (see the module docstring)."""
    compile_here = dispatcher.compile
    origin = f"{dispatcher.py_func.__module__}.{dispatcher.py_func.__qualname__}"

    def compile_shared(sig):
        with global_compiler_lock:
            args = tuple(sig) if isinstance(sig, tuple) else tuple(getattr(sig, "args", ()))
            if args in dispatcher.overloads:  # compiled or loaded in this process already
                return compile_here(sig)
            with machine_lock(lock_key(dispatcher, args), origin):
                return compile_here(sig)

    dispatcher.compile = compile_shared
    return dispatcher


def lock_key(dispatcher, args: tuple) -> str:
    """The name of the lock of ``dispatcher``'s compilation for argument types ``args``: its
    source file (numba's cache is per file), function and signature."""
    py_func = dispatcher.py_func
    return f"{py_func.__code__.co_filename}:{py_func.__module__}.{py_func.__qualname__}:{args}"


def lock_dir() -> str | None:
    """The directory of the compile locks (created once): beside numba's cache where
    ``NUMBA_CACHE_DIR`` names one, else the user's cache directory, else the temporary
    directory; None where none is writable."""
    with _dir_lock:
        if not _dir:
            _dir.append(_find_dir())
        return _dir[0]


def _find_dir() -> str | None:
    candidates = []
    if numba.config.CACHE_DIR:
        candidates.append(os.path.join(numba.config.CACHE_DIR, "dkmeans-locks"))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    candidates.append(os.path.join(base, "dkmeans", "compile-locks"))
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    candidates.append(os.path.join(tempfile.gettempdir(), f"dkmeans-{uid}", "compile-locks"))
    for directory in candidates:
        try:
            os.makedirs(directory, exist_ok=True)
            if os.access(directory, os.W_OK):
                return directory
        except OSError:
            continue
    return None


@contextlib.contextmanager
def machine_lock(key: str, what: str = "", wait_s: float | None = None):
    """Hold the machine-wide lock named ``key`` for the block (re-entrant in this process).

    Waits at most ``wait_s`` (default :data:`COMPILE_WAIT_S`) for another process to release
    it, then runs the block without it. Runs the block without a lock where no lock file can
    be made (see the module docstring).
    """
    if fcntl is None or key in _held:
        yield
        return
    directory = lock_dir()
    fd = None
    if directory is not None:
        name = hashlib.sha256(f"{numba.__version__}:{key}".encode()).hexdigest()[:24]
        with contextlib.suppress(OSError):
            fd = os.open(
                os.path.join(directory, name + ".lock"),
                os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                0o666,
            )
    if fd is None:
        yield
        return
    try:
        held = _acquire(fd, COMPILE_WAIT_S if wait_s is None else wait_s)
        if not held:
            logger.info(
                "another process has compiled %s for %.0f s: compiling it here too",
                what or key,
                COMPILE_WAIT_S if wait_s is None else wait_s,
            )
        if held:
            _held.add(key)
        try:
            yield
        finally:
            if held:
                _held.discard(key)
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _acquire(fd: int, wait_s: float) -> bool:
    """Take the lock on ``fd``, trying until ``wait_s`` seconds have passed; whether it was taken."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)
        except OSError:  # a file system without locks: compile without one
            return False


__all__ = ["COMPILE_WAIT_S", "lock_dir", "lock_key", "machine_lock", "njit", "share_compiles"]
