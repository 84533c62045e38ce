"""The documentation as a reader meets it: the site builds without a warning, every API and guide
page exists and is reachable, every internal link resolves, and the README's code runs.

The site is read from ``$DKMEANS_DOCS_BUILD`` (a directory holding ``html/`` and ``warnings.log``,
as ``make docs`` leaves ``docs/_build``: CI builds once and this test reads it); otherwise it is
built here into a temporary directory with the same flags as ``make docs``, without running the
gallery's examples (``tests/system/test_examples.py`` runs them) and without the network.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("sphinx", reason="the docs extra is not installed: pip install -e '.[docs]'")

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import check_links  # noqa: E402
import dkmeans_docs  # noqa: E402

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The built site's directory (``html/`` and ``warnings.log``)."""
    given = os.environ.get("DKMEANS_DOCS_BUILD")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("docs")
    # a copy of what the site is made of, so that the pages generated into the source folder
    # (the API index, the gallery's pages without their outputs) do not replace make docs' ones
    src = out / "src"
    ignore = shutil.ignore_patterns("_build", "auto_examples", "generated", "__pycache__")
    shutil.copytree(DOCS, src / "docs", ignore=ignore)
    shutil.copytree(ROOT / "examples", src / "examples", ignore=ignore)
    shutil.copy(ROOT / "CONTRIBUTING.md", src / "CONTRIBUTING.md")
    (src / "deploy").mkdir()
    shutil.copy(ROOT / "deploy" / "README.md", src / "deploy" / "README.md")
    env = dict(
        os.environ,
        DKMEANS_DOCS_GALLERY="0",
        DKMEANS_DOCS_OFFLINE="1",
        DKMEANS_DOCS_BUILDDIR=str(out),
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-b",
            "html",
            "-E",
            "-W",
            "--keep-going",
            "-n",
            "-q",
            "-w",
            str(out / "warnings.log"),
            str(src / "docs"),
            str(out / "html"),
        ],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def test_builds_without_warnings(site):
    log = (site / "warnings.log").read_text()
    for problem in (
        "undefined label",
        "unknown document",
        "reference target not found",
        "toctree contains reference",
        "isn't included in any toctree",
        "WARNING",
        "ERROR",
    ):
        assert problem not in log, log[:4000]


def test_every_public_name_has_its_api_page(site):
    html = site / "html"
    api_index = (html / "api" / "index.html").read_text()
    import dkmeans

    names = [f"dkmeans.{n}" for n in dkmeans.__all__ if n != "__version__"]
    for module in ("dkmeans.metrics", "dkmeans.plot"):
        names += [f"{module}.{n}" for n in dkmeans_docs.public_names(module)]
    assert "dkmeans.KMeans" in names and "dkmeans.metrics.silhouette_score" in names
    assert "dkmeans.plot.plot_history" in names and len(names) >= 20
    for name in names:
        page = html / "api" / "generated" / f"{name}.html"
        assert page.exists(), f"no API page for {name}"
        assert f"generated/{name}.html" in api_index, f"{name} is not in the API index"
        obj = importlib.import_module(name.rsplit(".", 1)[0])
        assert getattr(obj, name.rsplit(".", 1)[1]) is not None
    # the numpydoc sections render: KMeans' parameters, its inherited methods, its guide link
    kmeans = (html / "api" / "generated" / "dkmeans.KMeans.html").read_text()
    for text in (
        "n_clusters",
        "cluster_centers_",
        'id="dkmeans.KMeans.fit"',
        'id="dkmeans.KMeans.predict"',
        "User Guide",
    ):
        assert text in kmeans, text
    assert re.search(r'href="\.\./\.\./guide/[a-z-]+\.html#', kmeans), "no link into the guide"


def test_cli_and_configuration_pages_are_generated_from_the_code(site):
    from dkmeans.cli import build_parser
    from dkmeans.config import KEYS

    cli = (site / "html" / "api" / "cli.html").read_text()
    commands = dkmeans_docs._subcommands(build_parser())
    assert {"fit", "predict", "evaluate", "sweep", "demo"} <= set(commands)
    for name in commands:
        assert f'id="cli-{name}"' in cli, f"no section for dkmeans {name}"
    assert "--checkpoint" in cli and "--label-column" in cli
    config = (site / "html" / "guide" / "configuration.html").read_text()
    for key in KEYS:
        assert f"dkmeans.{key}" in config, key


def test_every_guide_page_is_built_and_in_the_guide(site):
    html = site / "html" / "guide"
    index = (html / "index.html").read_text()
    pages = sorted(p.stem for p in (DOCS / "guide").glob("*.md") if p.stem != "index")
    assert len(pages) >= 15
    for stem in pages:
        page = html / f"{stem}.html"
        assert page.exists(), f"guide page {stem} was not built"
        assert re.search(r"<h1>.+?</h1>", page.read_text(), re.S), f"{stem} has no title"
        assert f'href="{stem}.html"' in index, f"{stem} is not in the guide's table of contents"
    for page in ("performance", "design", "contributing", "auto_examples/index", "api/index"):
        assert (site / "html" / f"{page}.html").exists(), page


def test_intersphinx_links_resolve_without_network(site):
    """The committed inventories turn references to the peers' names into links to their docs."""
    page = (site / "html" / "guide" / "getting-started.html").read_text()
    assert "https://scikit-learn.org/stable/modules/generated/sklearn.cluster.KMeans.html" in page
    assert "https://distributed.dask.org/en/stable/api.html#distributed.Client" in page
    data = (site / "html" / "guide" / "data-and-files.html").read_text()
    assert "https://pandas.pydata.org/docs/reference/api/pandas.DataFrame.html" in data
    assert "https://docs.dask.org/en/stable/generated/dask.dataframe.read_parquet.html" in data


def test_internal_links_resolve(site):
    assert check_links.broken_links(site / "html") == []


def test_readme_links_point_at_files():
    """The README is read on the forge too: its relative links name files of the repository."""
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    relative = [link for link in links if "://" not in link]
    assert len(relative) >= 15
    for link in relative:
        assert (ROOT / link).exists(), link


def test_link_check_finds_broken_links(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "index.html").write_text(
        '<h1 id="top">x</h1><a href="a/b.html#here">ok</a><a href="a/missing.html">1</a>'
        '<a href="a/b.html#nowhere">2</a><a href="https://example.org/x">external</a>'
    )
    (tmp_path / "a" / "b.html").write_text('<p id="here"></p><a href="../index.html#top">ok</a>')
    problems = check_links.broken_links(tmp_path)
    assert len(problems) == 2
    assert "a/missing.html (no such file)" in problems[0] + problems[1]
    assert "no anchor #nowhere" in problems[0] + problems[1]


def test_guide_toctree_takes_every_page(tmp_path):
    for stem in ("index", "getting-started", "not-yet", "zebra", "choosing-k", "how-a-fit-runs"):
        (tmp_path / f"{stem}.md").write_text(f"# {stem}\n")
    toc = dkmeans_docs.guide_toctree(tmp_path).splitlines()
    assert toc[:3] == ["```{toctree}", ":maxdepth: 2", ""] and toc[-1] == "```"
    assert toc[3:-1] == ["getting-started", "choosing-k", "zebra", "how-a-fit-runs", "not-yet"]


def _python_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", markdown, flags=re.S | re.M)


def _marked_blocks(markdown: str) -> list[str]:
    """The python blocks of a guide page that follow a ``% runs`` line (a MyST comment)."""
    return re.findall(r"^% runs\n```python\n(.*?)^```", markdown, flags=re.S | re.M)


GUIDE_PAGES_WITH_EXAMPLES = sorted(
    p.name for p in (DOCS / "guide").glob("*.md") if _marked_blocks(p.read_text())
)


def test_guide_has_runnable_examples():
    assert {
        "getting-started.md",
        "functional-api.md",
        "evaluating.md",
        "minibatch.md",
        "sweep.md",
        "cosine-sparse-large-k.md",
    } <= set(GUIDE_PAGES_WITH_EXAMPLES)


def _run_blocks(blocks: list[str], folder: Path) -> None:
    """The code blocks, in order, in one fresh process in ``folder``, as pasted into a notebook or
    a REPL. The script runs them under the main guard, which a script starting a LocalCluster
    needs (the workers' processes import the main module again)."""
    body = "\n\n".join(textwrap.dedent(block) for block in blocks) + "\nprint('BLOCKS-OK')\n"
    script = "if __name__ == '__main__':\n" + textwrap.indent(body, "    ")
    (folder / "blocks.py").write_text(script)
    proc = subprocess.run(
        [sys.executable, "blocks.py"], cwd=folder, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "BLOCKS-OK" in proc.stdout


@pytest.mark.parametrize("page", GUIDE_PAGES_WITH_EXAMPLES)
def test_guide_examples_run(page, tmp_path):
    """Each guide page's marked examples run, in order, as a reader runs them."""
    _run_blocks(_marked_blocks((DOCS / "guide" / page).read_text()), tmp_path)


def test_readme_python_blocks_run(tmp_path):
    """Every python block of the README, in order, on small data: the Parquet folder the README
    reads is written first, as a user would have it."""
    blocks = _python_blocks((ROOT / "README.md").read_text())
    assert len(blocks) >= 2
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        {
            "customer": np.arange(20_000),
            "spend": rng.gamma(2.0, 50.0, 20_000),
            "visits": rng.poisson(6, 20_000).astype(float),
        }
    )
    (tmp_path / "customers").mkdir()
    for i, start in enumerate(range(0, len(frame), 5_000)):
        frame.iloc[start : start + 5_000].to_parquet(
            tmp_path / "customers" / f"part.{i}.parquet", index=False
        )
    _run_blocks(blocks, tmp_path)
    labelled = pd.read_parquet(tmp_path / "labelled")
    assert len(labelled) == len(frame) and set(labelled["cluster"].unique()) <= set(range(5))
    assert (tmp_path / "segments.npz").exists()
