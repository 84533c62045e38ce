"""Pages generated from the code at each build, so that they cannot fall behind it.

* ``api/index.rst``: the API reference, one autosummary table per public module. The names come
  from ``dkmeans.__all__`` (and a module's ``__all__`` where it has one), otherwise from the public
  functions and classes a module defines: a name added to the package appears without editing
  a list.
* ``_generated/cli.md``: ``--help`` of the ``dkmeans`` command and of each of its subcommands, read
  from :func:`dkmeans.cli.build_parser`.
* ``_generated/guide-toctree.md``: the guide's table of contents, every ``docs/guide/*.md``
  (a page added to the folder is in the guide without editing a list).
* ``_generated/config.md``: every ``dkmeans.*`` Dask configuration key from the one table
  :data:`dkmeans.config.KEYS`.

Generated files are written only when their text changes (Sphinx then rereads only what changed).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
from pathlib import Path

#: (module, heading, one sentence) of each section of the API reference, in page order.
API_SECTIONS = (
    (
        "dkmeans",
        "Estimators, the functional API and the k sweep",
        "Everything in ``dkmeans.__all__``: the scikit-learn estimators, the oneDAL-style functional "
        "API, the k sweep and the cluster the fits run on.",
    ),
    (
        "dkmeans.metrics",
        "Metrics",
        "Internal cluster scores over data of any size, and comparisons with known labels or "
        "centroids.",
    ),
    ("dkmeans.plot", "Plotting", "matplotlib figures of a fit and of a sweep (``dkmeans[plot]``)."),
    (
        "dkmeans.engine.files",
        "Reading and writing files",
        "Parquet and CSV in, labelled Parquet out, as the command line reads and writes them.",
    ),
    (
        "dkmeans.engine.client",
        "The cluster",
        "The client dkmeans runs on and the cluster it starts when there is none.",
    ),
    (
        "dkmeans.errors",
        "Errors",
        "Every error dkmeans raises is a :class:`~dkmeans.errors.DKMeansError`.",
    ),
    ("dkmeans.io", "Model files", "The error raised for a model file that cannot be read."),
    (
        "dkmeans.io.checkpoint",
        "Checkpoint files",
        "The error raised for a checkpoint of another job (see :doc:`/guide/long-jobs`).",
    ),
    (
        "dkmeans.config",
        "Configuration",
        "The table of ``dkmeans.*`` Dask configuration keys (see :doc:`/guide/configuration`).",
    ),
)

#: Modules whose public names are only some of what they define: the names users call.
_CHOSEN = {
    "dkmeans.engine.files": ("read_table", "write_parquet"),
    "dkmeans.engine.client": ("close_embedded_cluster", "EmbeddedClusterWarning"),
    "dkmeans.io": ("ModelFileError",),
    "dkmeans.io.checkpoint": ("CheckpointError",),
    "dkmeans.config": ("get", "name", "Key"),
}


def _is_public_object(value) -> bool:
    return inspect.isclass(value) or inspect.isfunction(value)


def public_names(module_name: str) -> list[str]:
    """The documented names of ``module_name``, in a stable order."""
    module = importlib.import_module(module_name)
    if module_name in _CHOSEN:
        return [name for name in _CHOSEN[module_name] if hasattr(module, name)]
    exported = getattr(module, "__all__", None)
    if exported is not None:
        return sorted(
            (n for n in exported if _is_public_object(getattr(module, n, None))),
            key=lambda n: (not inspect.isclass(getattr(module, n)), n.lower()),
        )
    names = []
    for name, value in vars(module).items():
        if name.startswith("_") or not _is_public_object(value):
            continue
        if module_name == "dkmeans.errors" and not inspect.isclass(value):
            continue  # the module's message helpers are not API
        home = getattr(value, "__module__", "") or ""
        defined_here = home == module_name
        # a result class a module hands out (metrics' ClusterScores) belongs with it
        reexported_result = (
            inspect.isclass(value)
            and home.startswith("dkmeans.")
            and not issubclass(value, BaseException)
            and module_name != "dkmeans"
        )
        if defined_here or reexported_result:
            names.append(name)
    return sorted(names, key=lambda n: (not inspect.isclass(getattr(module, n)), n.lower()))


def api_index() -> str:
    lines = [
        ".. _api:",
        "",
        "API reference",
        "=============",
        "",
        "Generated from the package at build time: every public name of each module below.",
        "Each page links to the section of the :doc:`User Guide </guide/index>` that explains it;",
        "the command line is on :doc:`cli`.",
        "",
        ".. toctree::",
        "   :hidden:",
        "",
        "   cli",
        "",
    ]
    for module_name, heading, sentence in API_SECTIONS:
        names = public_names(module_name)
        if not names:
            continue
        lines += [
            f".. _api-{module_name.replace('.', '-')}:",
            "",
            heading,
            "-" * len(heading),
            "",
            sentence,
            "",
            f".. currentmodule:: {module_name}",
            "",
            ".. autosummary::",
            "   :toctree: generated/",
            "   :nosignatures:",
            "",
        ]
        lines += [f"   {name}" for name in names]
        lines.append("")
    return "\n".join(lines)


def _subcommands(parser: argparse.ArgumentParser):
    for action in parser._actions:  # argparse has no public accessor for its subparsers
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def cli_page() -> str:
    from dkmeans.cli import build_parser

    parser = build_parser()
    os.environ.setdefault("COLUMNS", "100")
    lines = ["```text", parser.format_help().rstrip(), "```", ""]
    for name, sub in _subcommands(parser).items():
        lines += [
            f"(cli-{name})=",
            "",
            f"## `dkmeans {name}`",
            "",
            "```text",
            sub.format_help().rstrip(),
            "```",
            "",
        ]
    return "\n".join(lines)


def config_page() -> str:
    from dkmeans.config import KEYS

    lines = []
    for key in KEYS.values():
        env = "DASK_DKMEANS__" + key.name.upper().replace(".", "__").replace("-", "_")
        lines += [
            f"`dkmeans.{key.name}`",
            f": {key.meaning[0].upper()}{key.meaning[1:]}. Default `{key.default!r}`; "
            f"environment variable `{env}`.",
            "",
        ]
    return "\n".join(lines)


#: The guide's reading order. Pages of docs/guide/ not named here come after these, before the
#: last two, in alphabetical order; names here whose page does not exist (yet) are skipped.
GUIDE_ORDER = (
    "getting-started",
    "notebooks",
    "data-and-files",
    "data-types",
    "object-stores",
    "larger-than-memory",
    "long-jobs",
    "batch-jobs",
    "minibatch",
    "quality",
    "evaluating",
    "choosing-k",
    "sweep",
    "bisecting",
    "hartigan",
    "cosine-sparse-large-k",
    "functional-api",
    "command-line",
    "deployment",
    "configuration",
)
GUIDE_LAST = ("how-a-fit-runs", "not-yet")


def guide_toctree(guide: Path) -> str:
    """The guide's table of contents: every ``docs/guide/*.md`` but its index, in reading order."""
    pages = {path.stem for path in guide.glob("*.md")} - {"index"}
    known = GUIDE_ORDER + GUIDE_LAST
    order = (
        [name for name in GUIDE_ORDER if name in pages]
        + sorted(pages - set(known))
        + [name for name in GUIDE_LAST if name in pages]
    )
    return "\n".join(["```{toctree}", ":maxdepth: 2", "", *order, "```", ""])


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def _drop_stale_pages(generated: Path) -> None:
    """Remove autosummary pages of names no longer public (they would be orphans)."""
    current = {f"{module}.{name}" for module, _, _ in API_SECTIONS for name in public_names(module)}
    for page in generated.glob("*.rst"):
        if page.stem not in current:
            page.unlink()


def generate(srcdir: Path) -> None:
    """Write the generated pages under ``srcdir``."""
    _write(srcdir / "api" / "index.rst", api_index())
    _drop_stale_pages(srcdir / "api" / "generated")
    _write(srcdir / "_generated" / "cli.md", cli_page())
    _write(srcdir / "_generated" / "config.md", config_page())
    _write(srcdir / "_generated" / "guide-toctree.md", guide_toctree(srcdir / "guide"))
