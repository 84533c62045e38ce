"""Fixtures of the fit tests."""

import pytest


@pytest.fixture(scope="session")  # session, like ``client``: skips before the cluster starts
def cp():
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"no usable GPU: {exc}")
    if count < 1:  # pragma: no cover
        pytest.skip("no GPU")
    return cupy
