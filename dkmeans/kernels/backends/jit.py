"""numba's ``njit`` with its disk cache, and one compilation per machine.

Every compiled loop of the kernels is declared with :func:`njit`: numba's ``njit`` with
``cache=True`` (the compiled code is kept on disk; a later process loads it in milliseconds),
plus an inter-process lock around each compilation. A process that finds a loop neither loaded
nor in numba's disk cache takes a file lock named after the loop and the signature before it
compiles it. Another process needing the same loop at that moment (the embedded cluster's
workers and the caller start a fit's kernels together) waits for the lock, then loads the loop
from the disk cache instead of compiling it again. On 2 cores, three processes compiling the
same loops at once each took three times as long as one alone. Loads from the cache take no
lock: only a compilation does.

The lock is ``fcntl.flock`` on a file in :func:`lock_dir`: the system drops it when its holder
dies, so a killed process never leaves a lock behind. A wait is bounded by
:data:`COMPILE_WAIT_S` (a holder stopped, or compiling on an overloaded machine): past it the
process compiles the loop itself, as numba alone would. Where no lock directory is writable,
or on a system without ``fcntl`` (Windows), every process compiles on its own, and where
numba's cache is not writable numba compiles in each process: the lock only ever saves work,
results never depend on it. Only a process's outermost compilation takes a lock (the loops it
calls are compiled with it), so a process never waits while it holds a lock.

numba's compile event (``numba.core.event``, "numba:compile", started after the cache was
looked up and found without the loop) is where the lock is taken; a process that had to wait
abandons its compilation there and looks in the cache again. Non-public numba used:
``numba.core.compiler_lock.global_compiler_lock`` (the process's own compile lock, taken first,
so that one thread of a process compiles at a time, as numba does anyway).
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
from numba.core import event
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

_dir_lock = threading.Lock()
_dir: list = []  # the lock directory found, once per process ([] not yet looked, [None]: none)
_local = threading.local()  # .attempt: the outermost compilation under way in this thread


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


class _LoadInstead(Exception):
    """Raised at the compile event of a loop another process compiled meanwhile: load it."""


class _Attempt:
    """The outermost compilation of a loop in this thread, and the lock it holds (if any)."""

    def __init__(self, dispatcher, args: tuple):
        self.dispatcher, self.args = dispatcher, args
        self.decided = False  # the lock was tried (at the compile event)
        self.fd = None

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def share_compiles(dispatcher):
    """Compile ``dispatcher``'s signatures under the machine-wide lock (see the module docstring)."""
    compile_here = dispatcher.compile

    def compile_shared(sig):
        if getattr(_local, "attempt", None) is not None:  # a callee of a compilation under way
            return compile_here(sig)
        args = tuple(sig) if isinstance(sig, tuple) else tuple(getattr(sig, "args", ()))
        with global_compiler_lock:
            attempt = _local.attempt = _Attempt(dispatcher, args)
            try:
                try:
                    return compile_here(sig)
                except _LoadInstead:  # compiled by another process: in the cache now
                    return compile_here(sig)  # (or compiled here, under the lock, if not)
            finally:
                _local.attempt = None
                attempt.release()

    dispatcher.compile = compile_shared
    return dispatcher


class _CompileListener(event.Listener):
    """Takes the lock at the start of an outermost compilation of a shared loop."""

    def on_start(self, evt) -> None:
        attempt = getattr(_local, "attempt", None)
        if attempt is None or attempt.decided:
            return
        if evt.data.get("dispatcher") is not attempt.dispatcher:
            return
        attempt.decided = True
        fd = open_lock(lock_key(attempt.dispatcher, attempt.args))
        if fd is None:
            return
        if _acquire(fd, 0.0):
            attempt.fd = fd  # this process compiles it; the others wait
            return
        if _acquire(fd, COMPILE_WAIT_S):
            attempt.fd = fd
            raise _LoadInstead
        os.close(fd)
        logger.info(
            "another process has compiled %s for %.0f s: compiling it here too",
            attempt.dispatcher.py_func.__qualname__,
            COMPILE_WAIT_S,
        )

    def on_end(self, evt) -> None:
        pass


event.register("numba:compile", _CompileListener())


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


def cache_dirs(beside_numba: str, *under_dkmeans: str) -> list[str]:
    """Where dkmeans keeps its files of this machine, most preferred first: ``beside_numba`` in
    numba's cache directory where ``NUMBA_CACHE_DIR`` names one; ``under_dkmeans`` in the
    user's cache directory (``$XDG_CACHE_HOME/dkmeans`` or ``~/.cache/dkmeans``); the same in a
    per-user folder of the temporary directory."""
    dirs = []
    if numba.config.CACHE_DIR:
        dirs.append(os.path.join(numba.config.CACHE_DIR, beside_numba))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    dirs.append(os.path.join(base, "dkmeans", *under_dkmeans))
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    dirs.append(os.path.join(tempfile.gettempdir(), f"dkmeans-{uid}", *under_dkmeans))
    return dirs


def _find_dir() -> str | None:
    for directory in cache_dirs("dkmeans-locks", "compile-locks"):
        try:
            os.makedirs(directory, exist_ok=True)
            if os.access(directory, os.W_OK):
                return directory
        except OSError:
            continue
    return None


def open_lock(key: str) -> int | None:
    """A descriptor of the lock file named ``key`` (created if need be), or None where there is
    no lock directory or no ``fcntl``."""
    directory = lock_dir() if fcntl is not None else None
    if directory is None:
        return None
    name = hashlib.sha256(f"{numba.__version__}:{key}".encode()).hexdigest()[:24]
    try:
        return os.open(
            os.path.join(directory, name + ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666
        )
    except OSError:
        return None


@contextlib.contextmanager
def machine_lock(key: str, wait_s: float | None = None):
    """Hold the machine-wide lock named ``key`` for the block: what a compilation takes (the
    tests hold one to stand for a process compiling, killed or hung). Yields whether it is
    held: False after ``wait_s`` seconds (default :data:`COMPILE_WAIT_S`), or without a lock file.
    """
    fd = open_lock(key)
    if fd is None:
        yield False
        return
    try:
        held = _acquire(fd, COMPILE_WAIT_S if wait_s is None else wait_s)
        try:
            yield held
        finally:
            if held:
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


__all__ = [
    "COMPILE_WAIT_S",
    "cache_dirs",
    "lock_dir",
    "lock_key",
    "machine_lock",
    "njit",
    "open_lock",
    "share_compiles",
]
