"""The data protocol: chunked data you can map-reduce over.

Drivers (Lloyd, Hartigan, the seedings) see only this: :class:`ChunkedData`, the base every
implementation subclasses (as faiss's ``DatasetAssign`` variants do), overriding what differs.
The engine implements it six ways, and chooses which one a fit gets:

* :class:`~dkmeans.engine.persisted.PersistedData`: chunks persisted on the workers,
  one graph per pass with O(workers) tasks;
* :class:`~dkmeans.engine.local.ChunkList` / :class:`~dkmeans.engine.local.LocalChunks`:
  chunks in one process (inside one task, or in the caller for in-memory data);
* :class:`~dkmeans.engine.spmd.RankChunks`: one SPMD rank's chunks, whose passes end in
  an allreduce with the other ranks;
* :class:`~dkmeans.engine.streamed.StreamedData`: chunks read from their source in every
  pass and dropped after the kernel ran (data larger than the cluster's memory);
* :class:`~dkmeans.engine.hybrid.HybridData`: a persisted head and a streamed tail;
* :class:`~dkmeans.engine.shared_passes.SharedView`: one job's passes, combined with other
  jobs' (the k sweep).

Optional capabilities are classes of their own, which a driver tests for with ``isinstance``:
:class:`PrunableData` keeps per-chunk state between loops (pruned Lloyd's bounds).

A chunk function is ``chunk_fn(X_i, w_i, row_offset_i, *args)``: ``X_i`` a 2-D NumPy or
CuPy block of rows, ``w_i`` its weights (None without weights), ``row_offset_i`` the global
index of its first row (every random draw touching rows is keyed by the global row index,
so results do not depend on the chunking). ``combine_fn(list_of_results)`` must be
associative: it runs per worker, across workers and on the caller, in chunk order.
Results must be small (centroid-sized), never per-row.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


class ChunkedData(abc.ABC):
    """Row-chunked data (and optional weights) a driver can make passes over: the base of every
    implementation (see the module docstring)."""

    #: what the data is, in words ("local", "persisted", "streamed", "hybrid", "shared")
    kind: str
    #: total rows, features, and the dtype of the rows (float32 or float64)
    n_rows: int
    n_features: int
    dtype: np.dtype

    #: whether the rows stay in memory for the whole fit (in this process or persisted on the
    #: workers); False: they are read from their source in every pass (out-of-core)
    in_memory: bool
    #: the passes made over the rows so far
    passes: int
    #: how each :meth:`run_loop` ran ("in-process", "one-task", "spmd", "graph", "streamed",
    #: "hybrid", "shared"), in order: the fit's result reports them
    loop_modes: list[str]

    #: The fit's kernel plan (:class:`dkmeans.kernels.plans.KernelPlan`, set by the placement):
    #: every task of a pass runs its kernels under it. None: the plan in force where a kernel
    #: runs (the caller's, for data in this process; the workers' own config in tasks).
    plan = None

    def _planned(self, fn: Callable) -> Callable:
        """``fn`` under the data's kernel plan wherever it runs (tasks included)."""
        return fn if self.plan is None else self.plan.bind(fn)

    @property
    @abc.abstractmethod
    def has_weights(self) -> bool:
        """Whether rows carry a ``sample_weight``."""

    @abc.abstractmethod
    def labelled_pass(
        self,
        block_fn: Callable,
        args: Sequence[Any] = (),
        *,
        keep_labels: bool = True,
        per_label: int = 0,
    ):
        """One pass of ``block_fn(X_i, *args, w_i)``, which gives ``(n_i, 2)`` float64: a label
        and a value per row.

        Returns ``(labels, total)``: the labels (int32) where the rows are kept (an array in
        this process, or a Dask array persisted beside persisted rows; None for rows read
        from their source, or without ``keep_labels``) and the sum of the values.
        ``per_label=k`` (labels ``0 .. k-1``): ``block_fn`` gives ``(n_i, 3)``, a label, a
        value and a weight per row, and ``(labels, total, sums)`` comes back, ``sums``
        ``(k, 2)`` float64 the per-label sums of the values and of the weights, from the
        same pass (:func:`dkmeans.kernels.quality.label_sums` per chunk, summed).
        """

    @abc.abstractmethod
    def map_reduce(self, chunk_fn: Callable, combine_fn: Callable, args: Sequence[Any] = ()) -> Any:
        """``combine_fn`` of ``chunk_fn(X_i, w_i, row_offset_i, *args)`` over every chunk (host
        memory)."""

    @abc.abstractmethod
    def map_reduce_stateful(
        self, chunk_fn: Callable, combine_fn: Callable, args: Sequence[Any] = (), state: Any = None
    ) -> tuple[Any, Any]:
        """A pass that keeps small per-chunk state between passes.

        ``chunk_fn(X_i, w_i, row_offset_i, state_i, *args) -> (new_state_i, result_i)``,
        ``state_i`` None in the first pass; returns ``(combined result, new state)``.
        Dropping the returned state frees it.
        """

    @abc.abstractmethod
    def fold(
        self,
        chunk_fn: Callable,
        state: Any,
        args: Sequence[Any] = (),
        *,
        stop: Callable[[Any], bool] | None = None,
        on_state: Callable[[Any], None] | None = None,
        start_row: int = 0,
    ) -> Any:
        """A sequential pass in row order: ``state = chunk_fn(X_i, w_i, row_offset_i, state,
        *args)``.

        The state (small: centroid-sized) travels from chunk to chunk, where the chunks
        are; returns the state after the last chunk. Between groups of chunks it comes
        back to the caller: ``on_state(state)`` sees it there (a checkpoint), then
        ``stop(state)`` may end the pass early (later chunks are then not read). Chunks
        whose rows all lie before global row ``start_row`` are not read at all (a pass
        resumed from a checkpoint); a chunk holding ``start_row`` is given whole, and
        ``chunk_fn`` drops the rows before it (the chunking may differ from the run that
        saved the position). Not for use inside :meth:`run_loop`.
        """

    @abc.abstractmethod
    def row_state_bytes(self) -> float:
        """Bytes per row of per-chunk state (:meth:`map_reduce_stateful`) that the memory budget
        leaves room for beside the rows, for a whole loop (``inf`` in this process; 0 for rows
        read from their source, which keep no state between passes)."""

    @abc.abstractmethod
    def state_column(self, state: Any, name: str) -> Any:
        """The per-row array ``name`` of every chunk's state dict, in row order (a lazy handle)."""

    @abc.abstractmethod
    def rows(self, indices) -> np.ndarray:
        """The rows at these global indices, as a host array."""

    @abc.abstractmethod
    def run_loop(
        self,
        fn: Callable,
        args: Sequence[Any] = (),
        *,
        work_per_row: float = 0.0,
        on_progress: Callable[[dict], Any] | None = None,
    ) -> Any:
        """``fn(data, *args)`` where the engine finds it fastest; returns its result.

        ``fn`` runs a loop of passes over the ``data`` it is given (this object or
        another implementation of the protocol holding the same rows: one task's chunks,
        one SPMD rank's). ``work_per_row`` (multiply-adds per row and pass) lets the
        engine choose; the result must not depend on the choice beyond float rounding of
        combined sums. Records ``fn`` passes to ``data.report`` reach ``on_progress``
        (at the latest when ``fn`` returns); ``on_progress`` returning True asks the loop to
        stop (:meth:`report`). The loop's mode is appended to :attr:`loop_modes`.
        """

    @abc.abstractmethod
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

    @abc.abstractmethod
    def release(self) -> None:
        """Let go of what the data holds (persisted chunks, threads), by whoever placed it; a
        second call finds nothing to let go."""


class PrunableData(ChunkedData):
    """The capability of keeping per-chunk state where the chunks are, from one :meth:`run_loop`
    to a later one on the same data (pruned Lloyd's bounds: :mod:`dkmeans.drivers.pruned_lloyd`
    tests for it with ``isinstance``). Data in this process, one task's or SPMD rank's chunks,
    and persisted data have it; rows read from their source and shared views do not."""

    @abc.abstractmethod
    def keep_state(self, key: str, tag: Any, state: Any) -> None:
        """Keep the per-chunk ``state`` of :meth:`map_reduce_stateful` where the chunks are, for a
        later :meth:`run_loop` on the same data (called inside ``run_loop``'s function, at its end).

        The engine stores it opaquely under ``key`` (the driver's) and ``tag`` (what the driver
        needs to find the state it stored): in this process, or in the worker process that ran
        the loop (:mod:`dkmeans.engine.kept`). Nothing is guaranteed to be found again (another
        worker, a restarted one, a loop run elsewhere): see :meth:`kept_state`.
        """

    @abc.abstractmethod
    def kept_state(self, key: str, tag: Any) -> Any:
        """The state :meth:`keep_state` stored under ``key`` and ``tag``, taken out (a state for
        :meth:`map_reduce_stateful`, with None for chunks whose state was not found), or None where
        none was found."""

    @abc.abstractmethod
    def drop_state(self, key: str) -> None:
        """Free every state stored under ``key`` (by the driver, outside :meth:`run_loop`)."""


class InCallerLoop(ChunkedData):
    """``run_loop`` and ``report`` of data whose loops run right here, in the caller's thread,
    pass by pass (not inside a task): in-process chunks, streamed, hybrid and shared-pass data.

    A class sets :attr:`loop_mode`, the name ``run_loop`` records in its ``loop_modes``.
    """

    #: what ``run_loop`` appends to ``loop_modes``
    loop_mode = "in-process"
    _on_progress = None

    def run_loop(
        self,
        fn: Callable,
        args: Sequence[Any] = (),
        *,
        work_per_row: float = 0.0,
        on_progress: Callable[[dict], Any] | None = None,
    ):
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


class SummedLabels:
    """``labelled_pass`` of rows read from their source (streamed, hybrid): one read, no labels kept
    (:func:`~dkmeans.engine.rowwise.summed_pass`; labels of such rows are computed when read)."""

    def labelled_pass(
        self,
        block_fn: Callable,
        args: Sequence[Any] = (),
        *,
        keep_labels: bool = True,
        per_label: int = 0,
    ):
        """See :meth:`ChunkedData.labelled_pass`: one read, no labels kept."""
        from dkmeans.engine.rowwise import summed_pass

        if per_label:
            return (None, *summed_pass(self, block_fn, args, per_label))
        return None, summed_pass(self, block_fn, args)


__all__ = ["ChunkedData", "InCallerLoop", "PrunableData", "SummedLabels"]
