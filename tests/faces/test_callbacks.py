"""scikit-learn's callback protocol (``sklearn.callback``) where the installed scikit-learn has it:
stop requests honoured mid-run at the level they came from, runs started and ended where the fit
service says, the sweep's task tree (one task per k, each k's fit nested), and the passes of an
out-of-core fit reported as they read their pieces."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

import dkmeans
from dkmeans import _callbacks
from dkmeans.testing import make_blobs

pytestmark = pytest.mark.skipif(
    not _callbacks.AVAILABLE, reason="scikit-learn without sklearn.callback"
)


@pytest.fixture
def blobs():
    X, _, _ = make_blobs(3_000, 4, 5, seed=0)
    return X


class Recorder:
    """A FitCallback recording ``(hook, estimator, task, id, parent task, parent id)``; asks to
    stop where ``stop(context)`` says (scikit-learn: at a task's end, for that task's level)."""

    def __init__(self, stop=None):
        self.events = []
        self.stop = stop

    def setup(self, estimator, context):
        self.events.append(("setup", context.task_name))

    def _event(self, hook, context):
        parent = context.parent
        self.events.append(
            (
                hook,
                context.estimator_name,
                context.task_name,
                context.task_id,
                parent.task_name if parent is not None else None,
                parent.task_id if parent is not None else None,
            )
        )

    def on_fit_task_begin(self, estimator, context):
        self._event("begin", context)

    def on_fit_task_end(self, estimator, context):
        self._event("end", context)
        return bool(self.stop is not None and self.stop(context))

    def teardown(self, estimator, context):
        self.events.append(("teardown", context.task_name))

    def tasks(self, hook="begin", name=None):
        return [e for e in self.events if e[0] == hook and (name is None or e[2] == name)]


class AutoRecorder(Recorder):
    """Propagated to sub-estimators (a sweep's models, a grid search's), as ``ProgressBar`` is."""

    max_propagation_depth = None


def _stop_after_iteration(n, step="lloyd_iteration"):
    """Stop at the end of the n-th ``step`` of a run."""

    def stop(context):
        if context.task_name != step:
            return False
        done = sum(1 for c in context.parent._children_map.values() if c.task_name == step)
        return done >= n

    return stop


def _assert_valid_model(km, X):
    """What a stopped fit leaves is a model like any other: labels and inertia of its centroids."""
    np.testing.assert_array_equal(np.asarray(km.labels_), km.predict(X))
    assert km.inertia_ == pytest.approx(-km.score(X), rel=1e-6)


def test_a_stop_request_at_an_iteration_ends_the_loop_there_with_a_valid_model(blobs):
    rec = Recorder(stop=_stop_after_iteration(3))
    params = dict(n_clusters=5, init="random", n_init=1, random_state=0, local_search=False, tol=0)
    km = dkmeans.KMeans(**params).set_callbacks(rec).fit(blobs)
    assert km.stop_reason_ == "stopped" and km.n_iter_ == 3
    assert len(rec.tasks("begin", "lloyd_iteration")) == 3
    # the same fit told to stop after three updates by max_iter: the same centroids
    capped = dkmeans.KMeans(**{**params, "max_iter": 3}).fit(blobs)
    np.testing.assert_allclose(km.cluster_centers_, capped.cluster_centers_, rtol=1e-6)
    _assert_valid_model(km, blobs)
    assert len(rec.tasks("begin")) == len(rec.tasks("end"))  # every task ended


def test_a_stop_at_an_iteration_stops_that_run_only_and_one_at_a_run_stops_the_runs(blobs):
    """scikit-learn's meaning: a stop request stops the iterations of the level it came from."""
    rec = Recorder(stop=_stop_after_iteration(2))
    km = (
        dkmeans.KMeans(5, init="random", n_init=3, random_state=0, local_search=False, tol=0)
        .set_callbacks(rec)
        .fit(blobs)
    )
    runs = rec.tasks("begin", "run")
    assert len(runs) == 3
    iterations = rec.tasks("begin", "lloyd_iteration")
    per_run = [sum(1 for e in iterations if e[5] == run[3]) for run in runs]
    assert per_run == [2, 2, 2] and km.stop_reason_ == "stopped"
    _assert_valid_model(km, blobs)


def test_runs_start_where_the_fit_service_says_even_with_a_local_search(blobs, capsys):
    """The Lloyd loop confirming a local search's swaps starts at iteration 1 again: same run."""
    rec = Recorder()
    km = (
        dkmeans.KMeans(5, init="k-means++", n_init=3, random_state=0, local_search=True, verbose=1)
        .set_callbacks(rec)
        .fit(blobs)
    )
    assert len(rec.tasks("begin", "run")) == 3
    assert len(rec.tasks("begin", "initialization")) == 3
    assert capsys.readouterr().out.count("Initialization complete") == 3
    steps = [e for e in rec.tasks("begin") if e[4] == "run" and e[2] != "initialization"]
    per_run = [sum(1 for e in steps if e[5] == run) for run in range(3)]
    assert len(km.history_) in per_run  # the best run's steps, all in its own task
    assert {e[2] for e in steps} >= {"lloyd_iteration", "local_search_round"}


def test_a_stop_request_ends_hartigan_and_minibatch_at_their_step(blobs):
    X = np.random.default_rng(0).random((3_000, 3))  # uniform: Hartigan takes many rounds
    rec = Recorder(stop=_stop_after_iteration(3, "hartigan_round"))
    km = (
        dkmeans.KMeans(20, algorithm="hartigan", init="random", n_init=1, random_state=0)
        .set_callbacks(rec)
        .fit(X)
    )
    assert km.stop_reason_ == "stopped"
    assert len(rec.tasks("begin", "hartigan_round")) == 3
    _assert_valid_model(km, X)
    rec = Recorder(stop=_stop_after_iteration(4, "minibatch_step"))
    mb = (
        dkmeans.MiniBatchKMeans(5, batch_size=100, random_state=0, max_iter=50, tol=0)
        .set_callbacks(rec)
        .fit(blobs)
    )
    assert mb.stop_reason_ == "stopped"
    assert len(rec.tasks("begin", "minibatch_step")) == 4
    assert len(rec.tasks("begin", "run")) == 1  # a mini-batch fit is one run (n_init: its seedings)
    _assert_valid_model(mb, blobs)


@pytest.mark.parametrize("mode", ["graph", "streamed"])
def test_a_stop_request_reaches_a_loop_on_the_cluster_at_its_step(
    client, blobs, mode, graph_loop, on_cluster
):
    """One graph per pass, or read from the source in every pass: the loop runs here and stops at
    the iteration the request came with."""
    Xd = da.from_array(blobs, chunks=750)
    rec = Recorder(stop=_stop_after_iteration(3))
    km = (
        dkmeans.KMeans(
            5,
            init="random",
            random_state=0,
            local_search=False,
            tol=0,
            out_of_core=mode == "streamed",
        )
        .set_callbacks(rec)
        .fit(Xd)
    )
    assert km.stop_reason_ == "stopped" and km.n_iter_ == 3
    assert km.data_mode_ == ("out-of-core" if mode == "streamed" else "in-memory")
    _assert_valid_model(km, blobs)


def test_a_stop_request_reaches_every_spmd_rank(client, spmd):
    """SPMD: records come in batches and the request travels with rank 0's next exchange, so the
    loop stops a few iterations later, every rank at the same one (else the ranks would hang or
    fall back)."""
    rng = np.random.default_rng(0)
    # uniform: Lloyd creeps on for hundreds of steps, and each takes tens of ms, so that the fit
    # lasts seconds (60,000 rows converged within the first batches of records on a quiet machine)
    X = rng.random((400_000, 8)).astype(np.float32)
    Xd = da.from_array(X, chunks=100_000)
    rec = Recorder(stop=_stop_after_iteration(2))
    km = (
        dkmeans.KMeans(
            64, init="random", random_state=0, local_search=False, tol=0, max_iter=300, prune=False
        )
        .set_callbacks(rec)
        .fit(Xd)
    )
    assert spmd, "the loop ran SPMD"
    assert km.stop_reason_ == "stopped" and 2 <= km.n_iter_ < 300
    _assert_valid_model(km, X)


def test_an_out_of_core_fit_reports_each_pass_with_its_pieces(client, blobs):
    Xd = da.from_array(blobs, chunks=500)  # six pieces a pass
    rec = Recorder()
    km = dkmeans.KMeans(5, random_state=0, out_of_core=True, local_search=False)
    km.set_callbacks(rec).fit(Xd)
    passes = rec.tasks("begin", "pass")
    assert passes, "no pass reported"
    assert all(e[4] == "run" for e in passes)  # a task of the run that made it
    for p in passes:
        pieces = [e for e in rec.tasks("end", "piece") if e[4] == "pass" and e[5] == p[3]]
        assert len(pieces) == 6
    # each Lloyd iteration is a pass (and the initialisation's passes before them)
    assert len(passes) >= km.n_iter_
    assert len(rec.tasks("begin")) == len(rec.tasks("end"))


def test_a_watched_pass_of_few_pieces_keeps_its_results(client, blobs, monkeypatch):
    """A pass of at most ``fan_in`` pieces has no reduction tree: its pieces are its results. Watching
    them (looked at every millisecond here, so that pieces end between two looks) must not let go of
    a result before it is gathered (it was: "the Dask cluster cancelled this computation")."""
    from dkmeans.engine import futures

    monkeypatch.setattr(futures, "WATCH_POLL_S", 0.001)
    Xd = da.from_array(blobs, chunks=750)  # four pieces a pass
    events = []
    km = dkmeans.KMeans(5, random_state=0, out_of_core=True, local_search=False, max_iter=5, tol=0)
    spec = km._fit_spec()
    import dataclasses

    km._fit(Xd, None, dataclasses.replace(spec, on_pass=events.append))
    plain = dkmeans.KMeans(5, random_state=0, local_search=False, max_iter=5, tol=0).fit(blobs)
    np.testing.assert_allclose(km.cluster_centers_, plain.cluster_centers_, rtol=1e-6)
    assert {e["total"] for e in events} == {4} and any(0 < e["done"] < 4 for e in events), events


def test_pass_progress_lines_and_events(client, blobs):
    """The fit service's ``on_pass`` events: each pass from 0 to all its pieces, in order."""
    from dkmeans.fit.progress import Progress

    events = []

    class Spy(Progress):
        def pass_progress(self, event):
            events.append(dict(event))
            super().pass_progress(event)

    km = dkmeans.KMeans(5, random_state=0, out_of_core=True, local_search=False)
    spec = km._fit_spec()
    progress = Spy(0)
    import dataclasses

    km._fit(da.from_array(blobs, chunks=1000), None, dataclasses.replace(spec, **progress.hooks()))
    by_pass = {}
    for e in events:
        by_pass.setdefault(e["pass"], []).append(e["done"])
    assert by_pass
    assert all(done[0] == 0 and done[-1] == 3 and done == sorted(done) for done in by_pass.values())
    assert sorted(by_pass) == list(range(1, len(by_pass) + 1))


def test_an_out_of_core_minibatch_fit_reports_its_passes_by_windows(client, blobs):
    """Mini-batch out of core reads its batches in windows of pieces (a fold): each pass is a task of
    the run with one leaf per piece read; the fit equals the one without callbacks."""
    Xd = da.from_array(blobs, chunks=500)  # six pieces a pass
    params = dict(n_clusters=5, random_state=0, batch_size=1024, max_iter=3, out_of_core=True)
    rec = Recorder()
    km = dkmeans.MiniBatchKMeans(**params).set_callbacks(rec).fit(Xd)
    plain = dkmeans.MiniBatchKMeans(**params).fit(Xd)
    np.testing.assert_array_equal(km.cluster_centers_, plain.cluster_centers_)
    passes = rec.tasks("begin", "pass")
    assert passes, "no pass reported"
    assert all(e[4] == "run" for e in passes)
    pieces = [
        len([e for e in rec.tasks("end", "piece") if e[4] == "pass" and e[5] == p[3]])
        for p in passes
    ]
    assert all(1 <= n <= 6 for n in pieces) and 6 in pieces, pieces  # whole passes read all six
    assert len(rec.tasks("begin")) == len(rec.tasks("end"))


def _models_equal(a, b):
    for k in a.k_values:
        np.testing.assert_allclose(
            a.models[k].cluster_centers_, b.models[k].cluster_centers_, rtol=1e-6
        )


def test_a_sweep_reports_a_task_per_k_with_each_fit_nested(blobs):
    rec = AutoRecorder()
    plain = dkmeans.sweep(blobs, [2, 3, 5], random_state=0, reference_draws=0, silhouette_rows=0)
    result = dkmeans.sweep(
        blobs,
        [2, 3, 5],
        random_state=0,
        reference_draws=0,
        silhouette_rows=0,
        callbacks=[rec],
        n_init=2,
    )
    assert rec.events[0] == ("setup", "sweep") and rec.events[-1] == ("teardown", "sweep")
    ks = rec.tasks("begin", None)
    assert ks[0][1:3] == ("Sweep", "sweep")
    # each k's fit is attached to its k task (scikit-learn merges the two: one node)
    fits = [e for e in ks if e[1] == "KMeans" and e[2] == "fit"]
    assert [e[4] for e in fits] == ["sweep"] * 3 and [e[3] for e in fits] == [0, 1, 2]
    runs = rec.tasks("begin", "run")
    assert len(runs) == 3 * 2  # n_init runs of every k
    n_iter = sum(int(m.n_iter_) for m in result.models.values())
    assert len(rec.tasks("begin", "lloyd_iteration")) >= n_iter
    assert len(rec.tasks("begin")) == len(rec.tasks("end"))
    # callbacks change nothing in the models
    again = dkmeans.sweep(
        blobs,
        [2, 3, 5],
        random_state=0,
        reference_draws=0,
        silhouette_rows=0,
        callbacks=[AutoRecorder()],
    )
    assert again.suggested_k == plain.suggested_k
    _models_equal(plain, again)


def test_a_sweep_shows_a_progress_bar_and_tears_it_down_after_an_error(blobs):
    pytest.importorskip("rich")
    from sklearn.callback import ProgressBar

    bar = ProgressBar()
    result = dkmeans.sweep(blobs, [2, 4], random_state=0, reference_draws=0, callbacks=[bar])
    assert set(result.models) == {2, 4}
    assert not bar._listener_handles  # torn down: the display thread ended
    with pytest.raises(dkmeans.errors.InvalidParameterError):
        dkmeans.sweep(blobs[:3], [2, 4], random_state=0, reference_draws=0, callbacks=[bar])
    assert not bar._listener_handles


def test_a_stop_request_in_a_sweep_ends_that_k_s_loop(blobs):
    rec = AutoRecorder(stop=_stop_after_iteration(2))
    result = dkmeans.sweep(
        blobs,
        [3, 5],
        random_state=0,
        reference_draws=0,
        silhouette_rows=0,
        callbacks=[rec],
        init="random",
        local_search=False,
        tol=0,
    )
    for k in (3, 5):
        assert result.models[k].stop_reason_ == "stopped" and result.models[k].n_iter_ == 2


def test_progress_bar_in_a_grid_search_and_a_scoring_monitor_s_score(blobs):
    pytest.importorskip("rich")
    from sklearn.callback import ProgressBar, ScoringMonitor
    from sklearn.model_selection import GridSearchCV

    search = GridSearchCV(
        dkmeans.KMeans(random_state=0, init="random", local_search=False),
        {"n_clusters": [3, 5]},
        cv=2,
    ).set_callbacks(ProgressBar())
    search.fit(blobs)
    assert search.best_params_["n_clusters"] == 5
    # scikit-learn's ScoringMonitor scores only where y is given (y=None: an empty row); k-means
    # ignores y, so passing the true labels lets a score such as this one be logged
    # (a callable scoring returns a dict)
    monitor = ScoringMonitor(scoring=lambda est, X, y=None: {"score": est.score(X)})
    km = dkmeans.KMeans(5, random_state=0).set_callbacks(ProgressBar(), monitor)
    km.fit(blobs, np.zeros(len(blobs)))
    log = monitor.get_logs()
    assert [row["task_name"] for row in log.data] == ["fit"]
    assert log.data[0]["score"] == pytest.approx(km.score(blobs))


def test_a_stop_request_set_on_a_grid_search_reaches_every_fit(blobs):
    """Set on the meta-estimator and propagated to each clone, as scikit-learn propagates it."""
    from sklearn.model_selection import GridSearchCV

    rec = AutoRecorder(stop=_stop_after_iteration(2))
    search = GridSearchCV(
        dkmeans.KMeans(random_state=0, init="random", n_init=1, local_search=False, tol=0),
        {"n_clusters": [3, 5]},
        cv=2,
    ).set_callbacks(rec)
    search.fit(blobs)
    assert search.best_estimator_.stop_reason_ == "stopped" and search.best_estimator_.n_iter_ == 2
    fits = [e for e in rec.tasks("begin", "fit") if e[1] == "KMeans"]
    assert len(fits) == 2 * 2 + 1  # every candidate and fold, and the refit
    assert len(rec.tasks("begin", "lloyd_iteration")) == 2 * len(fits)
