"""Shared fixtures: one real multi-process Dask cluster for the session, data, xp."""

from __future__ import annotations

import numpy as np
import pytest
from dkmeans.cluster import start_local_cluster
from dkmeans.testing import make_blobs


@pytest.fixture(scope="session")
def client():
    """A 2-worker, 1-thread-per-worker LocalCluster (processes), set as the current client."""
    c = start_local_cluster(n_workers=2, dashboard_address=None)
    with c.as_current():
        yield c
    cluster = c.cluster
    c.close()
    cluster.close()


@pytest.fixture(scope="session")
def single_worker_client():
    """A second cluster with one worker, for worker-count invariance."""
    c = start_local_cluster(n_workers=1, dashboard_address=None, set_as_default=False)
    yield c
    cluster = c.cluster
    c.close()
    cluster.close()


@pytest.fixture
def blobs():
    """Well separated blobs (float64): X, true labels, true centres."""
    return make_blobs(3000, 4, 5, spread=1.0, box=10.0, seed=1)


@pytest.fixture(params=["numpy", "cupy"])
def xp(request):
    """Array namespaces to test kernels with (CuPy only where a GPU is present)."""
    if request.param == "numpy":
        return np
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"no usable GPU: {exc}")
    return cupy


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "xp" in getattr(item, "fixturenames", ()) and "cupy" in item.name:
            item.add_marker(pytest.mark.gpu)


