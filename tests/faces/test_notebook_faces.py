"""What a notebook user meets: plots that leave matplotlib alone and return Figures, the sweep's
HTML view, and scikit-learn's callback protocol (where scikit-learn has it); lazy submodules, in a
fresh process, are in ``tests/system/test_fresh_processes.py``."""

from __future__ import annotations

import numpy as np
import pytest

import dkmeans
from dkmeans import _callbacks
from dkmeans.testing import make_blobs

matplotlib = pytest.importorskip("matplotlib")


@pytest.fixture
def blobs():
    X, _, _ = make_blobs(2_000, 3, 4, seed=0)
    return X


def test_plots_return_figures_and_leave_the_backend_alone(blobs, tmp_path):
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    backend = matplotlib.get_backend()
    km = dkmeans.KMeans(4, random_state=0).fit(blobs)
    figures = [
        km.plot(),
        km.plot(blobs),
        dkmeans.plot.plot_history(km.history_),
        dkmeans.plot.plot_clusters(blobs, km.labels_, km.cluster_centers_),
        dkmeans.plot.plot_sweep([2, 3, 4], [30.0, 20.0, 15.0], 3),
    ]
    assert all(isinstance(f, Figure) for f in figures)
    assert len(figures[1].axes) == 2 and figures[1].axes[1].get_title() == "4 clusters"
    assert matplotlib.get_backend() == backend
    fig, ax = plt.subplots()
    assert dkmeans.plot.plot_history(km.history_, ax=ax) is ax  # drawn on the caller's axes
    plt.close("all")
    opened = plt.get_fignums()
    path = dkmeans.plot.save_fit_plot(
        tmp_path / "fit.png", km.history_, blobs, km.labels_, km.cluster_centers_
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plt.get_fignums() == opened  # files are drawn off pyplot: nothing left open
    for f in figures:
        plt.close(f)


def test_sweep_result_has_a_notebook_view(blobs):
    result = dkmeans.sweep(blobs, [2, 3, 4, 5], random_state=0)
    html = result._repr_html_()
    assert "<table>" in html and "<svg" in html
    assert f"suggested k = <b>{result.suggested_k}</b>" in html
    assert html.count("<tr") == 1 + len(result.k_values)  # the head, then one row per k
    fig = result.plot()
    assert fig.axes[0].get_title() == "objective per k"
    # the estimators keep scikit-learn's HTML view
    assert "sk-" in result.models[3]._repr_html_()


needs_callbacks = pytest.mark.skipif(
    not _callbacks.AVAILABLE, reason="scikit-learn without sklearn.callback"
)


class _Recorder:
    """A FitCallback recording the tasks it sees begin and end (and whether a fitted model came)."""

    def __init__(self):
        self.events = []

    def setup(self, estimator, context):
        self.events.append(("setup", context.task_name))

    def on_fit_task_begin(self, estimator, context):
        self.events.append(("begin", context.task_name))

    def on_fit_task_end(self, estimator, context, *, X=None, fitted_estimator=None):
        self.events.append(("end", context.task_name, fitted_estimator is not None))
        if fitted_estimator is not None:  # a model ready to score, as ScoringMonitor uses it
            self.score = fitted_estimator.score(X)

    def teardown(self, estimator, context):
        self.events.append(("teardown", context.task_name))


@needs_callbacks
@pytest.mark.parametrize("n_init", [1, 3])
def test_kmeans_reports_its_task_tree_to_callbacks(blobs, n_init):
    rec = _Recorder()
    km = dkmeans.KMeans(4, init="random", n_init=n_init, random_state=0, local_search=False)
    km.set_callbacks(rec)
    km.fit(blobs)
    begins = [e[1] for e in rec.events if e[0] == "begin"]
    ends = [e for e in rec.events if e[0] == "end"]
    assert begins[0] == "fit" and begins.count("run") == n_init
    assert begins.count("initialization") == n_init
    assert len([e for e in ends if e[1] == "lloyd_iteration"]) >= km.n_iter_
    assert len(begins) == len(ends)  # every task ended
    assert ends[-1] == ("end", "fit", True)  # the root's end carries the fitted model
    assert rec.score == pytest.approx(-km.inertia_)
    assert rec.events[0] == ("setup", "fit") and rec.events[-1] == ("teardown", "fit")


@needs_callbacks
def test_progress_bar_and_scoring_monitor_work_alone_and_in_a_grid_search(blobs):
    pytest.importorskip("rich")
    from sklearn.callback import ProgressBar, ScoringMonitor
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    monitor = ScoringMonitor(scoring=lambda est, X, y=None: est.score(X))
    km = dkmeans.KMeans(4, random_state=0).set_callbacks(ProgressBar(), monitor)
    reference = dkmeans.KMeans(4, random_state=0).fit(blobs)
    km.fit(blobs)
    # callbacks change nothing in the fit
    np.testing.assert_array_equal(km.cluster_centers_, reference.cluster_centers_)
    assert monitor.get_logs().data[0]["task_name"] == "fit"
    mb = dkmeans.MiniBatchKMeans(4, random_state=0, batch_size=256).set_callbacks(ProgressBar())
    assert mb.fit(blobs).cluster_centers_.shape == (4, 3)
    search = GridSearchCV(
        make_pipeline(StandardScaler(), dkmeans.KMeans(random_state=0)),
        {"kmeans__n_clusters": [2, 4]},
        cv=2,
    ).set_callbacks(ProgressBar())
    search.fit(blobs)
    assert search.best_params_["kmeans__n_clusters"] == 4


class _StopAfterFirstRun(_Recorder):
    """Asks to stop at the end of the first run (as an early-stopping callback would)."""

    def on_fit_task_end(self, estimator, context, *, X=None, fitted_estimator=None):
        super().on_fit_task_end(estimator, context, X=X, fitted_estimator=fitted_estimator)
        return context.task_name == "run"


@needs_callbacks
def test_a_stop_request_ends_the_runs_left(blobs):
    """``n_init=4`` with a callback that asks to stop after the first run: one run is made, and
    the fit ends with that run's model (a fitted estimator, as scikit-learn's stop requests leave)."""
    rec = _StopAfterFirstRun()
    km = dkmeans.KMeans(4, init="random", n_init=4, random_state=0).set_callbacks(rec)
    km.fit(blobs)
    assert [e[1] for e in rec.events if e[0] == "begin"].count("run") == 1
    one = dkmeans.KMeans(4, init="random", n_init=1, random_state=0).fit(blobs)
    np.testing.assert_allclose(km.cluster_centers_, one.cluster_centers_)
    assert km.inertia_ == pytest.approx(one.inertia_)
