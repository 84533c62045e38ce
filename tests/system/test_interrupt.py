"""Interrupted calls of the Python API (KeyboardInterrupt, as Ctrl-C or Jupyter's stop button raise
it) and the embedded cluster's workers kept out of the caller's process group."""

from __future__ import annotations

import _thread
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import dask
import dask.array as da
import pytest

import dkmeans
from dkmeans.engine import worker_session
from dkmeans.testing import local_cluster, make_blobs


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(2) as client:
        yield client


@pytest.fixture(autouse=True)
def python_s_own_sigint_handler():
    """Ctrl-C as a Python session has it: the default handler, raising KeyboardInterrupt. An earlier
    import in the same test process may have replaced it (``dask_jobqueue.runner`` installs one that
    calls ``sys.exit`` when imported)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupt_after(seconds: float, when=None):
    """KeyboardInterrupt in the main thread ``seconds`` after ``when()`` is true (default: now)."""
    fired = []

    def run():
        deadline = time.monotonic() + 120
        while when is not None and not when() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(seconds)
        fired.append(time.monotonic())
        _thread.interrupt_main()

    threading.Thread(target=run, daemon=True).start()
    return fired


def _idle(client, timeout=10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(client.processing().values()):
            return True
        time.sleep(0.1)
    return False


# long enough on a quiet machine too: uniform rows in 16 dimensions and 300 clusters take hundreds
# of Lloyd iterations to converge strictly (tol=0), tens of seconds on 2 cores
LONG = dict(
    n_clusters=300,
    init="random",
    n_init=1,
    max_iter=100_000,
    tol=0,
    random_state=0,
    local_search=False,
)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["spmd", "graph", "out-of-core"])
def test_an_interrupted_fit_stops_cancels_its_tasks_and_leaves_the_cluster_usable(cluster, mode):
    X = da.random.RandomState(0).random_sample((400_000, 16), chunks=(50_000, 16))
    options = {"dkmeans.single-task-work": 0}  # not the one-task loop: the loop runs on the cluster
    if mode == "graph":
        options["dkmeans.spmd"] = False
    km = dkmeans.KMeans(**LONG, out_of_core=mode == "out-of-core")
    started = []
    fired = _interrupt_after(3.0, when=lambda: bool(started))
    with cluster.as_current(), dask.config.set(options):
        with pytest.raises(KeyboardInterrupt):
            started.append(time.monotonic())
            km.fit(X)
        stopped = time.monotonic()
        assert stopped - fired[0] < 10
        assert not hasattr(km, "cluster_centers_")  # unfitted, as before the call
        assert _idle(cluster)  # the interrupted fit's tasks were cancelled
        assert len(cluster.nthreads()) == 2
        small = dkmeans.KMeans(3, random_state=0).fit(X[:5_000])
    assert small.cluster_centers_.shape == (3, 16)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("where", ["caller", "cluster"])
def test_an_interrupted_sweep_returns_at_once(cluster, where):
    """In the caller (25 MiB of rows: within dkmeans.in-process-bytes) and on the cluster."""
    X = da.random.RandomState(1).random_sample((200_000, 16), chunks=(50_000, 16))
    started = []
    fired = _interrupt_after(3.0, when=lambda: bool(started))
    on = {"dkmeans.single-task-work": 0}
    if where == "cluster":
        on["dkmeans.in-process-bytes"] = 0
    with cluster.as_current(), dask.config.set(on):
        with pytest.raises(KeyboardInterrupt):
            started.append(1)
            dkmeans.sweep(
                X,
                [100, 200, 300],
                init="random",
                max_iter=100_000,
                tol=0,
                random_state=0,
                local_search=False,
            )
        assert time.monotonic() - fired[0] < 10
        assert _idle(cluster)
        assert dkmeans.sweep(X[:5_000], [2, 3], random_state=0).k_values == [2, 3]


@pytest.mark.timeout(600)
def test_an_interrupted_score_cancels_its_computation(cluster):
    X, _, _ = make_blobs(4_000, 4, 3, seed=0)
    km = dkmeans.KMeans(3, random_state=0).fit(X)
    big = da.random.RandomState(0).random_sample((2_000_000, 4), chunks=(50_000, 4))
    slow = big.map_blocks(lambda b: (time.sleep(0.5), b)[1], dtype=big.dtype)  # a slow score
    with cluster.as_current():
        fired = _interrupt_after(1.5)
        with pytest.raises(KeyboardInterrupt):
            km.score(slow)
        assert time.monotonic() - fired[0] < 10
        assert _idle(cluster, timeout=15)
        assert km.score(big[:10_000]) < 0


def test_the_worker_session_module_moves_only_a_nannys_worker():
    """Imported outside a nanny's worker it changes nothing; in one, the process leaves
    its parent's process group and a SIGINT held pending while it started is dropped."""
    assert not worker_session.detach()  # this process is no nanny's worker: it stays where it is
    code = (
        "import multiprocessing, os, signal\n"
        "multiprocessing.current_process().name = 'Dask Worker process (from Nanny)'\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"  # an interrupt while starting: pending
        "from dkmeans.engine import worker_session as w\n"
        "blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])\n"
        "print(w.DETACHED, os.getsid(0) == os.getpid(), blocked)"
    )
    # a child of a child: not a process group leader, as a nanny's worker process is not
    wrapper = (
        "import subprocess, sys; "
        f"sys.exit(subprocess.run([sys.executable, '-c', {code!r}]).returncode)"
    )
    out = subprocess.run(
        [sys.executable, "-c", wrapper], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "False"]  # moved, own session, SIGINT unblocked
    plain = "import dkmeans.engine.worker_session as w; print(w.DETACHED)"
    out = subprocess.run([sys.executable, "-c", plain], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="POSIX signal masks")
def test_the_embedded_cluster_workers_are_out_of_the_callers_process_group():
    code = """
import os, warnings
warnings.simplefilter("ignore")
from dkmeans.engine.client import start_local_cluster
if __name__ == "__main__":
    c = start_local_cluster(n_workers=2, dashboard_address=None)
    info = c.run(lambda: (os.getpid(), os.getpgid(0), os.getsid(0)))
    print(os.getpgid(0), sorted(info.values()))
    c.close(); c.cluster.close()
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    group, rest = out.stdout.split(" ", 1)
    workers = eval(rest)  # noqa: S307 - our own printed list of tuples
    assert len(workers) == 2
    for pid, pgid, sid in workers:
        assert pgid == pid == sid != int(group)  # each its own session and group, not the caller's


def test_the_workers_end_with_their_parent_though_out_of_its_group(tmp_path):
    """Killed outright (SIGKILL: no handler, no exit hooks), the caller leaves no worker behind:
    the workers, in sessions of their own, still end when their parent goes."""
    pids = tmp_path / "pids"
    code = f"""
import os, time, warnings
warnings.simplefilter("ignore")
from dkmeans.engine.client import start_local_cluster
if __name__ == "__main__":
    c = start_local_cluster(n_workers=2, dashboard_address=None)
    open({str(pids)!r}, "w").write(" ".join(str(p) for p in c.run(os.getpid).values()))
    time.sleep(600)
"""
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 180
        while not pids.exists() or not pids.read_text().strip():
            assert time.monotonic() < deadline and parent.poll() is None, "no cluster"
            time.sleep(0.2)
        workers = [int(p) for p in pids.read_text().split()]
        assert len(workers) == 2
    finally:
        parent.kill()
        parent.wait(30)
    deadline = time.monotonic() + 30
    alive = workers
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in workers if _running(p)]
    assert not alive, f"workers {alive} outlived their parent"


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by init) counts as ended
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def test_a_worker_told_the_cluster_closes_logs_only_critical_records():
    """What distributed's worker logs as it closes after an interrupt (a warning per cancelled task,
    a heartbeat's traceback) is dropped once the caller has said the cluster closes; critical
    records still pass. Run in a process of its own: the switch is process-wide."""
    script = textwrap.dedent("""
        import gc, logging, sys
        from dkmeans.engine import worker_session
        log = logging.getLogger("distributed.worker")  # distributed's own handler: stderr
        log.error("before")
        worker_session.prepare_to_exit()
        log.warning("Async instruction for <Task cancelled> ended with CancelledError")
        log.error("Failed to communicate with scheduler during heartbeat.")
        log.critical("still shown")
        print("frozen", gc.get_freeze_count() > 0)
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    shown = [line.rsplit(" - ", 1)[-1] for line in done.stderr.splitlines()]
    assert shown == ["before", "still shown"]
    assert done.stdout.split() == ["frozen", "True"]
