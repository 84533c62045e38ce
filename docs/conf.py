"""Sphinx configuration of the dkmeans documentation (``make docs``)."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

import dkmeans_docs  # noqa: E402
import inventories  # noqa: E402

import dkmeans  # noqa: E402

project = "dkmeans"
author = "the dkmeans developers"
copyright = "the dkmeans developers, BSD-3-Clause"
release = dkmeans.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "numpydoc",
    "myst_parser",
    "sphinx_gallery.gen_gallery",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
templates_path = ["_templates"]
exclude_patterns = [
    "_build",
    "_generated",
    "_inventories",
    "_templates",
    "**.ipynb_checkpoints",
    "auto_examples/*.ipynb",
    "auto_examples/*.py",
    "auto_examples/*.zip",
]
default_role = "py:obj"
nitpicky = True

# The pages made from the code: the API index, the CLI's --help, the configuration table.
dkmeans_docs.generate(HERE)

# -- MyST (the guide's Markdown pages) ---------------------------------------------------------
myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
myst_heading_anchors = 3

# -- API reference -----------------------------------------------------------------------------
autosummary_generate = True
autosummary_imported_members = True
autodoc_typehints = "none"  # numpydoc's Parameters say the types
autodoc_default_options = {"members": False}
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_attributes_as_param_list = False
numpydoc_xref_param_type = False
# Checked on every public docstring: every parameter described, none described that is not there,
# sections in numpydoc's order, a summary line.
numpydoc_validation_checks = {"PR01", "PR02", "PR10", "GL06", "GL07", "SS01", "SS03"}
numpydoc_validation_exclude = {r"\.__init__$", r"\._[a-z]"}
# Result containers (dataclasses such as TrainResult) list their fields under Attributes; their
# constructor's parameters are the same fields, made by dkmeans, not by users.
numpydoc_validation_overrides = {"PR01": [r"\n\s*Attributes\n\s*-{10}"]}

# -- intersphinx: committed inventories, so the build needs no network ---------------------------
_cache = Path(os.environ.get("DKMEANS_DOCS_BUILDDIR", HERE / "_build")) / "inventories"
intersphinx_mapping, nitpick_ignore_regex, _missing = inventories.mapping(
    _cache, offline=os.environ.get("DKMEANS_DOCS_OFFLINE") == "1"
)
if _missing:
    print(
        f"dkmeans docs: no inventory for {', '.join(_missing)} (no network?): "
        "their names stay plain text",
        file=sys.stderr,
    )
# dask's own type names in signatures and docstrings that its inventory does not hold
nitpick_ignore_regex += [(r"py:.*", r"(array-like|array_like|optional|default|of|shape)")]
# matplotlib is optional and has no committed inventory: its names stay plain text
nitpick_ignore_regex += [(r"py:.*", r"~?matplotlib\..*")]

# -- Gallery: examples/ run at every build, on small data ---------------------------------------
sphinx_gallery_conf = {
    "examples_dirs": ["../examples"],
    "gallery_dirs": ["auto_examples"],
    "filename_pattern": r".*\.py$",
    "within_subsection_order": "FileNameSortKey",
    "download_all_examples": False,
    "remove_config_comments": True,
    "show_memory": False,
    "plot_gallery": os.environ.get("DKMEANS_DOCS_GALLERY", "True"),
    "matplotlib_animations": False,
    "reset_modules": ("matplotlib",),
    "doc_module": ("dkmeans",),
    "backreferences_dir": None,
}
warnings.filterwarnings("ignore", message="Matplotlib is currently using agg")

# -- HTML ---------------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"dkmeans {release}"
html_static_path = []
html_show_sourcelink = False
html_theme_options = {
    "navbar_align": "left",
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "header_links_before_dropdown": 6,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_context = {"default_mode": "light"}
