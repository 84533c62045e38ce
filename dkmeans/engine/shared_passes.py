"""Several fits' passes over one data object, run together: every pass over the data serves them all.

:class:`SharedPasses` runs jobs (a function of a data object each: one k of a sweep) in a
thread each, and hands each job a :class:`SharedView`: an implementation of the data
protocol (:mod:`dkmeans.engine.protocol`) over the same rows. When a job asks its view for
a pass (``map_reduce``, ``map_reduce_stateful``, ``labelled_pass``), the request is queued
and the job's thread waits; once every running job waits on a request (or has finished),
the caller's thread runs one combined pass on the real data. Its chunk function applies
every queued request's chunk function to the chunk and returns the tuple of their results;
the tuple is combined element by element with each request's own combine function, which is
associative and sees its results in chunk order as in a pass of its own. So each request's
result is the one its own pass over the same data object would give: a job's result does
not depend on the other jobs, nor on which of its passes were shared.

* ``map_reduce_stateful``: each request keeps its own per-chunk state: a slot of the
  state of the combined pass that made it (:class:`SlotStates`), handed back to the job as
  a :class:`SharedState`. Requests continuing states of different combined passes need
  passes of their own (jobs in step share them: k-means|| runs the same passes for every k).
* ``labelled_pass``: the labels of rows kept in memory are per-chunk state of a combined
  stateful pass, read out with the data's ``state_column``; the value is summed per chunk
  as :func:`~dkmeans.engine.rowwise.summed_pass` sums it (its total equals the data's own
  labelled pass up to float rounding of the sum where that pass sums in another order).
* ``run_loop``: ``fn(view, *args)`` in the job's thread, so a loop's passes are shared too.
  A single fit on persisted data may run the same loop inside one task or SPMD instead
  (:meth:`~dkmeans.engine.persisted.PersistedData.run_loop`); the results are equal up to
  float rounding of combined sums, as the protocol states.
* ``fold`` (sequential passes; mini-batch only), ``rows`` and ``state_column`` go to the data
  as they are, one call at a time: they are not shared.

Waits: the combined pass waits for the jobs still computing between passes at most Dask
config ``dkmeans.shared-pass-wait``, then runs with the requests queued (the late ones join
the next pass; results are the same either way). A job waiting on its pass sleeps until the
pass is done or the sweep is cancelled (woken, never polling: a sweep of 63 k would
otherwise wake its threads about 1,300 times a second for nothing).
A job that raises cancels the others (each stops at its next
request) and :meth:`SharedPasses.run` raises its exception, noted with the job's name;
a combined pass that fails is raised the same way.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dkmeans import config
from dkmeans.engine.protocol import InCallerLoop
from dkmeans.engine.rowwise import sum_pairs
from dkmeans.kernels.namespace import to_host
from dkmeans.kernels.quality import label_sums

logger = logging.getLogger("dkmeans")

#: How often (s) the caller's thread checks the queue of requests (it is also woken by each one).
POLL_S = 0.05

_MAP, _STATEFUL, _LABELS, _SUM = 0, 1, 2, 3  # request kinds inside a combined pass


#: After an interrupt, how long the caller waits for the jobs' threads before it returns (s).
INTERRUPT_JOIN_S = 1.0


class SharedPassesCancelled(RuntimeError):
    """Raised in a job's thread when another job failed: the job stops at its next request."""


# -- what runs on the chunks (picklable: tasks carry it) -----------------------------------
class SlotStates:
    """One chunk's state after a combined stateful pass: each request's own state, by slot.

    ``state["<slot>/<name>"]`` is ``state`` slot's ``[name]``, so the data's
    ``state_column`` reads a column of one request's state dicts.
    """

    def __init__(self, slots: tuple):
        self.slots = slots

    def __getitem__(self, key: str):
        slot, name = key.split("/", 1)
        return self.slots[int(slot)][name]


def _one(kind, fn, args, X, w, offset, previous):
    """``(new state, result)`` of one request on one chunk."""
    if kind == _MAP:
        return None, fn(X, w, offset, *args)
    if kind == _STATEFUL:
        return fn(X, w, offset, previous, *args)
    per_label, *args = (
        args  # a labelled pass's block: (n, 2) float64, label and value per row (+ weight)
    )
    block = fn(X, *args, w)
    value = float(block[:, 1].sum())
    if (
        per_label
    ):  # and the per-label sums of values and weights, as the data's own labelled pass gives them
        value = (value, to_host(label_sums(block, per_label)))
    return ({"labels": block[:, 0].astype(np.int32)} if kind == _LABELS else None), value


def _each_chunk(X, w, offset, items):
    """A combined pass without state: every request's result on this chunk, in a tuple."""
    return tuple(_one(kind, fn, args, X, w, offset, None)[1] for kind, fn, args, _ in items)


def _each_chunk_stateful(X, w, offset, state, items):
    """A combined stateful pass: each request continues its own slot of ``state`` (None: a new one)."""
    new, out = [], []
    for kind, fn, args, slot in items:
        previous = None if slot is None else state.slots[slot]
        s, result = _one(kind, fn, args, X, w, offset, previous)
        new.append(s)
        out.append(result)
    return SlotStates(tuple(new)), tuple(out)


class _CombineEach:
    """The combine of a combined pass: each request's own combine over its results, in chunk order."""

    def __init__(self, combines: tuple):
        self.combines = combines

    def __call__(self, parts):
        return tuple(combine([p[j] for p in parts]) for j, combine in enumerate(self.combines))


def _sum(parts):
    return float(sum(parts))  # as rowwise.summed_pass adds a labelled pass's values


def _labelled(labels, result) -> tuple:
    """A labelled pass's answer: ``(labels, total)``, or ``(labels, total, per-label sums)``."""
    return (labels, *result) if isinstance(result, tuple) else (labels, result)


# -- requests -----------------------------------------------------------------------------
@dataclass(eq=False)
class SharedState:
    """A job's per-chunk state: its ``slot`` in the ``state`` of the combined pass that made it.

    Dropping every :class:`SharedState` of a combined pass frees that pass's state.
    """

    state: Any
    slot: int


@dataclass(eq=False)
class _Request:
    kind: int
    fn: Callable
    combine: Callable
    args: tuple
    state: SharedState | None = None
    queued_at: float = 0.0
    done: bool = False
    result: Any = None
    #: set when the request's pass is done, or when the sweep is cancelled
    woken: threading.Event = field(default_factory=threading.Event)


class SharedView(InCallerLoop):
    """One job's data: the protocol over the shared rows, its passes run with the other jobs'.

    ``passes`` counts the data's passes before the jobs started plus this job's own: what
    the data would count had the job run alone on it.
    """

    kind = "shared"

    loop_mode = "shared"

    def __init__(self, shared: SharedPasses, base_passes: int):
        self._shared = shared
        self._base = int(base_passes)
        self._own = 0
        self.loop_modes: list[str] = []

    # -- what the data is ---------------------------------------------------------------
    @property
    def n_rows(self) -> int:
        return self._shared.data.n_rows

    @property
    def n_features(self) -> int:
        return self._shared.data.n_features

    @property
    def dtype(self):
        return self._shared.data.dtype

    @property
    def in_memory(self) -> bool:
        return self._shared.data.in_memory

    @property
    def has_weights(self) -> bool:
        return self._shared.data.has_weights

    @property
    def passes(self) -> int:
        return self._base + self._own

    def row_state_bytes(self) -> float:
        """The data's room for per-row state, shared by the jobs: each may keep its share between passes."""
        return self._shared.data.row_state_bytes() / max(1, self._shared.n_jobs)

    # -- shared passes ------------------------------------------------------------------
    def _ask(self, request: _Request):
        self._own += 1
        return self._shared.submit(request)

    def map_reduce(self, chunk_fn: Callable, combine_fn: Callable, args: Sequence[Any] = ()) -> Any:
        """See :meth:`dkmeans.engine.protocol.ChunkedData.map_reduce` (run with the other jobs' requests)."""
        return self._ask(_Request(_MAP, chunk_fn, combine_fn, tuple(args)))

    def map_reduce_stateful(
        self,
        chunk_fn: Callable,
        combine_fn: Callable,
        args: Sequence[Any] = (),
        state: SharedState | None = None,
    ):
        """See :meth:`dkmeans.engine.protocol.ChunkedData.map_reduce_stateful`; the state is a :class:`SharedState`."""
        if state is not None and not isinstance(state, SharedState):
            raise TypeError(f"state must be one this view returned, got {type(state).__name__}")
        return self._ask(_Request(_STATEFUL, chunk_fn, combine_fn, tuple(args), state))

    def labelled_pass(
        self,
        block_fn: Callable,
        args: Sequence[Any] = (),
        *,
        keep_labels: bool = True,
        per_label: int = 0,
    ):
        """See :meth:`dkmeans.engine.protocol.ChunkedData.labelled_pass`: labels where the rows are kept."""
        kind = _LABELS if keep_labels and self.in_memory else _SUM
        return self._ask(
            _Request(kind, block_fn, sum_pairs if per_label else _sum, (per_label, *args))
        )

    # -- the rest: straight to the data ---------------------------------------------------
    def fold(self, chunk_fn: Callable, state: Any, args: Sequence[Any] = (), **kwargs) -> Any:
        """A sequential pass of this job alone (not shared: a fold's chunks run in row order)."""
        self._own += 1
        return self._shared.direct("fold", chunk_fn, state, args, **kwargs)

    def state_column(self, state: SharedState, name: str) -> Any:
        """The per-row array ``name`` of this job's state (:meth:`map_reduce_stateful`'s), in row order."""
        return self._shared.direct("state_column", state.state, f"{state.slot}/{name}")

    def rows(self, indices) -> np.ndarray:
        return self._shared.direct("rows", indices)

    def release(self) -> None:
        """Nothing of its own: the shared data is released by whoever placed it."""


# -- the coordinator ---------------------------------------------------------------------
def shared_pass_wait() -> float:
    """Seconds a combined pass waits for jobs still computing (Dask config ``dkmeans.shared-pass-wait``)."""
    return config.get("shared-pass-wait")


class SharedPasses:
    """Jobs over one data object whose passes run together (see the module docstring).

    Parameters
    ----------
    data : ChunkedData
        The placed data (any implementation of the protocol).
    wait_s : float, optional
        How long a combined pass waits for jobs still computing (default: Dask config
        ``dkmeans.shared-pass-wait``).

    Attributes
    ----------
    rounds : int
        Combined passes run (the data's own ``passes`` counts every pass over the rows).
    """

    def __init__(self, data, *, wait_s: float | None = None):
        self.data = data
        self.wait_s = shared_pass_wait() if wait_s is None else float(wait_s)
        self.rounds = 0
        self.n_jobs = 1
        self._cond = threading.Condition()
        self._data_lock = threading.Lock()  # one pass or direct call on the data at a time
        self._queue: list[_Request] = []
        self._waiting: set[_Request] = set()  # queued or in a pass: woken on cancel
        self._running = 0
        self._cancelled = False

    # -- from the jobs' threads -----------------------------------------------------------
    def submit(self, request: _Request):
        """Queue ``request`` and wait for its combined pass; its result."""
        with self._cond:
            if self._cancelled:
                raise SharedPassesCancelled("another job of the shared passes failed")
            request.queued_at = time.monotonic()
            self._queue.append(request)
            self._waiting.add(request)
            self._cond.notify_all()  # the caller's thread: only it waits on the condition
        request.woken.wait()
        with self._cond:
            self._waiting.discard(request)
            if not request.done:
                raise SharedPassesCancelled("another job of the shared passes failed")
        return request.result

    def _cancel(self) -> None:
        """Stop every job at its request (those waiting now are woken); under ``self._cond``."""
        self._cancelled = True
        for request in self._waiting:
            request.woken.set()
        self._cond.notify_all()

    def direct(self, method: str, *args, **kwargs):
        """``data.<method>(*args, **kwargs)``, between combined passes."""
        if self._cancelled:
            raise SharedPassesCancelled("another job of the shared passes failed")
        with self._data_lock:
            return getattr(self.data, method)(*args, **kwargs)

    # -- from the caller's thread ---------------------------------------------------------
    def run(
        self, jobs: Sequence[Callable[[SharedView], Any]], names: Sequence[str] | None = None
    ) -> list:
        """``[job(view) for job in jobs]``, each in a thread of its own, their passes shared.

        Each thread runs in a copy of the caller's context (context variables, such as the
        fit's kernel plan, travel with it). Raises the first exception a job raised
        (with a note naming the job) once the other jobs have stopped, or after
        ``wait_s`` for jobs still computing (they stop at their next request).
        """
        names = list(names) if names is not None else [f"job {i}" for i in range(len(jobs))]
        self.n_jobs = len(jobs)
        views = [SharedView(self, self.data.passes) for _ in jobs]
        outcomes: list = [None] * len(jobs)
        failures: list[tuple[int, BaseException]] = []

        def body(i: int) -> None:
            try:
                outcomes[i] = jobs[i](views[i])
            except SharedPassesCancelled:
                pass
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                with self._cond:
                    failures.append((i, exc))
                    self._cancel()
            finally:
                with self._cond:
                    self._running -= 1
                    self._cond.notify_all()

        self._running, self._cancelled = len(jobs), False
        threads = [
            threading.Thread(
                target=contextvars.copy_context().run,
                args=(body, i),
                daemon=True,
                name=f"dkmeans-shared-{names[i]}",
            )
            for i in range(len(jobs))
        ]
        for thread in threads:
            thread.start()
        try:
            self._drive(names)
        except BaseException as exc:
            with self._cond:
                self._cancel()
            # interrupted (Ctrl-C, Jupyter's stop): back to the caller at once; jobs still computing
            # between passes stop at their next request, in their own (daemon) threads
            self._join(threads, INTERRUPT_JOIN_S if isinstance(exc, KeyboardInterrupt) else None)
            raise
        self._join(threads)
        if failures:
            i, exc = failures[0]
            exc.add_note(f"(in the shared passes' job {names[i]})")
            raise exc
        return outcomes

    def _join(self, threads, wait_s: float | None = None) -> None:
        wait_s = self.wait_s if wait_s is None else min(wait_s, self.wait_s)
        deadline = time.monotonic() + wait_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        late = [t.name for t in threads if t.is_alive()]
        if late:  # computing between passes: each stops (cancelled) at its next request
            log = logger.info if wait_s < self.wait_s else logger.warning  # info: interrupted
            log(
                "shared passes: %s still computing after %.0f s; left to stop at their next pass",
                ", ".join(late),
                wait_s,
            )

    def _drive(self, names) -> None:
        """Run combined passes until every job has finished, or one failed."""
        while True:
            with self._cond:
                while True:
                    if self._cancelled or self._running == 0:
                        return
                    if len(self._queue) >= self._running:  # every running job waits on its pass
                        break
                    if (
                        self._queue
                        and time.monotonic() - min(r.queued_at for r in self._queue) > self.wait_s
                    ):
                        logger.info(
                            "shared passes: a pass waited %.0f s for jobs still computing; it runs "
                            "without them",
                            self.wait_s,
                        )
                        break
                    self._cond.wait(POLL_S)
                batch, self._queue = self._queue, []
            try:
                self._run_batch(batch)
            except Exception as exc:
                exc.add_note(f"(in a pass shared by {len(batch)} requests)")
                raise
            with self._cond:
                for request in batch:
                    request.done = True
                    request.woken.set()

    def _run_batch(self, batch: list[_Request]) -> None:
        """One combined pass per state the batch's stateful requests continue (one when they are in step)."""
        chains: dict[int, list[_Request]] = {}
        free = []
        for request in batch:
            if request.state is not None:
                chains.setdefault(id(request.state.state), []).append(request)
            else:
                free.append(request)
        groups = list(chains.values()) or [[]]
        groups[0] = groups[0] + free
        for group in groups:
            with self._data_lock:
                self._combined_pass(group)

    def _combined_pass(self, group: list[_Request]) -> None:
        self.rounds += 1
        combine = _CombineEach(tuple(r.combine for r in group))
        previous = next((r.state.state for r in group if r.state is not None), None)
        items = tuple(
            (r.kind, r.fn, r.args, None if r.state is None else r.state.slot) for r in group
        )
        if previous is None and all(r.kind in (_MAP, _SUM) for r in group):
            results = self.data.map_reduce(_each_chunk, combine, (items,))
            for request, result in zip(group, results):
                request.result = _labelled(None, result) if request.kind == _SUM else result
            return
        results, state = self.data.map_reduce_stateful(
            _each_chunk_stateful, combine, (items,), previous
        )
        for slot, (request, result) in enumerate(zip(group, results)):
            if request.kind == _STATEFUL:
                request.result = (result, SharedState(state, slot))
            elif request.kind == _LABELS:
                request.result = _labelled(self.data.state_column(state, f"{slot}/labels"), result)
            elif request.kind == _SUM:
                request.result = _labelled(None, result)
            else:
                request.result = result


__all__ = [
    "POLL_S",
    "SharedPasses",
    "SharedPassesCancelled",
    "SharedState",
    "SharedView",
    "SlotStates",
    "shared_pass_wait",
]
