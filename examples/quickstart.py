"""Quickstart: the scikit-learn estimator and the oneDAL-style functional API
==========================================================================

Run: .venv/bin/python examples/quickstart.py
(starts a local Dask cluster, one worker process per core, on 127.0.0.1).
"""

import dask.array as da
import numpy as np

import dkmeans
from dkmeans.testing import make_blobs


def main(n_samples: int = 200_000) -> None:
    X, _, _ = make_blobs(n_samples, 4, 6, spread=1.5, seed=0, dtype=np.float32)

    # 1. scikit-learn style: NumPy in, NumPy out.
    km = dkmeans.KMeans(n_clusters=6, random_state=0).fit(X)
    print(
        f"KMeans: {km.n_iter_} iterations, inertia {km.inertia_:.4e}, stopped by {km.stop_reason_}"
    )
    print("first labels:", km.predict(X[:8]))

    # 2. Dask in, Dask out: labels stay on the cluster until you compute them.
    Xd = da.from_array(X, chunks=(50_000, 4))
    labels = dkmeans.KMeans(n_clusters=6, random_state=0).fit(Xd).predict(Xd)
    print("lazy labels:", labels, "-> counts", np.bincount(labels.compute()))

    # 3. oneDAL style: a descriptor, explicit initial centroids, objective-decrease stop rule.
    desc = dkmeans.Descriptor(cluster_count=6, max_iteration_count=50, accuracy_threshold=1e-3)
    result = dkmeans.train(desc, X, X[:6])
    print(
        f"train: {result.iteration_count} iterations, objective {result.objective_function_value:.4e}"
    )
    inferred = dkmeans.infer(desc, result.model, X)
    assert inferred.objective_function_value == result.objective_function_value


if __name__ == "__main__":
    main()
