"""The registry of per-chunk state kept between loops (dkmeans.engine.kept) and ChunkList's use of it."""

from __future__ import annotations

import numpy as np

from dkmeans.engine import kept
from dkmeans.engine.local import ChunkList


def test_keep_take_by_chunk_and_tag():
    kept.drop()
    kept.keep("a", 1, [0, 10], [10, 5], ["s0", None])
    assert kept.keys() == ["a"]
    assert kept.take("a", 2, [0, 10], [10, 5]) == [
        None,
        None,
    ]  # another tag: not given back, and gone
    kept.keep("a", 1, [0, 10], [10, 5], ["s0", "s1"])
    assert kept.take("a", 1, [0, 10], [10, 6]) == [
        "s0",
        None,
    ]  # chunk rows differ: not the same chunk
    assert kept.take("a", 1, [0, 10], [10, 5]) == [
        None,
        "s1",
    ]  # "s0" was taken out: one copy at a time
    assert kept.keys() == []
    kept.drop()


def test_the_oldest_keys_are_dropped():
    kept.drop()
    for i in range(kept.MAX_KEYS + 2):
        kept.keep(f"k{i}", 0, [0], [1], [i])
    assert kept.keys() == [f"k{i}" for i in range(2, kept.MAX_KEYS + 2)]
    kept.drop("k3")
    assert "k3" not in kept.keys()
    kept.drop()
    assert kept.keys() == []


def test_chunk_list_keeps_opaque_state():
    kept.drop()
    X = np.arange(40, dtype=np.float32).reshape(20, 2)
    chunks = ChunkList.from_array(X, n_chunks=3)
    assert chunks.kept_state("run", 0) is None
    chunks.keep_state("run", 0, ["a", None, "c"])
    assert chunks.kept_state("run", 1) is None
    chunks.keep_state("run", 0, ["a", None, "c"])
    assert chunks.kept_state("run", 0) == ["a", None, "c"]
    chunks.keep_state("run", 0, ["a", "b", "c"])
    chunks.drop_state("run")
    assert chunks.kept_state("run", 0) is None and kept.keys() == []
