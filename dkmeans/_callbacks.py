"""scikit-learn's callback protocol (``sklearn.callback``, experimental, 1.9+) for the estimators.

With a scikit-learn that has it, ``KMeans`` and ``MiniBatchKMeans`` take
``set_callbacks(ProgressBar(), ScoringMonitor(...))`` and propagate through ``GridSearchCV``
and ``Pipeline`` as scikit-learn's own estimators do; :func:`dkmeans.sweep` takes
``callbacks=[...]``. A fit is this tree of tasks:

* ``fit`` (the root; one sub-task per run: ``n_init`` for ``KMeans``, one for ``MiniBatchKMeans``),
* ``run`` (one initialisation and what follows it; as many sub-tasks as it takes),
* ``initialization`` (a leaf, ended when the run's first step is reported), then one leaf per
  step, in the order they ran: ``lloyd_iteration``, ``local_search_round``, ``hartigan_round``,
  ``minibatch_step``; out of core, ``pass`` tasks (one leaf per file piece or chunk read) among
  them, one per pass over the data the run makes.

A sweep's root is ``sweep`` with one sub-task per k, ``k=<k>``, to which that k's fit (the tree
above, its estimator the k's ``KMeans``) is attached as scikit-learn attaches a
sub-estimator's (auto-propagated callbacks such as ``ProgressBar`` reach it).

Runs start and end where the fit service says (its ``on_run_start`` and ``on_run_end``
hooks). Steps are reported as the fit's progress records reach this process (from a loop
running on the cluster they arrive in small batches, at most every 0.2 s). The root's end
carries the fitted model (``fitted_estimator``), so ``ScoringMonitor`` scores it.

Stop requests follow scikit-learn's protocol: a hook's True at a task's end stops the
iterations *of that task's level*. At a step's end it stops the run's loop after that step
(its centroids stand; the run ends there: no local search or refinement follows; stop reason
``"stopped"``); at a run's end no more runs start and the best run so far is the fit's
result. Either way the fit ends with its final assignment: a valid model. A loop running in
this process (in-memory data, one graph per pass, out of core) stops at the step the request
came with; one running SPMD on the workers at the next step (the request travels to every
rank with one exchange); one running inside a single task (small data) hears it when the task
ends.

Without ``sklearn.callback`` nothing here is used and the estimators are unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import threading

from dkmeans.fit.progress import HartiganRecord, IterationRecord, LocalSearchRecord, MiniBatchRecord

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


def _locked(method):
    """``method`` run under the tree's lock (a sweep's k fits report from threads of their own)."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self.lock:
            return method(self, *args, **kwargs)

    return call


class FitTasks:
    """The task tree of one fit (see the module docstring), fed by the fit service's events and
    progress records.

    ``lock``: shared by trees that report from several threads (a sweep's); each public method
    holds it.
    """

    def __init__(self, estimator, X, y, sample_weight, n_runs: int, lock=None):
        self.estimator = estimator
        self.X, self.y = X, y
        self.metadata = {"sample_weight": sample_weight} if sample_weight is not None else None
        self.n_runs = max(1, int(n_runs))
        self.lock = lock if lock is not None else threading.RLock()
        self.root = estimator._init_callback_context(task_name="fit", max_subtasks=self.n_runs)
        self._begin(self.root)
        self._run = None
        self._init = None
        self._pass = None
        self._pass_id = None
        self._pieces = 0  # leaves of the open pass
        self._runs = 0
        self._stop_steps = False  # a hook asked the open run's loop to stop (at its next step)

    @classmethod
    def start(cls, estimator, X, y, sample_weight, n_runs: int, lock=None):
        """The task tree of a fit of ``estimator`` (None without the protocol)."""
        if not AVAILABLE or not isinstance(estimator, CallbackSupportMixin):
            return None
        return cls(estimator, X, y, sample_weight, n_runs, lock)

    def _begin(self, ctx):
        ctx.call_on_fit_task_begin(
            estimator=self.estimator, X=self.X, y=self.y, metadata=self.metadata
        )
        return ctx

    def _end(self, ctx, attributes=None) -> bool:
        return bool(
            ctx.call_on_fit_task_end(
                estimator=self.estimator,
                X=self.X,
                y=self.y,
                metadata=self.metadata,
                reconstruction_attributes=attributes,
            )
        )

    def _end_init(self) -> None:
        if self._init is not None:
            # a stop request at the initialisation's end stops the run's loop at its first step
            self._stop_steps = self._end(self._init) or self._stop_steps
            self._init = None

    def _end_pass(self) -> None:
        if self._pass is not None:
            self._stop_steps = self._end(self._pass) or self._stop_steps
            self._pass = self._pass_id = None

    def _end_run(self) -> bool:
        self._end_pass()
        self._end_init()
        stop = False
        if self._run is not None:
            stop = self._end(self._run)
            self._run = None
        self._stop_steps = False
        return stop

    @_locked
    def run_started(self, run: int) -> None:  # noqa: ARG002 - the fit service's run index
        """The fit service starts a run (``n_init``): its task and its initialisation's begin."""
        self._end_run()
        if self._runs >= self.n_runs:  # every run's task was made (a resumed fit's runs are fewer)
            return
        self._runs += 1
        self._run = self._begin(self.root.subcontext(task_name="run", max_subtasks=None))
        self._init = self._begin(self._run.subcontext(task_name="initialization"))

    @_locked
    def record(self, record) -> bool:
        """One step ended (its progress record); True where a hook asked the run's loop to stop."""
        if self._run is None:  # a record outside a run (none is expected): not reported
            return False
        self._end_pass()
        self._end_init()  # the run's first step: its initialisation is done
        step = self._begin(self._run.subcontext(task_name=_step_name(record)))
        self._stop_steps = self._end(step) or self._stop_steps
        return self._stop_steps

    @_locked
    def pass_progress(self, event: dict) -> None:
        """Progress of a pass over out-of-core data: ``{"pass", "done", "total"}`` (pieces read of
        the pass's ``total``; see :mod:`dkmeans.engine.streamed`). The pass is a task of the
        open run (or of the root's tree outside runs: not reported), one leaf per piece read."""
        if self._run is None:
            return
        if self._pass_id != event["pass"]:
            self._end_pass()
            self._pass = self._begin(
                self._run.subcontext(task_name="pass", max_subtasks=int(event["total"]))
            )
            self._pass_id = event["pass"]
            self._pieces = 0
        while self._pieces < min(int(event["done"]), int(event["total"])):
            self._end(self._begin(self._pass.subcontext(task_name="piece")))
            self._pieces += 1
        if event["done"] >= event["total"]:
            self._end_pass()

    @_locked
    def run_ended(self, run: int) -> bool:
        """A run (``n_init``) ended: end its tasks now; True when a hook at the run's end asked to
        stop (no more runs)."""
        if self._run is None and self._runs < self.n_runs:  # (a resumed run that reported nothing)
            self.run_started(run)
        return self._end_run()

    @_locked
    def finish(self, fitted: bool) -> None:
        """The fit ended (``fitted``: its attributes set): close the open tasks and the root."""
        self._end_run()
        attributes = None
        if fitted:
            attributes = {
                name: value
                for name, value in vars(self.estimator).items()
                if name.endswith("_") and not name.startswith("_")
            }
        self._end(self.root, attributes)


class Sweep(Mixin):
    """The node of :func:`dkmeans.sweep` in scikit-learn's task tree (the callbacks' holder)."""

    def __init__(self, k_values):
        self.k_values = list(k_values)


class SweepTasks:
    """The task tree of a sweep: ``sweep``, one ``k=<k>`` task per k with that k's fit attached
    (:class:`FitTasks` of its ``KMeans``, as scikit-learn attaches a sub-estimator's tree)."""

    def __init__(self, callbacks, models: dict, X, sample_weight, n_runs: int):
        self.owner = Sweep(models).set_callbacks(*callbacks)
        self.X = X
        self.metadata = {"sample_weight": sample_weight} if sample_weight is not None else None
        self.lock = threading.RLock()
        self._stack = contextlib.ExitStack()
        self._closed = False
        self.root = self.owner._init_callback_context(task_name="sweep", max_subtasks=len(models))
        self.root.call_on_fit_task_begin(estimator=self.owner, X=X, metadata=self.metadata)
        self.fits, self._contexts = {}, {}
        try:
            for k, model in models.items():
                ctx = self.root.subcontext(task_name=f"k={k}")
                self._stack.enter_context(ctx.propagate_callback_context(model))
                ctx.call_on_fit_task_begin(estimator=self.owner, X=X, metadata=self.metadata)
                self._contexts[k] = ctx
                self.fits[k] = FitTasks(model, X, None, sample_weight, n_runs, self.lock)
        except BaseException:
            self.close(fitted=False)
            raise

    @classmethod
    def start(cls, callbacks, models: dict, X, sample_weight, n_runs: int):
        """The task tree of a sweep over ``models`` (k -> KMeans); None without callbacks or
        without the protocol (callbacks given then: an error saying so)."""
        if not callbacks:
            return None
        if not AVAILABLE:
            raise ImportError(
                "callbacks need scikit-learn's callback protocol (sklearn.callback, "
                "scikit-learn 1.9 or later)"
            )
        return cls(list(callbacks), models, X, sample_weight, n_runs)

    def close(self, fitted: bool) -> None:
        """End every open task (each k's fit, its ``k=`` task, the root) and tear the callbacks
        down (also after an error: ``ProgressBar``'s display thread ends)."""
        if self._closed:
            return
        self._closed = True
        with self.lock:
            try:
                for k, ctx in self._contexts.items():
                    model = self.fits[k].estimator if k in self.fits else None
                    try:
                        if k in self.fits:
                            self.fits[k].finish(fitted=fitted)
                        ctx.call_on_fit_task_end(
                            estimator=self.owner, X=self.X, metadata=self.metadata
                        )
                    finally:
                        if model is not None:  # the k's own callbacks torn down, as its fit would
                            managed(_nothing)(model)
                self.root.call_on_fit_task_end(
                    estimator=self.owner, X=self.X, metadata=self.metadata
                )
            finally:
                self._stack.close()
                managed(_nothing)(self.owner)  # the sweep's callbacks torn down


def _nothing(estimator) -> None:  # noqa: ARG001 - under :func:`managed`: only its teardown runs
    return None


__all__ = ["AVAILABLE", "FitTasks", "Mixin", "Sweep", "SweepTasks", "managed"]
