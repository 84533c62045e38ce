"""The data protocol's base and capabilities (dkmeans.engine.protocol): every implementation
subclasses one base, and pruned Lloyd tests for the capability of keeping state by type."""

from __future__ import annotations

import numpy as np
import pytest

from dkmeans.drivers.pruned_lloyd import PrunedPasses
from dkmeans.engine import kept
from dkmeans.engine.hybrid import HybridData
from dkmeans.engine.local import ChunkList, LocalChunks
from dkmeans.engine.persisted import PersistedData
from dkmeans.engine.protocol import ChunkedData, InCallerLoop, PrunableData
from dkmeans.engine.shared_passes import SharedView
from dkmeans.engine.spmd import RankChunks
from dkmeans.engine.streamed import StreamedData
from dkmeans.kernels import assign_partials

IMPLEMENTATIONS = (
    ChunkList,
    LocalChunks,
    RankChunks,
    PersistedData,
    StreamedData,
    HybridData,
    SharedView,
)


class _Unkept(InCallerLoop):
    """A :class:`ChunkList`'s rows through the protocol, without the capability of keeping state."""

    kind = "local"
    in_memory = True

    def __init__(self, chunks: ChunkList):
        self.chunks = chunks
        self.n_rows, self.n_features, self.dtype = chunks.n_rows, chunks.n_features, chunks.dtype
        self.loop_modes = []

    @property
    def has_weights(self) -> bool:
        return self.chunks.has_weights

    @property
    def passes(self) -> int:
        return self.chunks.passes

    def labelled_pass(self, *args, **kwargs):
        return self.chunks.labelled_pass(*args, **kwargs)

    def map_reduce(self, *args, **kwargs):
        return self.chunks.map_reduce(*args, **kwargs)

    def map_reduce_stateful(self, *args, **kwargs):
        return self.chunks.map_reduce_stateful(*args, **kwargs)

    def fold(self, *args, **kwargs):
        return self.chunks.fold(*args, **kwargs)

    def row_state_bytes(self) -> float:
        return self.chunks.row_state_bytes()

    def state_column(self, state, name):
        return self.chunks.state_column(state, name)

    def rows(self, indices):
        return self.chunks.rows(indices)

    def release(self) -> None:
        self.chunks.release()


def test_every_implementation_has_one_base_and_all_its_members():
    for cls in IMPLEMENTATIONS:
        assert issubclass(cls, ChunkedData), cls
        assert not cls.__abstractmethods__, (cls, cls.__abstractmethods__)
    prunable = {cls for cls in IMPLEMENTATIONS if issubclass(cls, PrunableData)}
    # rows read from their source keep no state between loops, nor does one job's shared view
    assert prunable == {ChunkList, LocalChunks, RankChunks, PersistedData}


def test_an_implementation_missing_a_member_cannot_be_made():
    class NoPasses(InCallerLoop):
        has_weights = False

    with pytest.raises(TypeError, match="abstract"):
        NoPasses()
    assert {"map_reduce", "labelled_pass", "release", "rows"} <= NoPasses.__abstractmethods__


def test_a_second_release_finds_nothing_to_let_go():
    chunks = ChunkList.from_array(np.ones((40, 2), np.float32), n_chunks=2, threads=2)
    assert chunks._pool is not None
    chunks.release()
    chunks.release()
    assert chunks._pool is None


@pytest.mark.parametrize("capable", [True, False])
def test_pruned_passes_keep_their_bounds_only_where_the_data_can(capable):
    kept.drop()
    rng = np.random.default_rng(0)
    X = rng.normal(size=(3000, 4)).astype(np.float64)
    chunks = ChunkList.from_array(X, n_chunks=3)
    data = chunks if capable else _Unkept(chunks)
    assert isinstance(data, PrunableData) == capable
    C = X[:8].copy()
    passes = PrunedPasses(data, True, 8, run=True)
    assert passes.on
    passes.begin(data, 10)
    partials, share = passes.partials(data, C)
    assert share == 1.0  # the first pass builds the bounds: every distance
    expected = assign_partials(X, C, None)
    np.testing.assert_allclose(partials.sums, expected.sums, rtol=1e-12)
    passes.end(data)  # the block ends: its bounds kept where the chunks are, if the data can
    assert (kept.keys() != []) == capable
    passes.begin(data, 10)  # the run's next block picks them up, or builds them again
    assert (passes.state is not None) == capable
    C2 = C + 1e-3
    partials, share = passes.partials(data, C2)
    np.testing.assert_allclose(partials.sums, assign_partials(X, C2, None).sums, rtol=1e-12)
    assert (share < 1.0) == capable  # kept bounds skip distances; rebuilt ones compute them all
    passes.release(data)
    assert kept.keys() == []
    kept.drop()
