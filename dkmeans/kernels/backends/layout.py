"""What the kernels need to know of the compiled loops before loading them (no numba import).

The compiled loops (:mod:`.compiled` and its siblings) import numba, which costs a process
about a third of a second; the kernels reach them through :class:`LazyModule`, so a process
whose fits run the NumPy code (a small first fit) never imports it.
"""

from __future__ import annotations

import enum
import importlib

#: Feature widths of the generated direct loops that hold a block of rows in registers:
#: ``d`` is padded with zeros up to the smallest width that holds it. Above the largest
#: width the rows are streamed (:func:`.compiled.direct_kernel` with ``width=None``).
DIRECT_WIDTHS = (4, 8, 16)


class Output(enum.IntEnum):
    """What a direct kernel computes besides the nearest centroid.

    The generated loops compare their ``output`` argument with the members by name (numba
    freezes them as integer constants); callers pass ``int(member)``, which numba's dispatcher
    types at C speed, where an enum member costs about 15 us a call.
    """

    #: the labels (int32) only
    LABELS = 0
    #: the labels and the exact squared distances
    DISTANCES = 1
    #: no labels: each tile folded into float64 sums, counts and the objective
    PARTIALS = 2


def direct_width(d: int) -> int | None:
    """The generated loop width for ``d`` features, or None when ``d`` is too large."""
    for width in DIRECT_WIDTHS:
        if d <= width:
            return width
    return None


class LazyModule:
    """A module imported at its first attribute access (then read as the module itself)."""

    def __init__(self, name: str):
        self._name = name
        self._module = None

    def __getattr__(self, attr: str):
        if attr.startswith("__") or attr in ("_name", "_module"):
            raise AttributeError(attr)
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self._name)
        return getattr(module, attr)


__all__ = ["DIRECT_WIDTHS", "LazyModule", "Output", "direct_width"]
