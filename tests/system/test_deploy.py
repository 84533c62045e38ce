"""Deployment recipes in deploy/: the local script end to end on a real command-line cluster,
the Kubernetes manifests, the SLURM launcher and a GPU fit (skipped without a GPU)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.helpers import usable_cupy

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RUN_LOCAL = DEPLOY / "local" / "run_local.sh"
K, SEED, COLUMNS = 4, 7, ["a", "b", "c"]


# -- helpers -----------------------------------------------------------------------
def _script_env(tmp_path):
    """PATH/PYTHON pointing at this interpreter; TMPDIR under tmp_path, so every process the
    script starts carries tmp_path in its command line (its scheduler file and scratch dir)."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHON"] = sys.executable
    env["TMPDIR"] = str(tmp_path)
    env["STARTUP_TIMEOUT"] = "60"
    return env


def _started_under(path):
    """Live processes the script started: their TMPDIR is ``path`` (inherited by every child,
    also the nannies' spawned worker processes) or their command line mentions it."""
    psutil = pytest.importorskip("psutil")
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if p.pid == os.getpid():
            continue
        try:
            if any(str(path) in part for part in (p.info["cmdline"] or [])) or p.environ().get(
                "TMPDIR"
            ) == str(path):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def _cli_dask_processes():
    """Live ``dask scheduler`` / ``dask worker`` command-line processes (and their nannies)."""
    psutil = pytest.importorskip("psutil")
    found = set()
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if any(
            s in cmd
            for s in (
                "dask scheduler",
                "dask worker",
                "dask cuda worker",
                "dask_scheduler",
                "dask_worker",
            )
        ):
            found.add(p.pid)
    return found


def _kill_leftovers(tmp_path, timeout=10.0):
    """Kill whatever the script left under tmp_path (a test failure, not normal operation)."""
    psutil = pytest.importorskip("psutil")
    leftovers = _started_under(tmp_path)
    for p in leftovers:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(leftovers, timeout=timeout)
    return leftovers


def _assert_nothing_left(tmp_path, before):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = _started_under(tmp_path)
        new_dask = _cli_dask_processes() - before
        if not left and not new_dask:
            return
        time.sleep(0.2)
    raise AssertionError(
        f"processes left behind: {[p.cmdline() for p in left]} / dask pids {sorted(new_dask)}"
    )


def _run_script(args, tmp_path, timeout=150):
    """Run run_local.sh in its own process group; kill the group and leftovers on any exit."""
    proc = subprocess.Popen(
        ["bash", str(RUN_LOCAL), *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_script_env(tmp_path),
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the script's trap stops its cluster
            try:
                proc.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    return proc.returncode, out, err


@pytest.fixture(scope="module")
def blob_parquet(tmp_path_factory):
    """Generated blobs as a 3-file Parquet data set with an id column to exclude."""
    from dkmeans.testing import make_blobs

    X, truth, _ = make_blobs(6000, len(COLUMNS), K, spread=1.0, box=10.0, seed=3)
    df = pd.DataFrame(X, columns=COLUMNS).assign(id=np.arange(len(X)), truth=truth)
    path = tmp_path_factory.mktemp("deploy-data") / "blobs"
    path.mkdir()
    for i, start in enumerate(range(0, len(df), 2000)):
        df.iloc[start : start + 2000].to_parquet(path / f"part.{i}.parquet", index=False)
    return path


# -- the local command-line cluster ------------------------------------------------
def test_run_local_script_matches_in_process_fit(blob_parquet, tmp_path, client):
    """`dask scheduler` + 2 `dask worker` processes on loopback, `dkmeans fit` and `predict`
    against them: the same centroids and labels as an in-process fit; nothing left running."""
    from dkmeans import KMeans
    from dkmeans.engine.files import read_table

    before = _cli_dask_processes()
    model, labelled = tmp_path / "model.npz", tmp_path / "labelled"
    try:
        rc, out, err = _run_script(
            [
                "--workers",
                2,
                "--predict",
                blob_parquet,
                labelled,
                "--",
                blob_parquet,
                "-k",
                K,
                "--model",
                model,
                "--exclude",
                "id",
                "truth",
                "--random-state",
                SEED,
                "--quiet",
            ],
            tmp_path,
        )
        assert rc == 0, f"stdout:\n{out}\nstderr:\n{err[-4000:]}"
        assert "with 2 worker(s)" in out and "tcp://127.0.0.1:" in out  # loopback only
        assert f"model written to {model}" in out
    finally:
        leftovers = _kill_leftovers(tmp_path)
    assert not leftovers, f"run_local.sh left processes running: {[p.pid for p in leftovers]}"
    _assert_nothing_left(tmp_path, before)

    # the same fit in this process, on the session's 2-worker LocalCluster
    df = read_table(blob_parquet)
    ref = KMeans(n_clusters=K, random_state=SEED).fit(df[COLUMNS])
    remote = KMeans.load(model)
    assert list(remote.feature_names_in_) == COLUMNS
    np.testing.assert_allclose(remote.cluster_centers_, ref.cluster_centers_, rtol=1e-6, atol=1e-9)
    assert remote.n_iter_ == ref.n_iter_

    got = pd.read_parquet(labelled).sort_values("id")
    assert len(got) == 6000 and {"cluster", "id", "truth", *COLUMNS} <= set(got.columns)
    expected = df.assign(cluster=ref.predict(df[COLUMNS])).compute().sort_values("id")
    np.testing.assert_array_equal(got["cluster"].to_numpy(), expected["cluster"].to_numpy())
    from dkmeans import metrics

    assert metrics.adjusted_rand_index(got["truth"].to_numpy(), got["cluster"].to_numpy()) > 0.99


def test_run_local_script_stops_cluster_on_error(blob_parquet, tmp_path):
    """A dkmeans user error (exit 2, one stderr line) still stops the scheduler and workers."""
    before = _cli_dask_processes()
    try:
        rc, out, err = _run_script(
            [
                "--workers",
                1,
                blob_parquet,
                "-k",
                K,
                "--model",
                tmp_path / "m.npz",
                "--columns",
                "no_such_column",
            ],
            tmp_path,
            timeout=90,
        )
    finally:
        leftovers = _kill_leftovers(tmp_path)
    assert rc == 2, err[-3000:]
    assert "with 1 worker(s)" in out
    assert "dkmeans: error:" in err and "no_such_column" in err
    assert not leftovers, (
        f"run_local.sh left processes running after an error: {[p.pid for p in leftovers]}"
    )
    _assert_nothing_left(tmp_path, before)


def test_run_local_script_stops_cluster_on_sigterm(blob_parquet, tmp_path):
    """SIGTERM to the script's process group while the fit runs: the trap stops the cluster."""
    before = _cli_dask_processes()
    proc = subprocess.Popen(
        [
            "bash",
            str(RUN_LOCAL),
            "--workers",
            "1",
            blob_parquet,
            "-k",
            str(K),
            "--model",
            tmp_path / "m.npz",
            "--exclude",
            "id",
            "truth",
            "--quiet",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_script_env(tmp_path),
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        line = proc.stdout.readline()  # printed once the workers are up, just before the fit
        assert "run_local.sh: scheduler tcp://127.0.0.1:" in line, proc.stderr.read()[-3000:]
        assert len(_started_under(tmp_path)) >= 3  # scheduler, nanny, worker (and the fit)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        leftovers = _kill_leftovers(tmp_path)
    assert proc.returncode != 0
    assert not leftovers, (
        f"run_local.sh left processes running after SIGTERM: {[p.pid for p in leftovers]}"
    )
    _assert_nothing_left(tmp_path, before)


def test_run_local_script_usage_errors(tmp_path):
    rc, _, err = _run_script([], tmp_path, timeout=30)
    assert rc == 2 and "no arguments for dkmeans fit" in err
    rc, _, err = _run_script(
        ["--workers", "0", "x.parquet", "-k", "2", "--model", "m.npz"], tmp_path, timeout=30
    )
    assert rc == 2 and "--workers" in err
    assert not _started_under(tmp_path)


# -- Kubernetes manifests ----------------------------------------------------------
def _containers(pod_spec):
    containers = pod_spec["containers"]
    assert containers, "a pod spec without containers"
    for c in containers:
        assert c.get("image"), f"container {c.get('name')} has no image"
        assert c.get("command") or c.get("args"), f"container {c.get('name')} has no command/args"
    return containers


def _argv(container):
    return [str(a) for a in (container.get("command") or []) + (container.get("args") or [])]


def _check_cluster_spec(spec, gpu=False):
    worker = _containers(spec["worker"]["spec"])[0]
    assert spec["worker"]["replicas"] >= 1
    assert _argv(worker)[:3] == (
        ["dask", "cuda", "worker"] if gpu else ["dask", "worker", "--name"]
    )
    assert "$(DASK_WORKER_NAME)" in _argv(worker)
    limits = worker["resources"]["limits"]
    assert ("nvidia.com/gpu" in limits) == gpu
    if gpu:
        assert int(limits["nvidia.com/gpu"]) == 1
    scheduler = _containers(spec["scheduler"]["spec"])[0]
    assert _argv(scheduler)[:2] == ["dask", "scheduler"]
    assert {p["containerPort"] for p in scheduler["ports"]} == {8786, 8787}
    service = spec["scheduler"]["service"]
    assert {p["port"] for p in service["ports"]} == {8786, 8787}
    assert service.get("type", "ClusterIP") == "ClusterIP"  # never exposed outside the cluster
    return worker, scheduler, service


@pytest.mark.parametrize(
    "name, gpu", [("daskcluster-cpu.yaml", False), ("daskcluster-gpu.yaml", True)]
)
def test_kubernetes_daskcluster_manifests(name, gpu):
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    docs = [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()) if d]
    assert len(docs) == 1
    doc = docs[0]
    assert doc["apiVersion"] == "kubernetes.dask.org/v1" and doc["kind"] == "DaskCluster"
    worker, scheduler, service = _check_cluster_spec(doc["spec"], gpu=gpu)
    assert service["selector"]["dask.org/cluster-name"] == doc["metadata"]["name"]
    assert worker["image"] == scheduler["image"]  # same versions everywhere
    assert worker["image"].endswith("-gpu") == gpu


def test_kubernetes_daskjob_manifest():
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    docs = {
        d["kind"]: d
        for d in yaml.safe_load_all((DEPLOY / "kubernetes" / "daskjob-fit.yaml").read_text())
        if d
    }
    job = docs["DaskJob"]
    assert job["apiVersion"] == "kubernetes.dask.org/v1"
    runner = _containers(job["spec"]["job"]["spec"])[0]
    argv = _argv(runner)
    assert (
        argv[:2] == ["dkmeans", "fit"]
        and argv[2].startswith("s3://")
        and argv[2].endswith(".parquet")
    )
    assert argv[argv.index("--scheduler") + 1] == "$(DASK_SCHEDULER_ADDRESS)"
    assert "-k" in argv and "--model" in argv
    model_dir = str(Path(argv[argv.index("--model") + 1]).parent)
    assert any(
        m["mountPath"] == model_dir for m in runner["volumeMounts"]
    )  # the model outlives the pod
    claim = next(v for v in job["spec"]["job"]["spec"]["volumes"] if "persistentVolumeClaim" in v)
    assert (
        claim["persistentVolumeClaim"]["claimName"]
        == docs["PersistentVolumeClaim"]["metadata"]["name"]
    )
    worker, scheduler, service = _check_cluster_spec(job["spec"]["cluster"]["spec"])
    assert service["selector"]["dask.org/cluster-name"] == job["metadata"]["name"]
    assert runner["image"] == worker["image"] == scheduler["image"]


def test_kubernetes_images_are_built_by_the_dockerfiles():
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    kdir = DEPLOY / "kubernetes"
    images = set()
    for f in kdir.glob("*.yaml"):
        for doc in yaml.safe_load_all(f.read_text()):
            text = yaml.safe_dump(doc)
            images |= {
                line.split("image:", 1)[1].strip() for line in text.splitlines() if "image:" in line
            }
    assert images == {
        "registry.example.com/dkmeans:0.1.0",
        "registry.example.com/dkmeans:0.1.0-gpu",
    }
    cpu, gpu = (kdir / "Dockerfile").read_text(), (kdir / "Dockerfile.gpu").read_text()
    assert (
        "FROM python:3.11-slim" in cpu
        and "s3fs" in cpu
        and "-t registry.example.com/dkmeans:0.1.0 " in cpu
    )
    assert "[gpu]" in gpu and "s3fs" in gpu and "-t registry.example.com/dkmeans:0.1.0-gpu " in gpu


# -- SLURM ---------------------------------------------------------------------------
def _load_slurm_launcher():
    spec = importlib.util.spec_from_file_location(
        "dkmeans_slurm_cluster", DEPLOY / "slurm" / "slurm_cluster.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_slurm_launcher_job_script():
    pytest.importorskip(
        "dask_jobqueue", reason="dask-jobqueue is not installed (pip install dask-jobqueue)"
    )
    launcher = _load_slurm_launcher()
    args = launcher.build_parser().parse_args(
        [
            "data/*.parquet",
            "-k",
            "8",
            "--model",
            "m.npz",
            "--cores",
            "6",
            "--processes",
            "3",
            "--memory",
            "24GB",
            "--walltime",
            "02:30:00",
            "--queue",
            "compute",
            "--account",
            "proj42",
            "--jobs",
            "3",
            "--job-extra=--exclusive",
            "--scheduler-host",
            "127.0.0.1",
        ]
    )
    cluster = launcher.make_cluster(args)
    try:
        script = cluster.job_script()
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
    finally:
        cluster.close()
    sbatch = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --cpus-per-task=6" in sbatch
    assert any(line.startswith("#SBATCH --mem=") for line in sbatch)
    assert "#SBATCH -t 02:30:00" in sbatch
    assert "#SBATCH -p compute" in sbatch and "#SBATCH -A proj42" in sbatch
    assert "#SBATCH --exclusive" in sbatch
    worker_cmd = next(
        line for line in script.splitlines() if "dask_worker" in line or "dask worker" in line
    )
    assert "--nworkers 3" in worker_cmd and "--nthreads 2" in worker_cmd
    assert "export OMP_NUM_THREADS=2" in script


def test_slurm_launcher_fit_on_a_client(blob_parquet, tmp_path, client):
    """The launcher's fit step (read Parquet, KMeans.fit, save) on an existing client."""
    launcher = _load_slurm_launcher()
    args = launcher.build_parser().parse_args(
        [
            str(blob_parquet),
            "-k",
            str(K),
            "--model",
            str(tmp_path / "m.npz"),
            "--exclude",
            "id",
            "truth",
            "--random-state",
            str(SEED),
        ]
    )
    km = launcher.fit(client, args)
    from dkmeans import KMeans

    assert list(KMeans.load(tmp_path / "m.npz").feature_names_in_) == COLUMNS
    assert km.cluster_centers_.shape == (K, len(COLUMNS))


def test_sbatch_template_is_valid_bash():
    path = DEPLOY / "slurm" / "sbatch_fit.sh"
    subprocess.run(["bash", "-n", str(path)], check=True)
    text = path.read_text()
    assert (
        "srun" in text
        and "dask scheduler --scheduler-file" in text
        and "dask worker --scheduler-file" in text
    )
    assert 'dkmeans fit "$@" --scheduler' in text
    subprocess.run(["bash", "-n", str(RUN_LOCAL)], check=True)


# -- GPU -----------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_fit_on_local_cuda_cluster(tmp_path):
    """get_client(gpu=True) starts a LocalCUDACluster; a fit on CuPy chunks finds the blobs."""
    usable_cupy()
    pytest.importorskip(
        "dask_cuda", reason="dask-cuda is not installed (pip install 'dkmeans[gpu]')"
    )
    # A fresh process: the session's CPU client would otherwise be the current client.
    code = textwrap.dedent(f"""
        import cupy, dask.array as da, numpy as np
        from dkmeans import KMeans, metrics
        from dkmeans.engine.client import get_client
        from dkmeans.testing import make_blobs

        client = get_client(gpu=True)
        assert type(client.cluster).__name__ == "LocalCUDACluster", type(client.cluster)
        X, truth, _ = make_blobs(20000, 3, {K}, spread=1.0, box=10.0, seed=3, dtype=np.float32)
        Xg = da.from_array(X, chunks=(5000, 3)).map_blocks(cupy.asarray, dtype=X.dtype)
        km = KMeans(n_clusters={K}, random_state={SEED}).fit(Xg)
        labels = km.predict(Xg).compute()
        labels = cupy.asnumpy(labels) if hasattr(labels, "get") else np.asarray(labels)
        ari = metrics.adjusted_rand_index(truth, labels)
        assert ari > 0.99, ari
        print("gpu ok", ari)
    """)
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr[-4000:]
    assert "gpu ok" in res.stdout
