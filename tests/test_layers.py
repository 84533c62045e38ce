"""The package's import graph: imports point down the layers of DESIGN.md, never up, never in a circle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "dkmeans"

#: Layer of each module (by dotted-name prefix, longest match wins): a module may import only
#: modules of its own layer or a lower one.
LAYERS = {
    "dkmeans.errors": 0, "dkmeans.backend": 0, "dkmeans._version": 0, "dkmeans.state": 0, "dkmeans.model": 0,
    "dkmeans.kernels": 1,
    "dkmeans.engine": 2,
    "dkmeans.lloyd": 3, "dkmeans.hartigan": 3, "dkmeans.minibatch": 3, "dkmeans.local_search": 3, "dkmeans.init": 3,
    "dkmeans.io": 4, "dkmeans._random": 4, "dkmeans._device": 4, "dkmeans._params": 4, "dkmeans.metric": 4,
    "dkmeans._validation": 5, "dkmeans.cluster": 5, "dkmeans.assignment": 5, "dkmeans.fit": 5,
    "dkmeans.metrics": 6, "dkmeans.estimator": 6, "dkmeans.minibatch_estimator": 6, "dkmeans.functional": 6, "dkmeans.cli": 6, "dkmeans.plot": 6,
    "dkmeans.testing": 6, "dkmeans.__main__": 6, "dkmeans": 6,
}
NAMES = {0: "plain data", 1: "kernels", 2: "engine", 3: "drivers", 4: "I/O and checks", 5: "fit service", 6: "faces"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[best]


def _imports(path: Path, module: str, top_level_only: bool):
    """dkmeans modules imported by ``path`` (relative imports resolved); optionally only at module level."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] == "dkmeans")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "dkmeans":
                continue
            for alias in node.names:  # "from dkmeans.engine import mailbox" imports a module
                candidate = f"{base}.{alias.name}"
                yield candidate if (PACKAGE.parent / Path(*candidate.split("."))).with_suffix(".py").exists() \
                    or (PACKAGE.parent / Path(*candidate.split("."))).is_dir() else base


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
    upward = [f"{m} ({NAMES[_layer(m)]}) imports {t} ({NAMES[_layer(t)]})"
              for m, targets in _graph(False).items() for t in targets if _layer(t) > _layer(m)]
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


@pytest.mark.parametrize("top_level_only", [True, False], ids=["module level", "including function-level"])
def test_no_import_cycles(top_level_only):
    graph = _graph(top_level_only)
    # a package's __init__ re-exporting its own submodules is not a circle
    graph = {m: {t for t in ts if not (m.startswith(t + ".") and t in graph)} for m, ts in graph.items()}
    assert not _cycles(graph)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
