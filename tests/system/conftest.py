"""Every test here is a system test (subprocesses, killed workers, out-of-core clusters, deploy
recipes): ``pytest -m "not system"`` is the quick inner loop (``make test-quick``).

The longest of them are also marked ``slow`` (whole modules below, single cases in their files):
``make test`` runs every test but those, ``make test-system`` runs those alone, and CI runs both.
"""

import pytest

#: Modules whose cases run for seconds to minutes each on 2 busy cores: commands, scripts and
#: the docs' examples run as processes of their own, commands stopped by signals, the
#: out-of-core acceptance on memory-limited workers, killed workers, interrupted fits, the
#: notebook under a real kernel, the single-node SLURM, and the examples as scripts.
SLOW_MODULES = frozenset(
    {
        # commands and scripts run as processes of their own (each pays Python's and the embedded
        # cluster's start, 8-20 s on 2 cores)
        "test_cli_commands.py",
        "test_cli_writers.py",
        "test_checkpoint_kill.py",
        "test_deploy.py",
        "test_docs.py",
        "test_fresh_processes.py",
        "test_kernels_targets.py",
        "test_object_stores.py",
        # stopped commands, memory-limited and killed workers, interrupted fits, notebook, SLURM
        "test_cli_signals.py",
        "test_examples.py",
        "test_out_of_core_acceptance.py",
        "test_fault.py",
        "test_interrupt.py",
        "test_notebook.py",
        "test_slurm.py",
    }
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/system/" in item.nodeid:
            item.add_marker(pytest.mark.system)
            if item.nodeid.split("::")[0].rsplit("/", 1)[-1] in SLOW_MODULES:
                item.add_marker(pytest.mark.slow)
