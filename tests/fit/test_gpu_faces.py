"""The faces and fits added since the GPU suite's first runs, on CuPy input, against NumPy.

Size caps, Hartigan (alone and as ``refine``), mini-batch, bisecting k-means, the k sweep, the
default fit (k-means|| and local search) and ``dkmeans fit --gpu``: each on CuPy rows gives the
NumPy fit's result (to float rounding, from the same start) and CuPy labels (the fits that run in
host memory included). Every test needs CuPy and a GPU (marked ``gpu``) and skips cleanly
without them.
"""

from __future__ import annotations

import json

import dask.array as da
import numpy as np
import pandas as pd
import pytest

import dkmeans
from tests.fit.test_gpu_fit import data, host
from tests.helpers import run_cli

pytestmark = pytest.mark.gpu


def overlapping(n=3000, d=8, k=5, seed=0):
    """Blobs close enough that caps bind, and the start the two fits share."""
    return data(n, d, k, np.float64, seed=seed, spread=4.0)


@pytest.mark.parametrize("caps", [{"balanced": True}, {"max_cluster_size": 0.25}])
def test_size_caps_on_cupy_match_numpy(cp, client, caps):
    X, C0 = overlapping()
    params = dict(n_clusters=5, init=C0, n_init=1, **caps)
    cpu = dkmeans.KMeans(**params).fit(X)
    gpu = dkmeans.KMeans(**params).fit(cp.asarray(X))
    assert isinstance(gpu.labels_, cp.ndarray)
    sizes = np.bincount(host(cp, gpu.labels_), minlength=5)
    cap = 600 if caps.get("balanced") else 750
    assert sizes.max() <= cap, sizes
    np.testing.assert_array_equal(sizes, np.bincount(cpu.labels_, minlength=5))
    assert gpu.inertia_ == pytest.approx(cpu.inertia_, rel=1e-9)
    np.testing.assert_allclose(gpu.cluster_centers_, cpu.cluster_centers_, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("how", [{"algorithm": "hartigan"}, {"refine": "hartigan"}])
def test_hartigan_on_cupy_matches_numpy(cp, client, how):
    X, C0 = overlapping()
    params = dict(n_clusters=5, init=C0, n_init=1, **how)
    cpu = dkmeans.KMeans(**params).fit(X)
    gpu = dkmeans.KMeans(**params).fit(cp.asarray(X))
    assert isinstance(gpu.labels_, cp.ndarray)
    np.testing.assert_array_equal(host(cp, gpu.labels_), cpu.labels_)
    assert gpu.inertia_ == pytest.approx(cpu.inertia_, rel=1e-9)


def test_minibatch_on_cupy_matches_numpy(cp, client):
    X, C0 = overlapping(n=4000)
    params = dict(n_clusters=5, init=C0, n_init=1, batch_size=512, random_state=0)
    cpu = dkmeans.MiniBatchKMeans(**params).fit(X)
    gpu = dkmeans.MiniBatchKMeans(**params).fit(cp.asarray(X))
    np.testing.assert_allclose(gpu.cluster_centers_, cpu.cluster_centers_, rtol=1e-7, atol=1e-7)
    assert gpu.inertia_ == pytest.approx(cpu.inertia_, rel=1e-7)
    labels = gpu.predict(cp.asarray(X))
    assert isinstance(labels, cp.ndarray)
    np.testing.assert_array_equal(host(cp, labels), cpu.predict(X))


def test_minibatch_partial_fit_on_cupy_matches_numpy(cp, client):
    X, C0 = overlapping(n=2000)
    cpu = dkmeans.MiniBatchKMeans(n_clusters=5, init=C0, n_init=1, random_state=0)
    gpu = dkmeans.MiniBatchKMeans(n_clusters=5, init=C0, n_init=1, random_state=0)
    for block in np.array_split(np.arange(2000), 4):
        cpu.partial_fit(X[block])
        gpu.partial_fit(cp.asarray(X[block]))
        assert isinstance(gpu.labels_, cp.ndarray)
        np.testing.assert_array_equal(host(cp, gpu.labels_), cpu.labels_)
    np.testing.assert_allclose(gpu.cluster_centers_, cpu.cluster_centers_, rtol=1e-8, atol=1e-8)


def test_bisecting_on_cupy_matches_numpy(cp, client):
    X, _ = overlapping()
    cpu = dkmeans.BisectingKMeans(n_clusters=5, random_state=0).fit(X)
    gpu = dkmeans.BisectingKMeans(n_clusters=5, random_state=0).fit(cp.asarray(X))
    assert isinstance(gpu.labels_, cp.ndarray)
    np.testing.assert_array_equal(host(cp, gpu.labels_), cpu.labels_)
    assert gpu.inertia_ == pytest.approx(cpu.inertia_, rel=1e-9)
    labels = gpu.predict(cp.asarray(X))
    assert isinstance(labels, cp.ndarray)
    np.testing.assert_array_equal(host(cp, labels), cpu.labels_)
    Xd = da.from_array(cp.asarray(X), chunks=(700, X.shape[1]), asarray=False)
    lazy = gpu.predict(Xd)
    assert isinstance(lazy._meta, cp.ndarray)
    np.testing.assert_array_equal(host(cp, lazy), cpu.labels_)


def test_cpu_device_on_cupy_input_gives_cupy_labels(cp, client):
    X, C0 = overlapping()
    cpu = dkmeans.KMeans(n_clusters=5, init=C0, n_init=1).fit(X)
    gpu = dkmeans.KMeans(n_clusters=5, init=C0, n_init=1, device="cpu").fit(cp.asarray(X))
    assert isinstance(gpu.labels_, cp.ndarray)  # fitted in host memory, labels follow the input
    np.testing.assert_array_equal(host(cp, gpu.labels_), cpu.labels_)
    assert gpu.inertia_ == pytest.approx(cpu.inertia_, rel=1e-12)  # sums in another order


def test_size_caps_on_a_cupy_backed_dask_array(cp, client):
    X, C0 = overlapping()
    cpu = dkmeans.KMeans(n_clusters=5, init=C0, n_init=1, balanced=True).fit(X)
    Xd = da.from_array(cp.asarray(X), chunks=(700, X.shape[1]), asarray=False)
    gpu = dkmeans.KMeans(n_clusters=5, init=C0, n_init=1, balanced=True).fit(Xd)
    assert isinstance(gpu.labels_._meta, cp.ndarray)
    labels = host(cp, gpu.labels_)
    assert np.bincount(labels, minlength=5).tolist() == [600] * 5
    assert gpu.inertia_ == pytest.approx(cpu.inertia_, rel=1e-9)


def test_sweep_on_cupy_matches_numpy(cp, client):
    X, _, _ = dkmeans.testing.make_blobs(3000, 4, 4, spread=0.5, box=10.0, seed=3)
    cpu = dkmeans.sweep(X, [2, 3, 4, 5], random_state=0, reference_draws=2)
    gpu = dkmeans.sweep(cp.asarray(X), [2, 3, 4, 5], random_state=0, reference_draws=2)
    assert gpu.suggested_k == cpu.suggested_k == 4
    for k in (2, 3, 4, 5):
        assert gpu.models[k].inertia_ == pytest.approx(cpu.models[k].inertia_, rel=1e-9)


def test_default_fit_on_cupy_finds_what_numpy_finds(cp, client):
    X, _ = overlapping(n=5000, k=8, seed=2)
    cpu = dkmeans.KMeans(n_clusters=8, random_state=0).fit(X)
    gpu = dkmeans.KMeans(n_clusters=8, random_state=0).fit(cp.asarray(X))
    assert isinstance(gpu.labels_, cp.ndarray)
    assert gpu.inertia_ == pytest.approx(cpu.inertia_, rel=1e-6)


def test_cli_fit_on_gpu_workers_matches_the_cpu_fit(cp, tmp_path):
    X, C0 = overlapping(n=4000)
    pd.DataFrame(X, columns=[f"x{i}" for i in range(X.shape[1])]).to_parquet(tmp_path / "d.pq")

    def fit(*flags):
        model = tmp_path / f"m{len(flags)}.dkm"
        done = run_cli(
            "fit", tmp_path / "d.pq", "-k", 5, "--model", model, "--random-state", 0,
            "--json", "--quiet", *flags, timeout=240,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    gpu = fit("--gpu")
    cpu = fit("--local", "--workers", "1")
    assert gpu["status"] == "done"
    assert gpu["inertia"] == pytest.approx(cpu["inertia"], rel=1e-6)


def test_capped_sweep_on_cupy_matches_numpy(cp, client):
    X, _ = overlapping()
    cpu = dkmeans.sweep(X, [2, 3], balanced=True, random_state=0, reference_draws=0)
    gpu = dkmeans.sweep(cp.asarray(X), [2, 3], balanced=True, random_state=0, reference_draws=0)
    for k in (2, 3):
        labels = gpu.models[k].labels_
        assert isinstance(labels, cp.ndarray)
        np.testing.assert_array_equal(host(cp, labels), cpu.models[k].labels_)
        assert gpu.models[k].inertia_ == pytest.approx(cpu.models[k].inertia_, rel=1e-9)
