"""The data protocol: chunked data you can map-reduce over.

Drivers (Lloyd, Hartigan, the seedings) see only this. The engine implements it four
ways, and chooses which one a fit gets:

* :class:`~dkmeans.engine.persisted.PersistedData`: chunks persisted on the workers,
  one graph per pass with O(workers) tasks;
* :class:`~dkmeans.engine.local.LocalChunks`: all chunks in one process (inside one task,
  or in the caller for tests);
* :class:`~dkmeans.engine.spmd.RankChunks`: one SPMD rank's chunks, whose passes end in
  an allreduce with the other ranks;
* :class:`~dkmeans.engine.streamed.StreamedData`: chunks read from their source in every
  pass and dropped after the kernel ran (data larger than the cluster's memory).

A chunk function is ``chunk_fn(X_i, w_i, row_offset_i, *args)``: ``X_i`` a 2-D NumPy or
CuPy block of rows, ``w_i`` its weights (None without weights), ``row_offset_i`` the global
index of its first row (every random draw touching rows is keyed by the global row index,
so results do not depend on the chunking). ``combine_fn(list_of_results)`` must be
associative: it runs per worker, across workers and on the caller, in chunk order.
Results must be small (centroid-sized), never per-row.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

import numpy as np


class InCallerLoop:
    """``run_loop`` and ``report`` of data whose loops run right here, in the caller's thread,
    pass by pass (not inside a task): in-process chunks, streamed, hybrid and shared-pass data.

    A class sets :attr:`loop_mode`, the name ``run_loop`` records in its ``loop_modes``.
    """

    #: what ``run_loop`` appends to ``loop_modes``
    loop_mode = "in-process"
    _on_progress = None

    def run_loop(self, fn: Callable, args: Sequence[Any] = (), *, work_per_row: float = 0.0,
                 on_progress: Callable[[dict], Any] | None = None):
        """``fn(self, *args)`` right here; its reports go to ``on_progress``."""
        self._on_progress = on_progress
        try:
            return fn(self, *args)
        finally:
            self._on_progress = None
            self.loop_modes.append(self.loop_mode)

    def report(self, record: dict) -> bool:
        """See :meth:`ChunkedData.report` (True: asked to stop)."""
        return self._on_progress is not None and bool(self._on_progress(record))


class ChunkedData(Protocol):
    """Row-chunked data (and optional weights) a driver can make passes over."""

    #: total rows, features, and the dtype of the rows (float32 or float64)
    n_rows: int
    n_features: int
    dtype: np.dtype

    #: whether the rows stay in memory for the whole fit (in this process or persisted on the
    #: workers); False: they are read from their source in every pass (out-of-core)
    in_memory: bool
    #: the passes made over the rows so far
    passes: int

    @property
    def has_weights(self) -> bool:
        """Whether rows carry a ``sample_weight``."""

    def labelled_pass(self, block_fn: Callable, args: Sequence[Any] = (), *, keep_labels: bool = True,
                      per_label: int = 0):
        """One pass of ``block_fn(X_i, *args, w_i)``, which gives ``(n_i, 2)`` float64: a label and a value per row.

        Returns ``(labels, total)``: the labels (int32) where the rows are kept (an array in
        this process, or a Dask array persisted beside persisted rows; None for rows read
        from their source, or without ``keep_labels``) and the sum of the values.
        ``per_label=k`` (labels ``0 .. k-1``): ``block_fn`` gives ``(n_i, 3)``, a label, a
        value and a weight per row, and ``(labels, total, sums)`` comes back, ``sums``
        ``(k, 2)`` float64 the per-label sums of the values and of the weights, from the
        same pass (:func:`dkmeans.kernels.quality.label_sums` per chunk, summed).
        """

    def map_reduce(self, chunk_fn: Callable, combine_fn: Callable, args: Sequence[Any] = ()) -> Any:
        """``combine_fn`` of ``chunk_fn(X_i, w_i, row_offset_i, *args)`` over every chunk (host memory)."""

    def map_reduce_stateful(self, chunk_fn: Callable, combine_fn: Callable, args: Sequence[Any] = (),
                            state: Any = None) -> tuple[Any, Any]:
        """A pass that keeps small per-chunk state between passes.

        ``chunk_fn(X_i, w_i, row_offset_i, state_i, *args) -> (new_state_i, result_i)``,
        ``state_i`` None in the first pass; returns ``(combined result, new state)``.
        Dropping the returned state frees it.
        """

    def fold(self, chunk_fn: Callable, state: Any, args: Sequence[Any] = (), *,
             stop: Callable[[Any], bool] | None = None, on_state: Callable[[Any], None] | None = None,
             start_row: int = 0) -> Any:
        """A sequential pass in row order: ``state = chunk_fn(X_i, w_i, row_offset_i, state, *args)``.

        The state (small: centroid-sized) travels from chunk to chunk, where the chunks
        are; returns the state after the last chunk. Between groups of chunks it comes
        back to the caller: ``on_state(state)`` sees it there (a checkpoint), then
        ``stop(state)`` may end the pass early (later chunks are then not read). Chunks
        whose rows all lie before global row ``start_row`` are not read at all (a pass
        resumed from a checkpoint); a chunk holding ``start_row`` is given whole, and
        ``chunk_fn`` drops the rows before it (the chunking may differ from the run that
        saved the position). Not for use inside :meth:`run_loop`.
        """

    def keep_state(self, key: str, tag: Any, state: Any) -> None:
        """Keep the per-chunk ``state`` of :meth:`map_reduce_stateful` where the chunks are, for a later
        :meth:`run_loop` on the same data (called inside ``run_loop``'s function, at its end).

        The engine stores it opaquely under ``key`` (the driver's) and ``tag`` (what the driver needs
        to find the state it stored): in this process, or in the worker process that ran the loop
        (:mod:`dkmeans.engine.kept`). Nothing is guaranteed to be found again (another worker, a
        restarted one, a loop run elsewhere): see :meth:`kept_state`.
        """

    def kept_state(self, key: str, tag: Any) -> Any:
        """The state :meth:`keep_state` stored under ``key`` and ``tag``, taken out (a state for
        :meth:`map_reduce_stateful`, with None for chunks whose state was not found), or None where
        none was found."""

    def drop_state(self, key: str) -> None:
        """Free every state stored under ``key`` (called by the driver, outside :meth:`run_loop`)."""

    def row_state_bytes(self) -> float:
        """Bytes per row of per-chunk state (:meth:`map_reduce_stateful`) that the memory budget leaves
        room for beside the rows, for a whole loop (``inf`` in this process; 0 for rows read from
        their source, which keep no state between passes)."""

    def state_column(self, state: Any, name: str) -> Any:
        """The per-row array ``name`` of every chunk's state dict, in row order (a lazy handle)."""

    def rows(self, indices) -> np.ndarray:
        """The rows at these global indices, as a host array."""

    def run_loop(self, fn: Callable, args: Sequence[Any] = (), *, work_per_row: float,
                 on_progress: Callable[[dict], None] | None = None) -> Any:
        """``fn(data, *args)`` where the engine finds it fastest; returns its result.

        ``fn`` runs a loop of passes over the ``data`` it is given (this object or
        another implementation of the protocol holding the same rows: one task's chunks,
        one SPMD rank's). ``work_per_row`` (multiply-adds per row and pass) lets the
        engine choose; the result must not depend on the choice beyond float rounding of
        combined sums. Records ``fn`` passes to ``data.report`` reach ``on_progress``
        (at the latest when ``fn`` returns); ``on_progress`` returning True asks the loop to
        stop (:meth:`report`).
        """

    def report(self, record: dict) -> bool:
        """Progress from inside :meth:`run_loop` (a plain dict); sent on to its ``on_progress``.

        Returns True where the caller asked the loop to stop: ``on_progress`` returned True (a
        scikit-learn callback's stop request). The loop then stops at this iteration boundary,
        with a valid state. Where the loop runs matters: in this process (in-memory data, one
        graph per pass, streamed, shared) the answer is ``on_progress``'s own; in SPMD every rank
        gets True at the same later iteration (rank 0 sends the request with its next exchange);
        in one task nothing reaches the loop while it runs (its records are reported when it
        ends: the request is then honoured between blocks).
        """


__all__ = ["ChunkedData"]
