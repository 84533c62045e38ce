"""The data protocol with every chunk function and loop run inside a caller's context.

The fit service uses it to run one fit's kernels on one code path wherever its tasks run
(:func:`dkmeans.kernels.backends.compile.pinned`); the engine only passes the calls through, and
knows nothing of what the context is.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence


class InContext:
    """``data`` (any implementation of the protocol) whose functions run through ``call``.

    ``call(fn, *args)`` must call ``fn(*args)`` and be picklable (tasks carry it): a
    module-level function, or a :func:`functools.partial` of one. Every other attribute
    is ``data``'s own.
    """

    def __init__(self, data, call: Callable):
        self._data = data
        self._call = call

    def __getattr__(self, name: str) -> Any:
        if name in ("_data", "_call") or name.startswith("__"):  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self._data, name)

    def _wrap(self, fn: Callable) -> Callable:
        return _named(functools.partial(self._call, fn), fn)

    def map_reduce(self, chunk_fn: Callable, combine_fn: Callable, args: Sequence[Any] = (), **kwargs) -> Any:
        return self._data.map_reduce(self._wrap(chunk_fn), combine_fn, args, **kwargs)

    def map_reduce_stateful(self, chunk_fn: Callable, combine_fn: Callable, args: Sequence[Any] = (),
                            state: Any = None):
        return self._data.map_reduce_stateful(self._wrap(chunk_fn), combine_fn, args, state)

    def fold(self, chunk_fn: Callable, state: Any, args: Sequence[Any] = (), **kwargs) -> Any:
        return self._data.fold(self._wrap(chunk_fn), state, args, **kwargs)

    def labelled_pass(self, block_fn: Callable, args: Sequence[Any] = (), **kwargs):
        return self._data.labelled_pass(self._wrap(block_fn), args, **kwargs)

    def run_loop(self, fn: Callable, args: Sequence[Any] = (), **kwargs) -> Any:
        # the loop gets the data it runs over (in a task, or this object's own when it runs
        # here, one graph per pass) in the context too, so its passes' tasks are wrapped
        return self._data.run_loop(_named(functools.partial(_loop_in_context, self._call, fn), fn), args, **kwargs)


def _named(wrapper: functools.partial, fn: Callable) -> functools.partial:
    """``wrapper`` under ``fn``'s name (task keys and progress name the function, not the wrapper)."""
    wrapper.__name__ = getattr(fn, "__name__", type(fn).__name__)
    wrapper.__qualname__ = getattr(fn, "__qualname__", wrapper.__name__)
    return wrapper


def _loop_in_context(call: Callable, fn: Callable, data, *args):
    return call(fn, InContext(data, call), *args)


__all__ = ["InContext"]
