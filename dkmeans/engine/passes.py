"""The reduction tree that ends every pass graph (persisted and streamed data).

Each task of a pass returns ``(value, moved)``: its chunks' combined result and whether it
ran away from its planned worker. Combine tasks fold ``fan_in`` of them at a time, so a
pass has O(tasks / fan_in) combine tasks and the caller combines the last few.
"""

from __future__ import annotations

from typing import Callable

from dask.highlevelgraph import MaterializedLayer
from dask.task_spec import Task, TaskRef


def combine_task(combine_fn, *parts):
    """Combine ``(value, moved)`` parts (runs on a worker)."""
    return combine_fn([p[0] for p in parts]), any(p[1] for p in parts)


def add_reduction_tree(layers: dict, deps: dict, current: list, combine_fn: Callable, token: str,
                       fan_in: int = 8) -> list:
    """Add combine layers over the task keys ``current`` until at most ``fan_in`` remain; return those keys."""
    level = 0
    while len(current) > fan_in:
        nxt = []
        for g in range(0, len(current), fan_in):
            group = current[g : g + fan_in]
            key = f"dkmeans-combine-{token}-{level}-{g // fan_in}"
            layers[key] = MaterializedLayer({key: Task(key, combine_task, combine_fn, *[TaskRef(k) for k in group])})
            deps[key] = set(group)
            nxt.append(key)
        current = nxt
        level += 1
    return current


__all__ = ["add_reduction_tree", "combine_task"]
