"""Memory a worker process can give back: run on workers (``client.run``) before planning and when paused.

Its own module, importing nothing of the engine: the budget (:mod:`.memory`) and the waits
(:mod:`.futures`) both send it to workers.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import sys


def release_memory() -> None:
    """Give the memory the allocators keep back to the OS: Python's garbage, glibc's free heap
    (``malloc_trim``), and pyarrow's memory pool (which keeps freed buffers for the next read:
    about 300 MiB after a plain ``dd.read_parquet`` pass over 64 MB files)."""
    gc.collect()
    if "pyarrow" in sys.modules:  # never imported here just to release it
        with contextlib.suppress(Exception):
            sys.modules["pyarrow"].default_memory_pool().release_unused()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)


__all__ = ["release_memory"]
