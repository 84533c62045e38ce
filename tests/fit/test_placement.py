"""The fit service's one placement entry (dkmeans.fit.placement.placed): where the rows of a fit,
a sweep or a score run, under one kernel plan, released when the block ends."""

from __future__ import annotations

import numpy as np

from dkmeans.engine.local import ChunkList
from dkmeans.engine.streamed import StreamedData
from dkmeans.fit.inputs import as_dataset
from dkmeans.fit.placement import fit_placement, fit_plan, placed
from dkmeans.fit.spec import FitSpec
from dkmeans.kernels import plans


def _rows(n=600, d=3):
    return np.random.default_rng(0).normal(size=(n, d)).astype(np.float32)


def test_in_memory_rows_stay_here_under_the_fits_plan():
    dataset = as_dataset(_rows())
    before = plans.current()
    with placed(dataset, None, n_clusters=4, n_init=3) as (data, client):
        assert client is None and isinstance(data, ChunkList)
        assert (data.n_rows, data.n_features) == (600, 3)
        # the plan's size rule counts every run's centroids
        assert plans.current() == fit_plan(dataset, 4 * 3, in_process=True)
    assert plans.current() == before


def test_a_fits_spec_gives_the_placement_its_words():
    spec = FitSpec(n_clusters=5, n_init=2, out_of_core=True, algorithm="minibatch", on_pass=print)
    assert fit_placement(spec) == dict(
        out_of_core=True, n_clusters=5, n_init=2, allow_hybrid=False, on_pass=print
    )
    assert fit_placement(FitSpec(n_clusters=5), n_clusters=12)["n_clusters"] == 12


def test_rows_sent_to_the_cluster_are_released_when_the_block_ends(client):
    X = _rows()
    dataset = as_dataset(X)
    events = []
    with placed(
        dataset, None, out_of_core=True, n_clusters=2, on_pass=events.append, fit=False
    ) as (data, got):
        assert got is client and isinstance(data, StreamedData)
        assert plans.current() == data.plan
        total = data.map_reduce(lambda X, w, o: float(X.astype(np.float64).sum()), sum)
    assert np.isclose(total, float(X.astype(np.float64).sum()), rtol=1e-6)
    assert events and events[-1]["done"] == events[-1]["total"]  # the pass was watched to its end
    assert data.X is None  # released: nothing of it is held any more
    data.release()  # a second release (a fit releases its data before the block ends) is a no-op
