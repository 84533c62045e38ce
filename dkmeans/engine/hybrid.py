"""Data that mostly fits: the head persisted on the workers, the tail read from its source in every pass.

When the data is larger than the cluster's persist budget but not by much, streaming all
of it would read from the source what memory could have held. :class:`HybridData` keeps
the leading chunks that fit the budget persisted (:class:`~dkmeans.engine.persisted.PersistedData`)
and streams the rest (:class:`~dkmeans.engine.streamed.StreamedData`); each pass runs on
both at once and combines the two results, head first, so draws and results are those of
either mode (rows keep their global indices).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import dask.array as da
import numpy as np

from dkmeans.engine.persisted import PersistedData
from dkmeans.engine.protocol import InCallerLoop, SummedLabels
from dkmeans.engine.streamed import StreamedData


class HybridData(SummedLabels, InCallerLoop):
    """The data protocol over a persisted head and a streamed tail (see the module docstring)."""

    kind = "hybrid"
    in_memory = False

    loop_mode = "hybrid"

    def __init__(self, head: PersistedData, tail: StreamedData):
        if head.first_row != 0 or tail.first_row != head.n_rows:
            raise ValueError("the tail must start where the head ends")
        self.head, self.tail = head, tail
        self.n_rows = head.n_rows + tail.n_rows
        self.n_features = head.n_features
        self.dtype = head.dtype
        self.generation = head.generation
        self.client = head.client
        self.loop_modes: list[str] = []
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="dkmeans-hybrid")

    @property
    def has_weights(self) -> bool:
        return self.head.has_weights

    @property
    def passes(self) -> int:
        return self.tail.passes

    @property
    def nbytes(self) -> int:
        return self.head.nbytes + self.tail.nbytes

    def watch_passes(self, callback) -> None:
        """Progress of each pass, as its streamed part reads its pieces (the persisted head's
        chunks run beside them: see :meth:`StreamedData.watch_passes`)."""
        self.tail.watch_passes(callback)

    def map_reduce(self, chunk_fn: Callable, combine_fn: Callable, args: Sequence[Any] = ()):
        """Both parts at once (the head's pass in a thread); their results combined head first."""
        head = self._pool.submit(self.head.map_reduce, chunk_fn, combine_fn, args)
        tail = self.tail.map_reduce(chunk_fn, combine_fn, args)
        return combine_fn([head.result(), tail])

    def map_reduce_stateful(
        self, chunk_fn: Callable, combine_fn: Callable, args: Sequence[Any] = (), state=None
    ):
        head_state, tail_state = state if state is not None else (None, None)
        head = self._pool.submit(
            self.head.map_reduce_stateful, chunk_fn, combine_fn, args, head_state
        )
        tail, tail_state = self.tail.map_reduce_stateful(chunk_fn, combine_fn, args, tail_state)
        head, head_state = head.result()
        return combine_fn([head, tail]), (head_state, tail_state)

    def fold(
        self,
        chunk_fn: Callable,
        state: Any,
        args: Sequence[Any] = (),
        *,
        stop=None,
        on_state=None,
        start_row: int = 0,
    ):
        """The head's chunks, then the tail's, in row order (rows keep their global indices)."""
        state = self.head.fold(
            chunk_fn, state, args, stop=stop, on_state=on_state, start_row=start_row
        )
        return self.tail.fold(
            chunk_fn, state, args, stop=stop, on_state=on_state, start_row=start_row
        )

    def row_state_bytes(self) -> float:
        """The streamed tail keeps no per-row state for a whole loop."""
        return 0.0

    def state_column(self, state, name: str) -> da.Array:
        return da.concatenate(
            [self.head.state_column(state[0], name), self.tail.state_column(state[1], name)]
        )

    def rows(self, indices) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64)
        in_head = idx < self.head.n_rows
        out = np.empty((len(idx), self.n_features), dtype=self.dtype)
        if in_head.any():
            out[in_head] = self.head.rows(idx[in_head])
        if (~in_head).any():
            out[~in_head] = self.tail.rows(idx[~in_head])
        return out

    def release(self) -> None:
        self.head.release()
        self.tail.release()
        self._pool.shutdown(wait=False)


__all__ = ["HybridData"]
