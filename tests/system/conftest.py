"""Every test here is a system test (subprocesses, killed workers, out-of-core clusters, deploy
recipes): ``pytest -m "not system"`` is the quick inner loop; ``make test`` and CI run them all."""

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/system/" in item.nodeid:
            item.add_marker(pytest.mark.system)
