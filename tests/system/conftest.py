"""Every test here is a system test (subprocesses, killed workers, out-of-core clusters, deploy
recipes): ``pytest -m "not system"`` is the quick inner loop (``make test-quick``).

The longest of them are also marked ``slow`` (whole modules below, single cases in their files):
``make test`` runs every test but those, ``make test-system`` runs those alone, and CI runs both.
"""

import pytest

#: Modules whose every case runs for tens of seconds to minutes on 2 busy cores: commands
#: stopped by signals, the out-of-core acceptance on memory-limited workers, killed workers,
#: interrupted fits, the notebook under a real kernel, the single-node SLURM, and the examples
#: as scripts (at the sizes of the gallery, which ``make docs`` also runs).
SLOW_MODULES = frozenset({
    "test_cli_signals.py",
    "test_examples.py",
    "test_out_of_core_acceptance.py",
    "test_fault.py",
    "test_interrupt.py",
    "test_notebook.py",
    "test_slurm.py",
})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/system/" in item.nodeid:
            item.add_marker(pytest.mark.system)
            if item.nodeid.split("::")[0].rsplit("/", 1)[-1] in SLOW_MODULES:
                item.add_marker(pytest.mark.slow)
