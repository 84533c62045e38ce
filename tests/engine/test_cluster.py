"""The embedded cluster: current client first, else a loopback-only LocalCluster, reused."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import dkmeans


def test_current_client_is_used(client):
    assert dkmeans.get_client() is client


SCRIPT = textwrap.dedent(
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
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert lines["LISTEN"] == "['127.0.0.1']"
    assert lines["SCHEDULER"].startswith("tcp://127.0.0.1:")
    assert lines["DASHBOARD"].startswith("http://127.0.0.1:")
    assert "THREADS [1]" in lines["WORKERS"]
