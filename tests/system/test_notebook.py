"""dkmeans under a real Jupyter kernel (ipykernel, driven by nbclient and jupyter_client).

The example notebook runs cell by cell and its outputs are checked; fits are interrupted the way
Jupyter's stop button does it (SIGINT to the kernel's whole process group), and the kernel then
fits again on the same cluster.
"""

from __future__ import annotations

import json
import queue
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402
from jupyter_client.manager import AsyncKernelManager, KernelManager  # noqa: E402

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "notebook.ipynb"
KERNEL = "dkmeans-test"


@pytest.fixture(scope="module")
def kernel_specs(tmp_path_factory):
    """A kernel spec running this interpreter (not the ``python3`` the machine's Jupyter knows)."""
    root = tmp_path_factory.mktemp("kernels")
    (root / KERNEL).mkdir()
    (root / KERNEL / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "dkmeans tests",
                "language": "python",
            }
        )
    )
    return KernelSpecManager(kernel_dirs=[str(root)], ensure_native_kernel=False)


def _streams(cell, name):
    return "".join(
        o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.name == name
    )


def test_the_example_notebook_runs_clean(kernel_specs):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    km = AsyncKernelManager(kernel_name=KERNEL, kernel_spec_manager=kernel_specs)
    resources = {"metadata": {"path": str(NOTEBOOK.parent)}}
    nbclient.NotebookClient(nb, km=km, timeout=600, resources=resources).execute()
    cells = [c for c in nb.cells if c.cell_type == "code"]
    for cell in cells:
        assert not [o for o in cell.outputs if o.output_type == "error"], cell.source
        text = _streams(cell, "stdout") + _streams(cell, "stderr")
        assert "Traceback" not in text and "KeyError" not in text, (cell.source, text)
        stderr = _streams(cell, "stderr")
        if "get_client" in cell.source:  # the one warning the notebook explains (default scheduler)
            assert stderr.count("Warning") == 1 and "EmbeddedClusterWarning" in stderr, stderr
        else:
            assert not stderr.strip(), (cell.source, stderr)
        for output in cell.outputs:  # no warning shown as rich output either (rich's, matplotlib's)
            assert "Warning" not in json.dumps(output.get("data", {})), cell.source

    def by_source(fragment):
        (cell,) = [c for c in cells if fragment in c.source]
        return cell

    def pngs(cell):
        return sum("image/png" in o.get("data", {}) for o in cell.outputs)

    # each plot is shown once, as the cell's value, and the user's own figure after them too
    assert pngs(by_source("km.plot(")) == 1
    assert pngs(by_source("result.plot()")) == 1
    assert pngs(by_source("plt.subplots")) == 1
    assert "matplotlib backend: inline" in _streams(by_source("plt.subplots"), "stdout")

    # the sweep's notebook view: the table with the suggested k, and the curve
    def html_of(cell):
        return "".join(o["data"].get("text/html", "") for o in cell.outputs if "data" in o)

    html = html_of(by_source("dkmeans.sweep("))
    assert "suggested k" in html and "<svg" in html and "<table>" in html
    # the estimator keeps scikit-learn's HTML view
    fit_html = html_of(by_source("km.fit("))
    assert "sk-estimator" in fit_html or "sk-top-container" in fit_html
    # five well separated blobs: the labels predicted into the frame are scikit-learn's partition
    ari = _streams(by_source("adjusted_rand_index"), "stdout")
    assert "adjusted Rand index against sklearn's labels: 1.0" in ari
    counts = by_source("value_counts").outputs[0]["data"]["text/plain"]
    assert counts.count("4000") == 5


class Kernel:
    """A kernel started as Jupyter starts it (a process group of its own), one cell at a time."""

    def __init__(self, specs):
        self.km = KernelManager(kernel_name=KERNEL, kernel_spec_manager=specs)
        self.km.start_kernel()
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    def run(self, code, *, interrupt_when=None, interrupt_after=0.0, timeout=300):
        """Run ``code``; ``(error name or None, output text, seconds)``. With ``interrupt_when``
        (a text the cell prints), interrupt the kernel ``interrupt_after`` s after it appears."""
        msg_id = self.kc.execute(code)
        start = time.monotonic()
        text, error, seen, interrupted = [], None, None, None
        while True:
            due = seen is not None and time.monotonic() - seen >= interrupt_after
            if due and interrupted is None:
                self.km.interrupt_kernel()  # SIGINT to the kernel's group, as the stop button
                interrupted = time.monotonic()
            try:
                msg = self.kc.get_iopub_msg(timeout=0.1)
            except queue.Empty:
                waited = time.monotonic() - start
                assert waited < timeout, f"no answer in {timeout} s: {''.join(text)[-2000:]}"
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                text.append(content["text"])
                if interrupt_when is not None and seen is None and interrupt_when in "".join(text):
                    seen = time.monotonic()
            elif kind == "error":
                error = content["ename"]
                text.append("\n".join(content["traceback"]))
            elif kind == "status" and content["execution_state"] == "idle":
                stopped = time.monotonic() - (interrupted if interrupted is not None else start)
                return error, "".join(text), stopped

    def close(self):
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


@pytest.fixture
def kernel(kernel_specs):
    k = Kernel(kernel_specs)
    yield k
    k.close()


SETUP = """
import os, time, warnings
warnings.simplefilter("ignore")
import numpy as np, dask.array as da, dkmeans
X = da.random.RandomState(0).random_sample((200_000, 16), chunks=(25_000, 16)).astype("float32")
"""
WORKERS = """
c = dkmeans.get_client()
print("workers", sorted(w["pid"] for w in c.run(lambda: {"pid": os.getpid()}).values()))
"""
# long enough on a quiet machine too: uniform rows in 16 dimensions, 300 clusters, Lloyd to strict
# convergence (tol=0) take tens of seconds on 2 cores
LONG_FIT = """
X_long = da.random.RandomState(0).random_sample((400_000, 16), chunks=(50_000, 16))
km = dkmeans.KMeans(n_clusters=300, init="random", n_init=1, max_iter=100_000, tol=0,
                    random_state=0, local_search=False)
print("fitting", flush=True)
km.fit(X_long)
"""
REFIT = """
print("unfitted:", not hasattr(km, "cluster_centers_"))
t = time.monotonic()
small = dkmeans.KMeans(n_clusters=3, random_state=0).fit(X[:20_000])
print(f"refit in {time.monotonic() - t:.1f} s, {small.n_iter_} iterations")
print("busy", sum(len(v) for v in dkmeans.get_client().processing().values()))
"""


def _worker_pids(text):
    line = [ln for ln in text.splitlines() if ln.startswith("workers")][-1]
    return line


@pytest.mark.timeout(900)
def test_interrupting_a_fit_leaves_the_cluster_usable(kernel):
    """The stop button during a long fit: KeyboardInterrupt within seconds, the same workers live on
    (no restart, no worker traceback), the estimator stays unfitted, the next fit starts at once."""
    assert kernel.run(SETUP)[0] is None
    error, text, _ = kernel.run(WORKERS)
    assert error is None, text
    before = _worker_pids(text)
    error, text, stopped = kernel.run(LONG_FIT, interrupt_when="fitting", interrupt_after=6.0)
    assert error == "KeyboardInterrupt", text[-3000:]
    assert stopped < 20, stopped
    for noise in ("Process Dask Worker", "No handler", "KeyError", "died unexpectedly"):
        assert noise not in text, text[-3000:]
    error, text, _ = kernel.run(WORKERS + REFIT, timeout=120)
    assert error is None, text[-3000:]
    assert _worker_pids(text) == before  # the same processes: none died, none restarted
    assert "unfitted: True" in text
    seconds = float(text.split("refit in ")[1].split(" s")[0])
    assert seconds < 60, text  # not dkmeans.worker-timeout (120 s): no wait for workers
    assert "busy 0" in text, text  # the interrupted fit's tasks were cancelled


@pytest.mark.timeout(900)
def test_interrupting_the_first_fit_while_the_cluster_starts(kernel):
    """The stop button while the embedded cluster's workers still start (importing): the start
    finishes, then the interrupt is raised; the cluster is whole and the next fit runs."""
    assert kernel.run(SETUP)[0] is None
    error, text, _ = kernel.run(LONG_FIT, interrupt_when="fitting", interrupt_after=0.5)
    assert error == "KeyboardInterrupt", text[-3000:]
    for noise in ("Process Dask Worker", "failed to start", "Traceback (most recent call last)"):
        assert noise not in text.split("KeyboardInterrupt")[0], text[-3000:]
    error, text, _ = kernel.run(WORKERS + REFIT, timeout=120)
    assert error is None, text[-3000:]
    assert len(_worker_pids(text).split(",")) == os_cpus_or_two()


def os_cpus_or_two():
    """The embedded cluster's worker count on this machine (one per available core)."""
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


USER_CLUSTER = """
from distributed import Client, LocalCluster
cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None)
client = Client(cluster)
"""
AFTER_DEATH = """
deadline = time.monotonic() + 30  # the user's next call, once the workers are gone
while client.nthreads() and time.monotonic() < deadline:
    time.sleep(0.1)
t = time.monotonic()
try:
    dkmeans.KMeans(n_clusters=3, random_state=0).fit(X[:20_000])
except Exception as exc:
    print(f"{type(exc).__name__} after {time.monotonic() - t:.1f} s: {exc}")
"""


@pytest.mark.timeout(900)
def test_workers_of_the_users_cluster_killed_by_the_interrupt_are_named_at_once(kernel):
    """A LocalCluster the user started in the kernel shares its process group: its workers die with
    the interrupt (distributed's behaviour). The next fit says so in one line, not after
    worker-timeout."""
    assert kernel.run(SETUP + USER_CLUSTER)[0] is None
    error, text, _ = kernel.run(LONG_FIT, interrupt_when="fitting", interrupt_after=6.0)
    assert error == "KeyboardInterrupt", text[-3000:]
    error, text, _ = kernel.run(AFTER_DEATH, timeout=120)
    assert error is None, text[-3000:]
    line = [ln for ln in text.splitlines() if ln.startswith("NoWorkersError")]
    assert line, text[-3000:]
    seconds = float(line[0].split(" after ")[1].split(" s")[0])
    assert seconds < 30, line  # dkmeans.worker-timeout is 120 s
    assert "2 of the 2 workers it had died" in line[0] and "interrupted" in line[0], line
