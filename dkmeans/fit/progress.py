"""A fit's progress as a face shows it: one line per record (logged, and printed with ``verbose``),
scikit-learn's ``verbose`` messages, and the events of scikit-learn's callbacks."""

from __future__ import annotations

import logging
import sys

from dkmeans.drivers.state import (
    HartiganRecord,
    IterationRecord,
    LocalSearchRecord,
    MiniBatchRecord,
    history_dicts,
)

logger = logging.getLogger("dkmeans")


def record_line(record) -> str:
    """dkmeans' one line for a progress record (logged, and printed with ``verbose``)."""
    if isinstance(record, LocalSearchRecord):
        return (
            f"swap round {record.round:3d}  objective {record.objective:.6e}  swaps tried "
            f"{record.swaps_tried}  accepted {record.swaps_accepted}  "
            f"{record.seconds * 1e3:8.1f} ms"
        )
    if isinstance(record, IterationRecord):
        detail = f"shift {record.centroid_shift:.3e}  empty fixed {record.empty_clusters_fixed}"
    elif isinstance(record, MiniBatchRecord):
        ewa = "-" if record.ewa_objective is None else f"{record.ewa_objective:.6e}"
        detail = (
            f"minibatch ewa {ewa}  shift {record.centroid_shift:.3e}  "
            f"reassigned {record.reassigned}"
        )
    else:  # a Hartigan round
        detail = f"hartigan {record.mode:13s} moves {record.moves}"
    return (
        f"iteration {record.iteration:4d}  objective {record.objective:.6e}  {detail}  "
        f"{record.seconds * 1e3:8.1f} ms"
    )


class Progress:
    """Each record is logged (logger ``dkmeans``, INFO); with ``verbose`` also printed.

    Printed too, as scikit-learn's ``KMeans(verbose=1)`` prints them: ``Initialization
    complete`` before the first record of each run (``n_init``; the fit service says where a
    run starts: :meth:`run_started`), and when a Lloyd loop stopped by a rule, ``Converged at
    iteration i: strict convergence.`` (no centroid moved) or ``Converged at iteration i:
    center shift s within tolerance.`` (a loop's end is seen at the next record or at
    :meth:`finish`). ``max_iter`` (set by the face) tells a loop that reached it from one
    that stopped by the rule. Out of core, a pass over the data that takes a while is
    reported as it goes (:meth:`pass_progress`: a line at most every
    :data:`PASS_LINE_EVERY_S`, and at its end).

    ``tasks`` (scikit-learn's callbacks, :class:`dkmeans._callbacks.FitTasks`) gets every
    event too; a record's call returns True where a callback asked the loop to stop.
    """

    #: A pass's progress line at most this often (seconds), with ``verbose``.
    PASS_LINE_EVERY_S = 2.0

    def __init__(self, verbose):
        self.verbose = verbose
        self.tasks = None  # the task tree of scikit-learn's callbacks (dkmeans._callbacks.FitTasks)
        self.max_iter = None
        self.prefix = ""  # a sweep's "k=<k> " in front of each line
        self._last = None  # the previous record
        self._run_started = False  # a run started and reported no record yet
        self._pass_lines = {}  # pass -> when its last line was printed

    def run_started(self, run: int) -> None:
        """The fit service starts run ``run``."""
        self._run_started = True
        if self.tasks is not None:
            self.tasks.run_started(run)

    def run_ended(self, run: int) -> bool:
        """The fit service ended run ``run``; True where a callback asked for no more runs."""
        return self.tasks.run_ended(run) if self.tasks is not None else False

    def pass_progress(self, event: dict) -> None:
        """A pass over out-of-core data: ``event["done"]`` of ``event["total"]`` pieces read."""
        import time

        if self.tasks is not None:
            self.tasks.pass_progress(event)
        done, total, index = event["done"], event["total"], event["pass"]
        now = time.monotonic()
        first = self._pass_lines.setdefault(index, now)
        ended = done >= total
        if ended:
            self._pass_lines.pop(index, None)
        elif now - first < self.PASS_LINE_EVERY_S or done == 0:
            return  # a short pass says nothing; a long one once every few seconds
        else:
            self._pass_lines[index] = now
        seconds = event.get("seconds", 0.0)
        line = f"{self.prefix}pass {index:4d}  read {done}/{total} pieces  {seconds:8.1f} s"
        logger.info(line)
        if self.verbose and (not ended or seconds >= self.PASS_LINE_EVERY_S):
            print(line, file=sys.stdout, flush=True)

    def _lloyd_ended(self) -> None:
        last = self._last
        if not isinstance(last, IterationRecord):
            return
        if last.centroid_shift == 0.0:
            print(
                f"{self.prefix}Converged at iteration {last.iteration}: strict convergence.",
                file=sys.stdout,
                flush=True,
            )
        elif self.max_iter is None or last.iteration < self.max_iter:
            print(
                f"{self.prefix}Converged at iteration {last.iteration}: center shift "
                f"{last.centroid_shift} within tolerance.",
                file=sys.stdout,
                flush=True,
            )

    def __call__(self, record) -> bool:
        line = self.prefix + record_line(record)
        continues_lloyd = (
            isinstance(record, IterationRecord)
            and isinstance(self._last, IterationRecord)
            and record.iteration == self._last.iteration + 1
        )
        if self.verbose and not continues_lloyd:
            self._lloyd_ended()
        if self._run_started:
            self._run_started = False
            if self.verbose and not isinstance(
                record, MiniBatchRecord
            ):  # scikit-learn's mini-batch has none
                print(f"{self.prefix}Initialization complete", file=sys.stdout, flush=True)
        stop = self.tasks.record(record) if self.tasks is not None else False
        self._last = record
        logger.info(line)
        if self.verbose:
            print(line, file=sys.stdout, flush=True)
        return stop

    def finish(self) -> None:
        """The fit ended: the last Lloyd loop's convergence message."""
        if self.verbose and not isinstance(self._last, MiniBatchRecord):
            self._lloyd_ended()
        self._last = None

    def hooks(self) -> dict:
        """The fit service's hooks that feed this object (:class:`~dkmeans.fit.spec.FitSpec`)."""
        return {
            "on_iteration": self,
            "on_run_start": self.run_started,
            "on_run_end": self.run_ended,
            "on_pass": self.pass_progress,
        }


def finish_progress(spec) -> None:
    """The fit of ``spec`` ended: its progress (where a :class:`Progress`) says how the last loop
    stopped."""
    finish = getattr(spec.on_iteration, "finish", None)
    if finish is not None:
        finish()


__all__ = [
    "HartiganRecord",
    "IterationRecord",
    "LocalSearchRecord",
    "MiniBatchRecord",
    "Progress",
    "finish_progress",
    "history_dicts",
    "record_line",
]
