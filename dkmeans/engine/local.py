"""Chunks held in one process: the data protocol run as a plain loop (the one-task mode).

A driver given a :class:`LocalChunks` runs unchanged inside one task (see
:meth:`dkmeans.engine.persisted.PersistedData.run_loop`), or in the caller's process for
in-memory data and tests.
"""

from __future__ import annotations

import contextvars
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dkmeans.engine import kept
from dkmeans.engine.passes import first_chunk
from dkmeans.engine.protocol import InCallerLoop, PrunableData
from dkmeans.kernels.namespace import concatenate_rows, get_namespace, to_host


class ChunkList(InCallerLoop, PrunableData):
    """Chunks held in this process, with the data protocol's passes run as plain loops.

    The base of :class:`LocalChunks` (every chunk) and of an SPMD rank's chunks, which
    combine their passes with the other ranks' (:class:`dkmeans.engine.spmd.RankChunks`).
    ``passes`` counts the passes made. Built with :meth:`from_array`, it is also the data of
    a fit run in the caller's process (in-memory data, see :mod:`dkmeans.fit.service`). With
    ``threads > 1`` a pass runs its chunks on a pool of that many threads (the compiled
    kernels release the GIL); results are combined in chunk order, as in one thread.
    """

    kind = "local"
    in_memory = True

    loop_mode = "in-process"

    def __init__(self, blocks, weights, offsets, dtype, n_features, n_rows=None, threads: int = 1):
        self.blocks, self.weights, self.offsets = (
            list(blocks),
            list(weights),
            tuple(int(o) for o in offsets),
        )
        self.dtype, self.n_features = dtype, n_features
        self.n_rows = (
            int(sum(int(b.shape[0]) for b in self.blocks)) if n_rows is None else int(n_rows)
        )
        self.passes = 0
        self.loop_modes: list[str] = []
        self._pool = (
            ThreadPoolExecutor(threads, thread_name_prefix="dkmeans-chunks")
            if threads > 1 and len(self.blocks) > 1
            else None
        )

    @classmethod
    def from_array(cls, X, weights=None, n_chunks: int = 1, threads: int = 1) -> ChunkList:
        """An in-memory array (and weights) as ``n_chunks`` row chunks of about equal size (views, no copy)."""
        import numpy as np

        bounds = np.linspace(0, X.shape[0], n_chunks + 1).astype(int)
        blocks = [X[a:b] for a, b in zip(bounds, bounds[1:])]
        w = [None if weights is None else weights[a:b] for a, b in zip(bounds, bounds[1:])]
        chunks = cls(blocks, w, bounds[:-1], X.dtype, X.shape[1], threads=threads)
        chunks._whole = (X, weights)  # one call over all rows where per-row results are wanted
        return chunks

    _whole = None

    def labelled_pass(
        self,
        block_fn: Callable,
        args: Sequence[Any] = (),
        *,
        keep_labels: bool = True,
        per_label: int = 0,
    ):
        """See :meth:`dkmeans.engine.protocol.ChunkedData.labelled_pass` (the rows are here: labels kept)."""
        import numpy as np

        from dkmeans.kernels.quality import label_sums

        self.passes += 1
        if self._whole is not None:  # in one call, as inference on the same array computes it
            X, w = self._whole
            out = block_fn(X, *args, w)
        else:
            out = np.concatenate(
                self._each(lambda X, w: block_fn(X, *args, w), self.blocks, self.weights)
            )
        labels = out[:, 0].astype(np.int32) if keep_labels else None
        if per_label:
            return labels, float(out[:, 1].sum()), to_host(label_sums(out, per_label))
        return labels, float(out[:, 1].sum())

    def _each(self, fn, *per_chunk):
        """``[fn(*items) for items in zip(*per_chunk)]``, on the pool when there is one.

        Each call runs in a copy of the caller's context (the fit's kernel path travels with it).
        """
        if self._pool is None:
            return [fn(*items) for items in zip(*per_chunk)]
        futures = [
            self._pool.submit(contextvars.copy_context().run, fn, *items)
            for items in zip(*per_chunk)
        ]
        return [f.result() for f in futures]

    @property
    def has_weights(self) -> bool:
        return any(w is not None for w in self.weights)

    def _local(self, chunk_fn, combine_fn, args):
        self.passes += 1
        return to_host(
            combine_fn(
                self._each(
                    lambda X, w, o: chunk_fn(X, w, o, *args),
                    self.blocks,
                    self.weights,
                    self.offsets,
                )
            )
        )

    def _combine(self, value, combine_fn):
        """The combined value of every holder of chunks (here: this one)."""
        return value

    def map_reduce(self, chunk_fn: Callable, combine_fn: Callable, args: Sequence[Any] = ()):
        """``combine_fn`` of ``chunk_fn(X_i, w_i, row_offset_i, *args)`` over the chunks (host memory)."""
        return self._combine(self._local(chunk_fn, combine_fn, args), combine_fn)

    def map_reduce_stateful(
        self, chunk_fn: Callable, combine_fn: Callable, args: Sequence[Any] = (), state=None
    ):
        """See :meth:`dkmeans.engine.protocol.ChunkedData.map_reduce_stateful`; the state is a list per chunk."""
        self.passes += 1
        previous = state if state is not None else [None] * len(self.blocks)
        outputs = self._each(
            lambda X, w, o, s: chunk_fn(X, w, o, s, *args),
            self.blocks,
            self.weights,
            self.offsets,
            previous,
        )
        value = to_host(combine_fn([out for _, out in outputs]))
        return self._combine(value, combine_fn), [new for new, _ in outputs]

    def fold(
        self,
        chunk_fn: Callable,
        state,
        args: Sequence[Any] = (),
        *,
        stop=None,
        on_state=None,
        start_row: int = 0,
    ):
        """A sequential pass over the chunks in row order (``on_state`` after, ``stop`` before, each chunk)."""
        self.passes += 1
        first = first_chunk(self.offsets, [X.shape[0] for X in self.blocks], start_row)
        for X, w, o in list(zip(self.blocks, self.weights, self.offsets))[first:]:
            if stop is not None and stop(state):
                break
            state = to_host(chunk_fn(X, w, o, state, *args))
            if on_state is not None:
                on_state(state)
        return state

    def keep_state(self, key: str, tag, state) -> None:
        """See :meth:`dkmeans.engine.protocol.PrunableData.keep_state`: in this process's registry
        (:mod:`dkmeans.engine.kept`), by chunk (first row and rows)."""
        if state is not None:
            kept.keep(key, tag, self.offsets, [int(X.shape[0]) for X in self.blocks], state)

    def kept_state(self, key: str, tag):
        """See :meth:`dkmeans.engine.protocol.PrunableData.kept_state` (None where no chunk has
        any)."""
        states = kept.take(key, tag, self.offsets, [int(X.shape[0]) for X in self.blocks])
        return states if any(s is not None for s in states) else None

    def drop_state(self, key: str) -> None:
        """See :meth:`dkmeans.engine.protocol.PrunableData.drop_state`."""
        kept.drop(key)

    def row_state_bytes(self) -> float:
        """The rows are the caller's (or one task's, at most ``SINGLE_TASK_MAX_BYTES``): no budget here."""
        return float("inf")

    def state_column(self, state, name: str):
        """The per-row array ``name`` of the chunks' states, concatenated in row order."""
        xp = get_namespace(state[0][name])
        return xp.concatenate([s[name] for s in state])

    def rows(self, indices):
        """The rows at these global indices (host memory)."""
        import numpy as np

        out = []
        for i in np.asarray(indices, dtype=np.int64).ravel():
            for X, o in zip(self.blocks, self.offsets):
                if o <= i < o + X.shape[0]:
                    out.append(to_host(X[int(i - o) : int(i - o) + 1]))
                    break
            else:
                raise IndexError(f"row {int(i)} is not held here")
        return concatenate_rows(out) if out else np.empty((0, self.n_features), self.dtype)

    def release(self) -> None:
        """The chunks are the caller's arrays: only the thread pool, if any, is let go."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class LocalChunks(ChunkList):
    """Every chunk of the data, in one process (inside one task, or in the caller).

    The chunks are concatenated once (a copy, so only for data that fits one task), so
    a pass is one kernel call.
    """

    def __init__(self, blocks, weights, offsets, dtype, n_features):
        blocks, weights = list(blocks), list(weights)
        if (
            len(blocks) > 1
        ):  # one contiguous array: one kernel call per pass instead of one per chunk
            blocks = [concatenate_rows(blocks)]
            weights = [None if weights[0] is None else concatenate_rows(weights)]
            offsets = (0,)
        super().__init__(blocks, weights, offsets, dtype, n_features)


def split_blocks(refs, has_weights: bool) -> tuple[list, list]:
    """The chunk blocks and their weights (None without weights) from :meth:`PersistedData.chunk_refs`' order."""
    step = 2 if has_weights else 1
    blocks = list(refs[::step])
    return blocks, (list(refs[1::step]) if has_weights else [None] * len(blocks))


def run_in_one_task(fn, args, offsets, has_weights, dtype, n_features, *refs):
    """``fn(LocalChunks, *args)`` on a worker: ``(result, passes, warnings)`` (runs in a task)."""
    blocks, weights = split_blocks(refs, has_weights)
    chunks = LocalChunks(blocks, weights, offsets, dtype, n_features)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(chunks, *args)
    return result, chunks.passes, [(str(w.message), w.category) for w in caught]


def reraise_warnings(caught) -> None:
    """Raise again, in the caller, the ``(message, category)`` warnings a task recorded."""
    for message, category in caught:
        warnings.warn(message, category, stacklevel=3)
