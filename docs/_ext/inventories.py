"""Intersphinx inventories that work without a network.

The build reads each project's ``objects.inv`` from ``docs/_inventories/<name>.inv`` when that file
is there (committed: the build is the same on a machine without network), otherwise from its site
(cached under the build directory for the next build). A project whose inventory can be had
neither way is left out of ``intersphinx_mapping``, and references to its names are not reported
as missing: they render as plain text instead of links, and the build does not fail for it.

``python docs/_ext/inventories.py`` (``make docs-inventories``) downloads every inventory again into
``docs/_inventories/``, where the network allows it.
"""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

#: name -> (documentation root, name prefixes its objects have in our docstrings)
PROJECTS = {
    "python": ("https://docs.python.org/3/", ()),
    "numpy": ("https://numpy.org/doc/stable/", ("numpy", "np")),
    "scipy": ("https://docs.scipy.org/doc/scipy/", ("scipy",)),
    "sklearn": ("https://scikit-learn.org/stable/", ("sklearn",)),
    "pandas": ("https://pandas.pydata.org/docs/", ("pandas", "pd")),
    "dask": ("https://docs.dask.org/en/stable/", ("dask",)),
    "distributed": ("https://distributed.dask.org/en/stable/", ("distributed",)),
}

COMMITTED = Path(__file__).resolve().parent.parent / "_inventories"


def _download(url: str, target: Path, timeout: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(url + "objects.inv", timeout=timeout) as response:
            data = response.read()
    except OSError:
        return False
    if not data.startswith(b"# Sphinx inventory version"):
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return True


def mapping(cache: Path, offline: bool = False):
    """``(intersphinx_mapping, nitpick_ignore_regex, notes)`` for the inventories at hand."""
    found, ignore, notes = {}, [], []
    for name, (url, prefixes) in PROJECTS.items():
        for candidate in (COMMITTED / f"{name}.inv", cache / f"{name}.inv"):
            if candidate.exists():
                found[name] = (url, str(candidate))
                break
        else:
            if not offline and _download(url, cache / f"{name}.inv"):
                found[name] = (url, str(cache / f"{name}.inv"))
            else:
                notes.append(name)
                ignore += [(r"py:.*", rf"{prefix}(\..*)?") for prefix in prefixes]
    if "python" in notes:  # builtin types named in signatures and docstrings
        ignore += [
            (
                r"py:.*",
                r"(str|int|float|bool|bytes|dict|list|tuple|set|object|callable|"
                r"None|Path|pathlib\..*|collections\..*|typing\..*|os\..*)",
            )
        ]
    return found, ignore, notes


def refresh() -> int:
    failed = [
        name
        for name, (url, _) in PROJECTS.items()
        if not _download(url, COMMITTED / f"{name}.inv", timeout=30)
    ]
    for name in failed:
        print(
            f"could not download the inventory of {name}; kept the previous file", file=sys.stderr
        )
    return 1 if len(failed) == len(PROJECTS) else 0


if __name__ == "__main__":
    sys.exit(refresh())
