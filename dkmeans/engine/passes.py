"""The reduction tree that ends every pass graph (persisted and streamed data).

Each task of a pass returns ``(value, moved)``: its chunks' combined result and whether it
ran away from its planned worker. Combine tasks fold ``fan_in`` of them at a time, so a
pass has O(tasks / fan_in) combine tasks and the caller combines the last few.
"""

from __future__ import annotations

import dataclasses
import uuid
import warnings
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.sizeof import sizeof
from dask.task_spec import DataNode, List, Task, TaskRef

from dkmeans.kernels.namespace import to_host

#: A task argument larger than this (the centroids at large k, a loop's state) goes into a
#: graph once, as a data key its tasks reference, rather than as a copy inside every task.
SHARED_ARG_BYTES = 2**20


def _nbytes(value) -> int:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(_nbytes(getattr(value, f.name)) for f in dataclasses.fields(value))
    return int(sizeof(value))


def task_args(args: Sequence[Any], token: str, layers: dict, deps: dict) -> tuple[Any, set]:
    """``args`` as one argument of the tasks of a graph being built: ``(argument, keys it needs)``.

    Small arguments travel inside each task. Each one over :data:`SHARED_ARG_BYTES` becomes
    a data key of ``layers`` (added once per graph, whatever the number of tasks; a worker
    fetches it once), referenced from the argument; the tasks must depend on the returned
    keys. The tasks receive a sequence either way.
    """
    args = tuple(args)
    large = [i for i, value in enumerate(args) if _nbytes(value) > SHARED_ARG_BYTES]
    if not large:
        return args, set()
    items, keys = [], set()
    for i, value in enumerate(args):
        if i in large:
            key = f"dkmeans-arg-{token}-{i}"
            layers[key] = MaterializedLayer({key: DataNode(key, value)})
            deps[key] = set()
            items.append(TaskRef(key))
            keys.add(key)
        else:
            items.append(DataNode(None, value))  # a literal: never parsed as a task
    return List(*items), keys


@contextmanager
def submitting_own_graph():
    """Silence distributed's "Sending large graph" warning for a graph we built.

    Its advice (scatter the data) is for user graphs; ours hold large arguments once, on
    purpose (a scattered value could not be recomputed after a worker is lost).
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sending large graph", category=UserWarning)
        yield


def combine_task(combine_fn, *parts):
    """Combine ``(value, moved)`` parts (runs on a worker); ``moved`` may be a number (the largest is kept:
    a streamed task's measured peak memory)."""
    return combine_fn([p[0] for p in parts]), max(p[1] for p in parts)


def add_reduction_tree(
    layers: dict, deps: dict, current: list, combine_fn: Callable, token: str, fan_in: int = 8
) -> list:
    """Add combine layers over the task keys ``current`` until at most ``fan_in`` remain; return those keys."""
    level = 0
    while len(current) > fan_in:
        nxt = []
        for g in range(0, len(current), fan_in):
            group = current[g : g + fan_in]
            key = f"dkmeans-combine-{token}-{level}-{g // fan_in}"
            layers[key] = MaterializedLayer(
                {key: Task(key, combine_task, combine_fn, *[TaskRef(k) for k in group])}
            )
            deps[key] = set(group)
            nxt.append(key)
        current = nxt
        level += 1
    return current


def fold_task(chunk_fn, args, offset, state, X, w=None):
    """One step of a sequential pass: ``chunk_fn(X, w, offset, state[0], *args)`` (runs on a worker)."""
    return to_host(chunk_fn(X, w, offset, state[0], *args))


def first_chunk(offsets: Sequence[int], chunk_rows: Sequence[int], start_row: int) -> int:
    """Index of the first chunk with a row at or after global row ``start_row`` (``len`` if none)."""
    ends = np.asarray(offsets, dtype=np.int64) + np.asarray(chunk_rows, dtype=np.int64)
    return int(np.searchsorted(ends, int(start_row), side="right"))


def fold_chunks(
    client,
    n_chunks: int,
    chunk_refs: Callable[[int], list],
    offsets: Sequence[int],
    chunk_fn: Callable,
    state: Any,
    args: Sequence[Any],
    *,
    window: int,
    stop: Callable[[Any], bool] | None = None,
    on_state: Callable[[Any], None] | None = None,
    first: int = 0,
    source_layers: dict | None = None,
    source_deps: dict | None = None,
    parents: set | None = None,
    gather_fn: Callable | None = None,
    on_window: Callable[[int], None] | None = None,
) -> Any:
    """A sequential pass over chunks ``first, first + 1, ...`` in row order, ``window`` chunks per graph.

    Each graph chains ``window`` tasks: task ``i`` takes chunk ``i`` (``chunk_refs(i)``:
    its block, and its weights) and the state the task before it returned, so the reads of
    a window run in parallel while the (small) state moves from chunk to chunk. Between
    windows the state comes back here: ``on_state(state)`` sees it after each window,
    ``stop(state)`` ends the pass early (later chunks are never read), and at most one
    window of chunks is held at a time. Chunks before ``first`` are not read at all.
    ``source_layers``, ``source_deps`` and ``parents`` are the graph the chunks are read
    from (streamed data); persisted chunks need none. ``on_window(i)`` is told, after each
    window, that the chunks before ``i`` are done.
    """
    token = uuid.uuid4().hex[:12]
    window = max(1, int(window))
    for start in range(first, n_chunks, window):
        if stop is not None and stop(state):
            break
        layers = dict(source_layers or {})
        deps = dict(source_deps or {})
        shared, needs = task_args(args, f"{token}-{start}", layers, deps)
        head, head_needs = task_args((state,), f"{token}-{start}-state", layers, deps)
        previous = None
        for i in range(start, min(n_chunks, start + window)):
            key = f"dkmeans-fold-{token}-{i}"
            prev_arg = head if previous is None else List(TaskRef(previous))
            task = Task(key, fold_task, chunk_fn, shared, int(offsets[i]), prev_arg, *chunk_refs(i))
            layers[key] = MaterializedLayer({key: task})
            deps[key] = (
                set(parents or ()) | needs | ({previous} if previous is not None else head_needs)
            )
            previous = key
        with submitting_own_graph():
            future = client.get(HighLevelGraph(layers, deps), [previous], sync=False)[0]
        state = gather_fn(future) if gather_fn is not None else future.result()
        if on_state is not None:
            on_state(state)
        if on_window is not None:
            on_window(min(n_chunks, start + window))
    return state


__all__ = [
    "SHARED_ARG_BYTES",
    "add_reduction_tree",
    "combine_task",
    "first_chunk",
    "fold_chunks",
    "fold_task",
    "submitting_own_graph",
    "task_args",
]
