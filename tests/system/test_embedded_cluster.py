"""The embedded cluster as a user meets it: announced once, optionally not the default, quiet at exit.

Each scenario runs in its own interpreter: the test session has a shared cluster set as the
current client (conftest.py), and these need a process where no client exists.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import dask
import pytest

from dkmeans.engine.client import embedded_set_as_default
from dkmeans.errors import DKMeansError

ANNOUNCEMENT = "dkmeans started a local Dask cluster"

# Two fits of a Dask array with no client (sent to a cluster: dkmeans.in-process-bytes 0, else
# rows this small are computed once and fitted in the caller): the first starts the embedded
# cluster, the second reuses it. The script never closes it: the exit handler does.
DEFAULT_SCRIPT = textwrap.dedent(
    """
    import dask, dask.array as da, distributed
    import dkmeans

    if __name__ == "__main__":
        assert dask.base.get_scheduler() is None, "no scheduler before the fit"
        dask.config.set({"dkmeans.in-process-bytes": 0})
        X = da.random.RandomState(0).normal(size=(4000, 3), chunks=1000).astype("float32")
        km = dkmeans.KMeans(3, random_state=0, n_init=1).fit(X)  # FIRST FIT
        km = dkmeans.KMeans(3, random_state=1, n_init=1).fit(X)
        client = dkmeans.get_client()
        print("DEFAULT", distributed.default_client() is client, dask.base.get_scheduler() == client.get)
        print("LABELS", len(km.labels_.compute()))
    """
)

# The opt-out: the user's scheduler (none, then "threads") is the same after fits as before,
# no client is registered as Dask's default, and the fits (Dask and NumPy data) still work.
OPT_OUT_SCRIPT = textwrap.dedent(
    """
    import warnings
    import dask, dask.array as da, distributed, numpy as np
    import dkmeans
    from dkmeans.engine.client import EmbeddedClusterWarning, close_embedded_cluster

    if __name__ == "__main__":
        warnings.simplefilter("error", EmbeddedClusterWarning)  # the opt-out is not announced
        dask.config.set({"dkmeans.embedded-cluster.set-as-default": False, "dkmeans.in-process-bytes": 0})
        X = da.random.RandomState(0).normal(size=(4000, 3), chunks=1000).astype("float32")
        km = dkmeans.KMeans(3, random_state=0, n_init=1).fit(X)
        assert dask.base.get_scheduler() is None, dask.base.get_scheduler()
        try:
            distributed.default_client()
        except ValueError:
            pass
        else:
            raise AssertionError("the embedded cluster became the default client")
        client = dkmeans.get_client()
        assert client is dkmeans.get_client() and client.status == "running"
        assert len(client.scheduler_info(n_workers=-1)["workers"]) >= 1
        labels = km.labels_.compute(scheduler=client)  # kept on the embedded cluster

        dask.config.set(scheduler="threads")  # the user's choice, kept through a fit
        threads = dask.base.get_scheduler()
        km2 = dkmeans.KMeans(3, random_state=0, n_init=1).fit(X.compute())  # NumPy, sent to the cluster
        assert dask.config.get("scheduler") == "threads" and dask.base.get_scheduler() is threads
        assert isinstance(km2.labels_, np.ndarray)
        assert (km2.labels_ == labels).all()
        assert km.predict(X).compute().shape == (4000,)  # lazy results run on the user's scheduler
        assert np.isfinite(float(X.sum().compute()))
        close_embedded_cluster()
        print("OPT-OUT OK")
    """
)


def _run(tmp_path, name, script):
    path = tmp_path / name
    path.write_text(script)
    return subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=240, cwd=tmp_path
    ), path


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("embedded"), "default_fit.py", DEFAULT_SCRIPT)


def test_embedded_cluster_is_announced_once_and_becomes_the_default(default_run):
    res, path = default_run
    assert res.returncode == 0, res.stderr[-3000:]
    assert "DEFAULT True True" in res.stdout and "LABELS 4000" in res.stdout
    assert res.stderr.count(ANNOUNCEMENT) == 1, res.stderr  # not again on the second fit
    line = next(line for line in res.stderr.splitlines() if ANNOUNCEMENT in line)
    # shown by Python's default warning filters, pointing at the user's call, with the dashboard
    first_fit = 1 + DEFAULT_SCRIPT.splitlines().index(
        next(s for s in DEFAULT_SCRIPT.splitlines() if "FIRST FIT" in s)
    )
    assert line.startswith(f"{path}:{first_fit}: EmbeddedClusterWarning:"), line
    assert (
        "dashboard http://127.0.0.1:" in line and "dkmeans.embedded-cluster.set-as-default" in line
    )


def test_exit_without_close_is_quiet(default_run):
    """The embedded cluster closes before logging shuts down: no logging errors at exit."""
    res, _ = default_run
    assert res.returncode == 0
    assert "Logging error" not in res.stderr and "Traceback" not in res.stderr, res.stderr[-3000:]


def test_opt_out_keeps_the_users_scheduler(tmp_path):
    res, _ = _run(tmp_path, "opt_out.py", OPT_OUT_SCRIPT)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "OPT-OUT OK" in res.stdout
    assert ANNOUNCEMENT not in res.stderr and "Traceback" not in res.stderr, res.stderr[-3000:]


@pytest.mark.parametrize(
    "value, expected",
    [
        (True, True),
        (False, False),
        ("false", False),
        ("False", False),
        ("0", False),
        ("no", False),
        ("true", True),
        ("1", True),
    ],
)
def test_set_as_default_config_values(value, expected):
    """Environment variables arrive as strings (DASK_DKMEANS__EMBEDDED_CLUSTER__SET_AS_DEFAULT=false)."""
    with dask.config.set({"dkmeans.embedded-cluster.set-as-default": value}):
        assert embedded_set_as_default() is expected


def test_set_as_default_default_and_bad_value():
    assert embedded_set_as_default() is True
    with (
        dask.config.set({"dkmeans.embedded-cluster.set-as-default": "maybe"}),
        pytest.raises(DKMeansError, match="set-as-default"),
    ):
        embedded_set_as_default()


LOOPBACK_SCRIPT = textwrap.dedent(
    """
    import os, psutil
    import dkmeans

    if __name__ == "__main__":
        c = dkmeans.get_client()
        assert c is dkmeans.get_client(), "the embedded cluster is reused"
        workers = c.scheduler_info(n_workers=-1)["workers"]
        print("WORKERS", len(workers), "THREADS", sorted({w["nthreads"] for w in workers.values()}))
        procs = [psutil.Process(os.getpid())] + psutil.Process(os.getpid()).children(recursive=True)
        listening = sorted({
            x.laddr.ip for p in procs for x in p.net_connections(kind="inet") if x.status == "LISTEN"
        })
        print("LISTEN", listening)
        print("SCHEDULER", c.scheduler.address)
        print("DASHBOARD", c.dashboard_link)
    """
)


def test_embedded_cluster_binds_loopback_only(tmp_path):
    script = tmp_path / "embedded.py"
    script.write_text(LOOPBACK_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert lines["LISTEN"] == "['127.0.0.1']"
    assert lines["SCHEDULER"].startswith("tcp://127.0.0.1:")
    assert lines["DASHBOARD"].startswith("http://127.0.0.1:")
    assert "THREADS [1]" in lines["WORKERS"]
