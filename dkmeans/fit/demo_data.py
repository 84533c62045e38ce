"""The demo's data: Gaussian blobs generated on the workers and persisted there."""

from __future__ import annotations

from dkmeans.engine.synthetic import make_blobs_dask, persisted_on


def demo_blobs(
    client, n_samples: int, n_features: int, k: int, *, spread: float, seed: int, chunk_rows: int
):
    """``(X, centres)``: ``n_samples`` float32 rows around ``k`` centres, persisted on ``client``'s
    workers (a Dask array of ``chunk_rows``-row chunks), and the generating centres.

    Returns once every chunk is in the workers' memory: the demo's fit then times the fit of
    data already on the cluster, as a user's fit of persisted data, not its generation.
    """
    X, centres = make_blobs_dask(
        n_samples, n_features, k, spread=spread, seed=seed, chunk_rows=chunk_rows
    )
    return persisted_on(client, X), centres


__all__ = ["demo_blobs"]
