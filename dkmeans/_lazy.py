"""Modules imported at their first use: how the faces stay light to import.

The fit service, its data checks and inference load Dask's array collection and distributed
(1-2 s of a fresh process on 2 cores). A face names each such module once, at its top::

    _inputs = lazy_module("dkmeans.fit.inputs")

and its methods read names from it (``_inputs.as_dataset(X)``): the first read imports the
module, so importing (and constructing) an estimator loads what scikit-learn's does, and a fit
loads the rest. The layer rules of the package's tests read these calls as imports.

A package's public names are reached so too: :func:`lazy_attributes` is the ``__getattr__``
(PEP 562) of ``dkmeans`` and ``dkmeans.engine``.
"""

from __future__ import annotations

import importlib
import types


class LazyModule:
    """Stands for the module ``name``, imported at the first attribute read (then kept)."""

    __slots__ = ("_module", "_name")

    def __init__(self, name: str):
        self._name = name
        self._module: types.ModuleType | None = None

    def __getattr__(self, attr: str):
        module = self._module
        if module is None:  # importlib's lock makes a first read from two threads one import
            module = self._module = importlib.import_module(self._name)
        return getattr(module, attr)

    def __repr__(self) -> str:
        state = "imported" if self._module is not None else "not imported yet"
        return f"<lazy module {self._name!r} ({state})>"


def lazy_module(name: str) -> LazyModule:
    """The module ``name``, imported when a name is first read from it.

    Parameters
    ----------
    name : str
        The module's absolute name, as ``importlib.import_module`` takes it.

    Returns
    -------
    LazyModule
        Reads of its attributes are the module's (looked up at each read, so a test's
        ``monkeypatch`` of the module is seen).
    """
    return LazyModule(name)


def lazy_attributes(module: str, names: dict, namespace: dict, submodules=()):
    """A package's ``__getattr__`` (PEP 562): its public names, each imported on first use.

    Parameters
    ----------
    module : str
        The package's name (``__name__``), for its submodules and error messages.
    names : dict
        Each public name and the module that defines it.
    namespace : dict
        The package's ``globals()``: a name read once is kept there, so that later reads do
        not call ``__getattr__``.
    submodules : iterable of str, optional
        Submodules reached as attributes (``dkmeans.plot``), imported on first use.

    Returns
    -------
    callable
        The ``__getattr__`` to assign at the package's top.
    """
    submodules = frozenset(submodules)

    def __getattr__(name: str):
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
            namespace[name] = value
            return value
        if name in submodules:
            return importlib.import_module(f"{module}.{name}")
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
