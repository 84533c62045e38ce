"""Check that the oldest-versions environment is what it claims to be (run by `make test-oldest`).

Usage: python .ci/check_oldest.py CONSTRAINTS_FILE [PYPROJECT]

* every dependency of pyproject.toml's [project] table with a lower bound (``>=``) has a
  pin ``name==version`` in the constraints file, equal to that bound, and nothing else is
  pinned there;
* the installed version of every pinned package (in the Python running this) is the pin.

Exits 1 and names each mismatch otherwise.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, version

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version


def read_pins(path: str) -> dict[str, Version]:
    pins = {}
    for line in open(path, encoding="utf-8"):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, pinned = line.partition("==")
        if not sep:
            sys.exit(f"{path}: {line!r} is not a name==version pin")
        pins[canonicalize_name(name)] = Version(pinned.strip())
    return pins


def read_lower_bounds(path: str) -> dict[str, Version]:
    """``>=`` bounds of the [project] ``dependencies`` list (no TOML parser: Python 3.10 has none)."""
    text = open(path, encoding="utf-8").read()
    project = text.split("[project]", 1)[1]
    block = re.search(r"^dependencies\s*=\s*\[(.*?)^\]", project, re.S | re.M)
    if block is None:
        sys.exit(f"{path}: no dependencies list in [project]")
    bounds = {}
    for spec in re.findall(r'"([^"]+)"', block.group(1)):
        req = Requirement(spec)
        lower = [Version(s.version) for s in req.specifier if s.operator == ">="]
        if lower:
            bounds[canonicalize_name(req.name)] = max(lower)
    return bounds


def main(constraints: str, pyproject: str = "pyproject.toml") -> int:
    pins, bounds = read_pins(constraints), read_lower_bounds(pyproject)
    errors = []
    for name in sorted(bounds.keys() | pins.keys()):
        if name not in pins:
            errors.append(
                f"{name}: {pyproject} requires >={bounds[name]} but {constraints} does not pin it"
            )
        elif name not in bounds:
            errors.append(
                f"{name}: pinned in {constraints} but not a bounded dependency in {pyproject}"
            )
        elif pins[name] != bounds[name]:
            errors.append(
                f"{name}: pinned =={pins[name]} but the bound in {pyproject} is >={bounds[name]}"
            )
    for name, pinned in sorted(pins.items()):
        try:
            installed = Version(version(name))
        except PackageNotFoundError:
            errors.append(f"{name}: pinned =={pinned} but not installed")
            continue
        if installed != pinned:
            errors.append(f"{name}: pinned =={pinned} but {installed} is installed")
    for error in errors:
        print(f"check_oldest: {error}", file=sys.stderr)
    if not errors:
        print("check_oldest: " + ", ".join(f"{n}=={v}" for n, v in sorted(pins.items())))
    return 1 if errors else 0


if __name__ == "__main__":
    if not 2 <= len(sys.argv) <= 3:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
