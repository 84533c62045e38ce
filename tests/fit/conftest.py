"""Fixtures of the fit tests."""

import pytest

from tests.helpers import usable_cupy


@pytest.fixture(scope="session")  # session, like ``client``: skips before the cluster starts
def cp():
    return usable_cupy()
