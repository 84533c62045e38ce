"""What a worker imports to run a fit's tasks on arrays: the drivers' modules (their chunk
functions travel by reference), the first pass's and the engine's, without scikit-learn (with it,
pandas, pyarrow and scipy.stats: about 2 s of a fresh worker's first task on 2 cores, which every
pass waited for) nor pandas (0.7 s more, at the labels' pass)."""

from __future__ import annotations

from tests.helpers import loaded_after


def test_the_tasks_modules_import_neither_scikit_learn_nor_pandas():
    statement = (
        "import importlib, pkgutil\n"
        "import dkmeans.drivers, dkmeans.drivers.init\n"
        "names = ['dkmeans.fit.first_pass', 'dkmeans.kernels.warm', 'dkmeans.engine.rowwise',\n"
        "         'dkmeans.engine.persisted', 'dkmeans.engine.spmd', 'dkmeans.engine.probe']\n"
        "for package in (dkmeans.drivers, dkmeans.drivers.init):\n"
        "    names += [package.__name__ + '.' + m.name for m in pkgutil.iter_modules(package.__path__)]\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "assert len(names) > 10, names\n"
    )
    assert loaded_after(statement, ("sklearn", "pandas", "pyarrow")) == []
