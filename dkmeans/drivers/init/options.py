"""Options shared by the initialisation strategies."""

from __future__ import annotations

from dataclasses import dataclass

from dkmeans.config import KEYS

#: ``n_clusters`` from which ``"k-means||"`` seeds with the two-level path
#: (:mod:`dkmeans.drivers.init.two_level`): its client recluster and its ``2 k`` candidates per
#: round grow too costly at large k. The fit service reads the Dask config
#: ``dkmeans.init.two-level-clusters`` (declared in :mod:`dkmeans.config`) into :class:`InitOptions`.
DEFAULT_TWO_LEVEL_CLUSTERS = KEYS["init.two-level-clusters"].default


@dataclass(frozen=True)
class InitOptions:
    """Tuning of the seeding strategies.

    Attributes
    ----------
    oversampling_factor : float
        k-means||: ``l``; each round draws each row with probability
        ``min(1, l * k * d2(x) / phi)`` (about ``l * k`` rows per round).
    init_rounds : int
        k-means||: number of sampling rounds (fixed, independent of the data's scale).
    recluster_trials : int
        k-means||: weighted k-means++ + Lloyd runs on the candidates (different seeds);
        the one with the lowest objective on the full data is kept (one pass for all).
        Two keep the scoring pass cheap; on the SIPU sets they already beat scikit-learn's
        k-means++ on every set (benchmarks/init_quality.py). The fit service asks for one
        when the fit settles and searches the seeding on a sample of the rows anyway (the
        default local search, :func:`dkmeans.fit.runs.settles_start`): the search does what
        the second trial's choice did, and the trial cost manyk's default fit 4 of its 13
        seconds (benchmarks/README.md, "time to solution").
    metric : {"euclidean", "cosine"}
        The fit's metric (set by the fit service). With "cosine" the rows are unit and
        k-means||'s recluster and random-partition's means are spherical (normalised
        means, :mod:`dkmeans.kernels.cosine`); the D^2 draws need no change.
    two_level_min_clusters : int
        k-means||: from this ``n_clusters`` on, seed with the two-level path instead
        (one pass for a sample of ``sample_per_centroid * k`` rows, then coarse and fine
        clustering of the sample on the client; :mod:`dkmeans.drivers.init.two_level`).
    sample_per_centroid : int
        Two-level path: sample rows drawn per centroid.
    """

    oversampling_factor: float = 2.0
    init_rounds: int = 5
    recluster_trials: int = 2
    metric: str = "euclidean"
    two_level_min_clusters: int = DEFAULT_TWO_LEVEL_CLUSTERS
    sample_per_centroid: int = 8
