"""The ``device`` option where no GPU is needed: validation and a clear error without CuPy."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import dkmeans
from dkmeans.errors import InvalidParameterError

X = np.random.default_rng(0).normal(size=(50, 3))
NO_CUPY = importlib.util.find_spec("cupy") is None


def test_unknown_device_is_rejected(client):
    with pytest.raises(InvalidParameterError, match="device must be one of"):
        dkmeans.KMeans(2, device="tpu").fit(X)
    with pytest.raises(InvalidParameterError, match="device must be one of"):
        dkmeans.train(dkmeans.Descriptor(cluster_count=2), X, device="cuda")


@pytest.mark.skipif(not NO_CUPY, reason="CuPy is installed here")
def test_gpu_without_cupy_says_how_to_get_it(client):
    km = dkmeans.KMeans(2, device="gpu")
    with pytest.raises(InvalidParameterError, match=r"CuPy.*dkmeans\[gpu\]"):
        km.fit(X)
    assert not hasattr(km, "cluster_centers_")
    with pytest.raises(InvalidParameterError, match="CuPy"):
        dkmeans.train(dkmeans.Descriptor(cluster_count=2), X, device="gpu")


def test_cpu_device_leaves_host_data_as_it_is(client):
    a = dkmeans.KMeans(3, random_state=0, device="cpu").fit(X)
    b = dkmeans.KMeans(3, random_state=0).fit(X)
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    assert isinstance(a.labels_, np.ndarray)
