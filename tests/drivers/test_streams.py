"""The one table of random streams: every use of a seed has its own numbers, declared once."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

from dkmeans.drivers.streams import STREAMS, stream
from dkmeans.errors import InvalidParameterError

PACKAGE = Path(__file__).resolve().parents[2] / "dkmeans"


def test_no_two_streams_of_a_kind_share_a_number():
    for a, b in itertools.combinations(STREAMS.values(), 2):
        if a.kind == b.kind:
            assert a.first + a.count <= b.first or b.first + b.count <= a.first, (a.name, b.name)


def test_local_search_no_longer_reuses_the_kmeans_plusplus_step_streams():
    # the collision of the issue: local search's round streams were k-means++'s step streams
    steps, rounds = STREAMS["k-means++.steps"], STREAMS["local-search.rounds"]
    assert not set(range(rounds.first, rounds.first + 64)) & set(
        range(steps.first, steps.first + steps.count)
    )


def test_a_stream_number_beyond_its_range_is_refused():
    assert stream("k-means||.rounds", 3) == STREAMS["k-means||.rounds"].first + 3
    with pytest.raises(InvalidParameterError, match="first-centre.fallback"):
        stream("first-centre.fallback", 8)


def _literal_streams(path: Path):
    """Assignments of a number (or arithmetic on numbers) to a name that says STREAM."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and "STREAM" in t.id for t in node.targets
        ):
            if all(
                isinstance(n, (ast.Constant, ast.BinOp, ast.operator, ast.UnaryOp, ast.unaryop))
                for n in ast.walk(node.value)
            ):
                yield f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"


def test_stream_numbers_are_declared_only_in_the_table():
    places = [
        p
        for layer in ("drivers", "fit")
        for path in sorted((PACKAGE / layer).rglob("*.py"))
        if path.name != "streams.py"
        for p in _literal_streams(path)
    ]
    assert not places, places
