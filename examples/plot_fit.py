"""Plotting a fit: the objective per iteration and the clusters
==============================================================

Run: .venv/bin/python examples/plot_fit.py [FIGURE.png]
Fits the default k-means on 50,000 rows of 6 overlapping blobs in 5 dimensions (small data:
fitted in this process, no cluster started) and draws what ``dkmeans.plot`` offers: the
objective at every step of the fit (Lloyd's iterations and the local search's rounds), and the
rows coloured by cluster on their first two principal axes, with the centroids. It also prints
the fit's cluster scores (``dkmeans.metrics``).
"""

import sys

import matplotlib

matplotlib.use("Agg")  # a script writes a file; the docs' gallery captures the figure itself

import matplotlib.pyplot as plt  # noqa: E402

import dkmeans  # noqa: E402
from dkmeans import metrics, plot  # noqa: E402
from dkmeans.testing import make_blobs  # noqa: E402


def main(figure: str | None = None) -> None:
    X, truth, _ = make_blobs(50_000, 5, 6, spread=2.5, seed=3)
    km = dkmeans.KMeans(n_clusters=6, random_state=0).fit(X)
    print(
        f"{km.n_iter_} Lloyd iterations, objective {km.inertia_:.5e}, {km.n_passes_} passes, "
        f"stopped by {km.stop_reason_}"
    )
    scores = metrics.cluster_scores(X, km)
    print(
        f"Calinski-Harabasz {scores.calinski_harabasz:.1f}, Davies-Bouldin "
        f"{scores.davies_bouldin:.3f}, cluster sizes {scores.sizes.astype(int).tolist()}"
    )
    print(
        f"adjusted Rand index against the generating blobs: "
        f"{metrics.adjusted_rand_index(truth, km.labels_):.3f}"
    )

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    plot.plot_history(km.history_, ax=left)
    plot.plot_clusters(X, km.labels_, km.cluster_centers_, ax=right)
    fig.tight_layout()
    if figure:
        fig.savefig(figure, dpi=100)
        print(f"figure written to {figure}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
