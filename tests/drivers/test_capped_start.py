"""The capped fit's start on a sample: the sample's caps, the data's certified assignment from it,
and the same fit whatever the chunking, the workers or the placement."""

import dask
import numpy as np
import pytest
from scipy.optimize import linprog
from scipy.sparse import csr_matrix, identity, kron, vstack

import dkmeans.fit.runs as runs
from dkmeans import KMeans
from dkmeans.drivers.capacitated import Capacity
from dkmeans.drivers.capped_start import (
    capped_start_size,
    capped_start_sizes,
    sample_capacity,
    sample_rule,
)
from dkmeans.drivers.lloyd import CentroidShift, ObjectiveDecrease


def zipf_blobs(n, k=4, d=2, seed=0):
    """Blobs of unequal shares: the largest holds about two caps' rows."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=4.0, size=(k, d))
    shares = 1.0 / np.arange(1, k + 1) ** 1.2
    labels = rng.choice(k, size=n, p=shares / shares.sum())
    return centres[labels] + rng.normal(size=(n, d))


def transport_optimum(X, C, lower, upper) -> float:
    """The optimal capped assignment's cost of ``X`` to ``C`` by a linear program (HiGHS): the
    transportation problem's vertices are integral, so its optimum is the assignment's."""
    n, k = X.shape[0], C.shape[0]
    cost = ((X[:, None, :] - C[None, :, :]) ** 2).sum(axis=2).ravel()
    one_each = kron(identity(n, format="csr"), np.ones((1, k)), format="csr")
    per_cluster = csr_matrix(kron(np.ones((1, n)), identity(k, format="csr")))
    out = linprog(
        cost,
        A_ub=vstack([per_cluster, -per_cluster]),
        b_ub=np.concatenate([np.full(k, upper), -np.full(k, lower)]),
        A_eq=one_each,
        b_eq=np.ones(n),
        bounds=(0, 1),
        method="highs",
    )
    assert out.status == 0
    return float(out.fun)


def test_sample_caps_always_hold():
    # balanced 20,000 rows in 4: 5,000 each; a 4,096-row sample holds 1,024 each
    cap = sample_capacity(Capacity(5000.0, 5000.0, 20000.0), 20000.0, 4096, 4)
    assert (cap.lower, cap.upper) == (1024.0, 1024.0)
    # a maximum of 1.1 n / k rounds up (4,096 * 5,500 / 20,000 = 1,126.4), no floor
    cap = sample_capacity(Capacity(0.0, 5500.0, 20000.0), 20000.0, 4096, 4)
    assert (cap.lower, cap.upper) == (0.0, 1127.0)
    # a floor alone rounds down, the maximum is the sample
    cap = sample_capacity(Capacity(4900.0, 20000.0, 20000.0), 20000.0, 4096, 4)
    assert (cap.lower, cap.upper) == (1003.0, 4096.0)
    # caps that a sample's rounding would break are widened: k upper caps hold s rows
    cap = sample_capacity(Capacity(0.0, 5000.0, 20000.0), 20000.0, 4099, 4)
    assert cap.upper * 4 >= 4099 and cap.lower * 4 <= 4099


def test_sample_size_rules():
    assert capped_start_size(10_000, 4) == 0  # the sample would be 41% of the rows
    assert capped_start_size(20_000, 4) == 4096
    assert capped_start_size(200_000, 32) == 8192
    assert capped_start_size(2_000_000, 1) == 0
    assert capped_start_size(100_000, 512) == 0  # fewer than 32 sample rows per cluster


def test_growing_samples_and_their_tolerances():
    """Samples 8 times larger while within a quarter of the rows; each sample's centroid-shift
    tolerance the fit's times n / s, other rules unchanged."""
    assert capped_start_sizes(2_000_000, 32) == [8192, 65536]
    assert capped_start_sizes(200_000, 32) == [8192]
    assert capped_start_sizes(300_000, 4) == [4096, 32768]
    assert capped_start_sizes(10_000, 4) == []
    rule = CentroidShift(tol=0.5)
    assert sample_rule(rule, 2_000_000, 8192).tol == pytest.approx(0.5 * 2_000_000 / 8192)
    assert sample_rule(rule, 2_000_000, 8192).inclusive is rule.inclusive
    assert sample_rule(CentroidShift(tol=0.0), 100, 10).tol == 0.0
    other = ObjectiveDecrease(threshold=1.0)
    assert sample_rule(other, 100, 10) is other


def test_each_sample_starts_from_the_last_ones_prices(monkeypatch):
    """Two samples: the second's first assignment starts from the first's last optimal prices
    (a spy on ``seed``), and the data's from the second's."""
    import dkmeans.drivers.capped_start as capped

    monkeypatch.setattr(capped, "CAPPED_START_GROWTH", 2)
    X = zipf_blobs(20_000)
    seeded = []
    real = capped.CapacitatedPasses.seed

    def spy(self, P, quantum):
        seeded.append((self.capacity.upper, np.array(P)))
        return real(self, P, quantum)

    monkeypatch.setattr(capped.CapacitatedPasses, "seed", spy)
    km = KMeans(4, random_state=0, n_init=1, balanced=True).fit(X)
    assert capped.capped_start_sizes(20_000, 4) == [4096]
    assert [upper for upper, _ in seeded] == [5000]  # one sample: only the data is seeded
    seeded.clear()
    X = zipf_blobs(40_000)
    km = KMeans(4, random_state=0, n_init=1, balanced=True).fit(X)
    assert capped.capped_start_sizes(40_000, 4) == [4096, 8192]
    assert [upper for upper, _ in seeded] == [2048, 10000]  # the second sample, then the data
    assert all(np.all(np.isfinite(P)) for _, P in seeded)
    np.testing.assert_array_equal(np.bincount(km.labels_, minlength=4), [10_000] * 4)


@pytest.mark.parametrize("caps", [dict(balanced=True), dict(max_cluster_size=0.275)])
def test_capped_start_then_the_certified_assignment(caps, monkeypatch):
    """The fit starts from the sample's capped fit (a spy sees it) and ends on an assignment as
    cheap as the linear program's optimum for its centroids, within its caps exactly."""
    X = zipf_blobs(20_000)
    starts = []
    real = runs.capped_start

    def spy(*args, **kwargs):
        starts.append(kwargs["seed"])
        return real(*args, **kwargs)

    monkeypatch.setattr(runs, "capped_start", spy)
    km = KMeans(4, random_state=0, n_init=1, **caps).fit(X)
    assert len(starts) == 1
    sizes = np.bincount(km.labels_, minlength=4)
    if "balanced" in caps:
        np.testing.assert_array_equal(sizes, [5000] * 4)
        lower, upper = 5000, 5000
    else:
        assert sizes.max() <= 5500
        lower, upper = 0, 5500
    objective = [r["objective"] for r in km.history_]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(objective, objective[1:]))
    C = km.cluster_centers_.astype(np.float64)
    d2 = ((X - C[km.labels_]) ** 2).sum()
    assert km.inertia_ == pytest.approx(d2, rel=1e-9)
    assert d2 <= transport_optimum(X, C, lower, upper) * (1 + 1e-7)


def test_capped_start_is_reproducible_and_skipped_for_user_centroids(monkeypatch):
    """The same fit twice (the sample keyed by row index); a user's centroids skip the start."""
    X = zipf_blobs(20_000, seed=3)
    a = KMeans(4, random_state=1, n_init=1, balanced=True).fit(X)
    b = KMeans(4, random_state=1, n_init=1, balanced=True).fit(X)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    called = []
    monkeypatch.setattr(runs, "capped_start", lambda *a, **k: called.append(1))
    KMeans(4, init=a.cluster_centers_, n_init=1, balanced=True).fit(X)
    assert not called


def test_capped_start_chunking_workers_and_out_of_core(client, single_worker_client, on_cluster):
    """The capped fit with its start: in this process, on two workers and one (Dask arrays of
    other chunkings) and out of core: the same labels, centroids and objective."""
    import dask.array as da

    X = zipf_blobs(20_000, seed=5)
    caps = dict(balanced=True, random_state=0, n_init=1)
    with dask.config.set({"dkmeans.in-process-bytes": 1 << 30}):
        reference = KMeans(4, **caps).fit(X)
    np.testing.assert_array_equal(np.bincount(reference.labels_), [5000] * 4)

    def same(other):
        labels = np.asarray(other.labels_)
        np.testing.assert_array_equal(labels, reference.labels_)
        np.testing.assert_allclose(other.cluster_centers_, reference.cluster_centers_, rtol=1e-5)
        assert other.inertia_ == pytest.approx(reference.inertia_, rel=1e-9)

    same(KMeans(4, **caps).fit(da.from_array(X, chunks=(3000, 2))))
    with single_worker_client.as_current():
        same(KMeans(4, **caps).fit(da.from_array(X, chunks=(7000, 2))))
    streamed = KMeans(4, out_of_core=True, **caps).fit(da.from_array(X, chunks=(2500, 2)))
    assert streamed.data_mode_ == "out-of-core"
    same(streamed)
