"""scikit-learn's callback protocol (``sklearn.callback``, experimental, 1.9+) for the estimators.

With a scikit-learn that has it, ``KMeans`` and ``MiniBatchKMeans`` take
``set_callbacks(ProgressBar(), ScoringMonitor(...))`` and propagate through ``GridSearchCV``
and ``Pipeline`` as scikit-learn's own estimators do. A fit is this tree of tasks:

* ``fit`` (the root; one sub-task per initialisation, ``n_init``),
* ``run`` (one initialisation and what follows it; as many sub-tasks as it takes),
* ``initialization`` (a leaf, ended when the run's first step is reported), then one leaf per
  step, in the order they ran: ``lloyd_iteration``, ``local_search_round``, ``hartigan_round``,
  ``minibatch_step``.

Steps are reported as the fit's progress records reach this process (from a loop running on
the cluster they arrive in small batches, at most every 0.2 s). The root's end carries the
fitted model (``fitted_estimator``), so ``ScoringMonitor`` scores it. A hook returning True
(a stop request) is honoured at the end of the run it came in: no more runs start, and the
best run so far is the fit's result. Within a run the loops (on the cluster, one task or SPMD)
have no channel to take it, so the run goes on to its end.

Without ``sklearn.callback`` nothing here is used and the estimators are unchanged.
"""

from __future__ import annotations

from dkmeans.drivers.state import (HartiganRecord, IterationRecord, LocalSearchRecord,
                                   MiniBatchRecord)

try:  # scikit-learn >= 1.9
    from sklearn.callback import CallbackSupportMixin, with_callbacks
except ImportError:  # an older scikit-learn: no callbacks, nothing changes
    CallbackSupportMixin = None
    with_callbacks = None

#: Whether this scikit-learn has the callback protocol.
AVAILABLE = CallbackSupportMixin is not None


class _NoCallbacks:
    """Stands in for scikit-learn's ``CallbackSupportMixin`` where scikit-learn has none."""


#: The mixin the estimators derive from.
Mixin = CallbackSupportMixin if AVAILABLE else _NoCallbacks


def managed(method):
    """``method`` (an estimator's ``fit``) with the callbacks torn down at its end."""
    return with_callbacks(method) if AVAILABLE else method


def _step_name(record) -> str:
    if isinstance(record, LocalSearchRecord):
        return "local_search_round"
    if isinstance(record, HartiganRecord):
        return "hartigan_round"
    if isinstance(record, MiniBatchRecord):
        return "minibatch_step"
    if isinstance(record, IterationRecord):
        return "lloyd_iteration"
    return "step"


class FitTasks:
    """The task tree of one fit (see the module docstring), fed by the fit's progress records."""

    def __init__(self, estimator, X, y, sample_weight, n_runs: int):
        self.estimator = estimator
        self.X, self.y = X, y
        self.metadata = {"sample_weight": sample_weight} if sample_weight is not None else None
        self.n_runs = max(1, int(n_runs))
        self.stop_requested = False
        self.root = estimator._init_callback_context(task_name="fit", max_subtasks=self.n_runs)
        self.root.call_on_fit_task_begin(estimator=estimator, X=X, y=y, metadata=self.metadata)
        self._run = None
        self._init = None
        self._runs = 0
        # set by the face where the fit service reports each run's end (:meth:`run_ended`): a run
        # then ends there only, not where a record looks like a new run's first (the Lloyd loop
        # that confirms a local search also starts at iteration 1)
        self.runs_ended_by_service = False

    @classmethod
    def start(cls, estimator, X, y, sample_weight, n_runs: int):
        """The task tree of a fit of ``estimator`` (None without the protocol)."""
        if not AVAILABLE or not isinstance(estimator, CallbackSupportMixin):
            return None
        return cls(estimator, X, y, sample_weight, n_runs)

    def _begin(self, ctx):
        ctx.call_on_fit_task_begin(estimator=self.estimator, X=self.X, y=self.y,
                                   metadata=self.metadata)
        return ctx

    def _end(self, ctx, attributes=None) -> None:
        stop = ctx.call_on_fit_task_end(estimator=self.estimator, X=self.X, y=self.y,
                                        metadata=self.metadata,
                                        reconstruction_attributes=attributes)
        self.stop_requested = self.stop_requested or bool(stop)

    def _start_run(self) -> None:
        self._end_run()
        if self._runs >= self.n_runs:  # every run's task was made: later steps are not reported
            return
        self._runs += 1
        self._run = self._begin(self.root.subcontext(task_name="run", max_subtasks=None))
        self._init = self._begin(self._run.subcontext(task_name="initialization"))

    def _end_run(self) -> None:
        if self._init is not None:
            self._end(self._init)
            self._init = None
        if self._run is not None:
            self._end(self._run)
            self._run = None

    def record(self, record, starts_run: bool) -> None:
        """One progress record; ``starts_run``: it is the first of a new run (``n_init``)."""
        if self._run is None or (starts_run and not self.runs_ended_by_service
                                 and self._runs < self.n_runs):
            self._start_run()
        if self._run is None:
            return
        if self._init is not None:  # the run's first step: its initialisation is done
            self._end(self._init)
            self._init = None
        step = self._begin(self._run.subcontext(task_name=_step_name(record)))
        self._end(step)

    def run_ended(self, run: int) -> bool:  # noqa: ARG002 - the fit service's run index
        """A run (``n_init``) ended: end its tasks now; True when a hook asked to stop (no more
        runs)."""
        if self._run is None:  # a run that reported no step: its tasks all the same
            self._start_run()
        self._end_run()
        return self.stop_requested

    def finish(self, fitted: bool) -> None:
        """The fit ended (``fitted``: its attributes set): close the open tasks and the root."""
        if self._runs == 0 and fitted:  # no record came (a fit of one pass): one run all the same
            self._start_run()
        self._end_run()
        attributes = None
        if fitted:
            attributes = {name: value for name, value in vars(self.estimator).items()
                          if name.endswith("_") and not name.startswith("_")}
        self._end(self.root, attributes)


__all__ = ["AVAILABLE", "FitTasks", "Mixin", "managed"]
