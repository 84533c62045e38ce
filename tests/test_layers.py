"""The package's import graph: imports point down the layers of DESIGN.md, never up, never in a circle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "dkmeans"

#: The layers, bottom up. A module's layer is its folder (``dkmeans/<folder>/...``); modules at the
#: package root are the faces (their import paths are public API), except the plain shared ones in
#: :data:`BASE`. A module may import only modules of its own layer or a lower one.
FOLDERS = {"kernels": 1, "engine": 2, "drivers": 3, "io": 4, "fit": 5}
BASE = {"errors", "_version", "model", "config", "_lazy"}
NAMES = {0: "base", 1: "kernels", 2: "engine", 3: "drivers", 4: "io", 5: "fit service", 6: "faces"}

#: Modules outside the engine that import Dask, each with why (the engine is the only layer that
#: runs Dask; this list only shrinks).
DASK_OUTSIDE_ENGINE = {
    # the one configuration module: Dask's config system and its byte/time parsers, no computation
    "dkmeans.config": {"dask.config", "dask.utils"},
    # the test-data generators build Dask arrays (blobs generated on the workers) for tests and benchmarks
    "dkmeans.testing": {"dask.array"},
}


#: What a face (a module of the package root) may import beyond the faces, the fit service and the base
#: modules: the model and checkpoint files a user names (``dkmeans.io``), and from the engine only
#: ``get_client`` (public API: the cluster a user's fits run on).
FACE_FILES = {"dkmeans.io", "dkmeans.io.model_file", "dkmeans.io.checkpoint"}
FACE_ENGINE_NAMES = {"dkmeans.engine.client": {"get_client"}}
#: Root modules allowed to reach lower, each with why (this list only shrinks).
FACE_EXCEPTIONS = {
    # the test-data generators and reference fits of tests and benchmarks: they build data on the
    # engine and run single drivers whole, which is what the tests check; no user's fit goes through them
    "dkmeans.testing": "test helpers that run the engine and the drivers directly",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in FOLDERS:
        return FOLDERS[parts[1]]
    return 0 if len(parts) == 2 and parts[1] in BASE else 6


def _lazy_target(node) -> str | None:
    """The module a ``lazy_module("name")`` call names (an import at first use), else None."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
        return None
    func = node.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    return node.args[0].value if name == "lazy_module" else None


def _imports(path: Path, module: str, top_level_only: bool):
    """dkmeans modules imported by ``path`` (relative imports resolved); optionally only at module level."""
    tree = ast.parse(path.read_text())
    # (a lazy_module call runs no import at module level: it counts with the function-level ones)
    nodes = tree.body if top_level_only else ast.walk(tree)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in nodes:
        if (lazy := _lazy_target(node)) and lazy.split(".")[0] == "dkmeans":
            yield lazy
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] == "dkmeans")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1]
                    + ([base] if base else [])
                )
            if base.split(".")[0] != "dkmeans":
                continue
            for alias in node.names:  # "from dkmeans.engine import mailbox" imports a module
                candidate = f"{base}.{alias.name}"
                yield (
                    candidate
                    if (PACKAGE.parent / Path(*candidate.split("."))).with_suffix(".py").exists()
                    or (PACKAGE.parent / Path(*candidate.split("."))).is_dir()
                    else base
                )


def _graph(top_level_only: bool) -> dict[str, set[str]]:
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        graph[module] = {m for m in _imports(path, module, top_level_only) if m != module}
    return graph


def test_every_module_has_a_layer():
    for module in _graph(False):
        assert _layer(module) in NAMES, module


def test_imports_never_point_up():
    upward = [
        f"{m} ({NAMES[_layer(m)]}) imports {t} ({NAMES[_layer(t)]})"
        for m, targets in _graph(False).items()
        for t in targets
        if _layer(t) > _layer(m)
    ]
    assert not upward, "\n".join(upward)


def _cycles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize(
    "top_level_only", [True, False], ids=["module level", "including function-level"]
)
def test_no_import_cycles(top_level_only):
    graph = _graph(top_level_only)
    # a package's __init__ re-exporting its own submodules is not a circle
    graph = {
        m: {t for t in ts if not (m.startswith(t + ".") and t in graph)} for m, ts in graph.items()
    }
    assert not _cycles(graph)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _dask_imports(path: Path) -> set[str]:
    """The Dask packages (dask, distributed, dask_cuda and their modules) a file imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = (
            [_lazy_target(node)]
            if _lazy_target(node)
            else [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module]
            if isinstance(node, ast.ImportFrom) and node.module and not node.level
            else []
        )
        found |= {n for n in names if n.split(".")[0] in ("dask", "distributed", "dask_cuda")}
    return found


def _dask_users() -> dict[str, set[str]]:
    return {
        module: used
        for path in sorted(PACKAGE.rglob("*.py"))
        if not (module := _module_name(path)).startswith("dkmeans.engine")
        and (used := _dask_imports(path))
    }


def test_only_the_engine_imports_dask():
    unlisted = [
        f"{m} imports {sorted(used - set(DASK_OUTSIDE_ENGINE.get(m, {})))}"
        for m, used in _dask_users().items()
        if used - set(DASK_OUTSIDE_ENGINE.get(m, {}))
    ]
    assert not unlisted, "\n".join(unlisted)


def test_the_dask_exceptions_are_current():
    users = _dask_users()
    stale = [
        f"{m}: {name}"
        for m, names in DASK_OUTSIDE_ENGINE.items()
        for name in names
        if name not in users.get(m, set())
    ]
    assert not stale, "listed but no longer imported: " + ", ".join(stale)


def _face_imports():
    """``(face, module, name)`` for every ``dkmeans`` import of a root module (``name``: the name taken
    from ``module``, None for ``import module`` or a submodule)."""
    for path in sorted(PACKAGE.glob("*.py")):
        face = _module_name(path)
        package = face if path.name == "__init__.py" else face.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if (lazy := _lazy_target(node)) and lazy.split(".")[0] == "dkmeans":
                yield face, lazy, None
            elif isinstance(node, ast.Import):
                yield from (
                    (face, a.name, None) for a in node.names if a.name.split(".")[0] == "dkmeans"
                )
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1]
                        + ([base] if base else [])
                    )
                if base.split(".")[0] != "dkmeans":
                    continue
                for alias in node.names:
                    candidate = Path(*f"{base}.{alias.name}".split("."))
                    submodule = (PACKAGE.parent / candidate).with_suffix(".py").exists() or (
                        PACKAGE.parent / candidate
                    ).is_dir()
                    yield (
                        (face, f"{base}.{alias.name}", None)
                        if submodule
                        else (face, base, alias.name)
                    )


def _face_may_import(module: str, name: str | None) -> bool:
    return (
        _layer(module) in (0, FOLDERS["fit"], 6)
        or module in FACE_FILES
        or name in FACE_ENGINE_NAMES.get(module, ())
    )


def test_faces_speak_only_to_the_fit_service():
    """Faces import the fit service, the base modules, model files and ``engine.client.get_client``:
    how a fit runs (drivers, engine, kernels) is the fit service's to know."""
    reaching = sorted(
        {
            f"{face} imports {module}" + (f".{name}" if name else "")
            for face, module, name in _face_imports()
            if face not in FACE_EXCEPTIONS and not _face_may_import(module, name)
        }
    )
    assert not reaching, "\n".join(reaching)


def test_the_face_exceptions_are_current():
    reaching = {
        face for face, module, name in _face_imports() if not _face_may_import(module, name)
    }
    assert set(FACE_EXCEPTIONS) <= reaching, (
        f"no longer reaching lower: {sorted(set(FACE_EXCEPTIONS) - reaching)}"
    )


def test_the_face_rule_sees_names_and_modules():
    assert _face_may_import("dkmeans.engine.client", "get_client")
    assert not _face_may_import("dkmeans.engine.client", "connect_scheduler")
    assert not _face_may_import("dkmeans.engine.files", None)
    assert not _face_may_import("dkmeans.io.dataframe", None)
    assert _face_may_import("dkmeans.io.model_file", None) and _face_may_import(
        "dkmeans.fit.progress", None
    )
    assert _face_may_import("dkmeans.errors", None) and _face_may_import("dkmeans", "KMeans")


def test_the_rules_see_imports_at_first_use(tmp_path):
    """A ``lazy_module("name")`` is an import of ``name`` for the layer, face and Dask rules (not
    for the module-level cycle check: it imports nothing when the module loads)."""
    path = tmp_path / "face.py"
    path.write_text(
        "from dkmeans._lazy import lazy_module\n"
        "_inputs = lazy_module('dkmeans.fit.inputs')\n"
        "_array = lazy_module('dask.array')\n"
    )
    assert set(_imports(path, "dkmeans.face", False)) == {"dkmeans._lazy", "dkmeans.fit.inputs"}
    assert set(_imports(path, "dkmeans.face", True)) == {"dkmeans._lazy"}
    assert _dask_imports(path) == {"dask.array"}
    assert ("dkmeans.estimator", "dkmeans.fit.service", None) in set(_face_imports())


def test_the_layer_of_a_module_is_its_folder():
    assert _layer("dkmeans.kernels.backends.compiled") == 1
    assert _layer("dkmeans.engine.client") == 2
    assert _layer("dkmeans.drivers.init.two_level") == 3
    assert _layer("dkmeans.fit.service") == 5
    assert _layer("dkmeans.errors") == 0
    assert _layer("dkmeans.estimator") == _layer("dkmeans") == 6


def test_the_kernel_backends_stay_behind_the_kernel_plan():
    """Above the kernels, only the engine's placement and the kernel plan (``dkmeans.kernels.plans``)
    speak of code paths: nothing above the engine imports ``dkmeans.kernels.backends``."""
    reaching = [
        f"{m} imports {t}"
        for m, targets in _graph(False).items()
        if _layer(m) > FOLDERS["engine"]
        for t in targets
        if t.startswith("dkmeans.kernels.backends")
    ]
    assert not reaching, "\n".join(reaching)
