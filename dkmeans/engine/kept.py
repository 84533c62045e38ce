"""Per-chunk state kept in a process between loops (one block of a driver's loop and the next).

A loop run inside a task (one task, or an SPMD rank) loses its memory when the task ends. A
driver whose per-chunk state (:meth:`~dkmeans.engine.protocol.ChunkedData.map_reduce_stateful`)
is worth keeping for the next block stores it with
:meth:`~dkmeans.engine.protocol.PrunableData.keep_state` and picks it up with
:meth:`~dkmeans.engine.protocol.PrunableData.kept_state`; held in this process (the caller's or
a worker's), it lives in this registry, keyed by the driver's ``key`` and each chunk's first row
and row count. The engine knows nothing of what the state is: the driver checks it (``tag``: a
state stored under another tag is not given back) and rebuilds what is missing.

The registry holds the states of at most :data:`MAX_KEYS` keys: storing under a new key drops the
oldest, so a fit that failed before dropping its state leaves it only until the next ones
store theirs. Taking a chunk's state removes it (one copy at a time).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

#: Keys whose states the registry holds at most (the oldest is dropped).
MAX_KEYS = 4

_lock = threading.Lock()
_registry: OrderedDict[str, dict] = OrderedDict()  # key -> {(first row, rows): (tag, state)}


def keep(
    key: str, tag: Any, offsets: Sequence[int], rows: Sequence[int], states: Sequence[Any]
) -> None:
    """Store each chunk's state (None: nothing) under ``key`` and ``tag``, replacing what the key held
    for these chunks."""
    with _lock:
        held = _registry.pop(key, {})
        for offset, n, state in zip(offsets, rows, states):
            held.pop((int(offset), int(n)), None)
            if state is not None:
                held[int(offset), int(n)] = (tag, state)
        _registry[key] = held
        while len(_registry) > MAX_KEYS:
            _registry.popitem(last=False)


def take(key: str, tag: Any, offsets: Sequence[int], rows: Sequence[int]) -> list:
    """Each chunk's state stored under ``key`` with this ``tag`` (None where there is none), taken out."""
    out = []
    with _lock:
        held = _registry.get(key, {})
        for offset, n in zip(offsets, rows):
            entry = held.pop((int(offset), int(n)), None)
            out.append(entry[1] if entry is not None and entry[0] == tag else None)
    return out


def drop(key: str | None = None) -> None:
    """Drop the states stored under ``key`` (every key: None)."""
    with _lock:
        if key is None:
            _registry.clear()
        else:
            _registry.pop(key, None)


def keys() -> list:
    """The keys holding states (tests)."""
    with _lock:
        return [k for k, held in _registry.items() if held]


__all__ = ["MAX_KEYS", "drop", "keep", "keys", "take"]
