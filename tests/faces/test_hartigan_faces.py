"""Hartigan through the faces: KMeans(algorithm=..., refine=...) and Descriptor(method=...)."""

from __future__ import annotations

import numpy as np
import pytest

from dkmeans import Descriptor, KMeans, infer, train
from dkmeans.drivers.hartigan import standard_hartigan
from dkmeans.errors import InvalidParameterError
from dkmeans.testing import make_blobs, pick_rows


@pytest.fixture(scope="module")
def problem():
    X, _, _ = make_blobs(1500, 2, 8, spread=2.0, box=6.0, seed=31)
    return X, pick_rows(X, 8, seed=4)


def single_move_gains(X, labels, k):
    """Best objective decrease of any single move, recomputed exhaustively (float64)."""

    def obj(lab):
        return sum(
            ((X[lab == j] - X[lab == j].mean(0)) ** 2).sum() for j in range(k) if (lab == j).any()
        )

    base, best = obj(labels), 0.0
    for i in range(len(X)):
        if (labels == labels[i]).sum() == 1:
            continue
        for j in range(k):
            if j != labels[i]:
                trial = labels.copy()
                trial[i] = j
                best = max(best, base - obj(trial))
    return best


def test_refine_lowers_lloyd_objective(client, problem):
    X, C0 = problem
    lloyd = KMeans(8, init=C0, tol=0.0).fit(X)
    refined = KMeans(8, init=C0, tol=0.0, refine="hartigan").fit(X)
    assert refined.inertia_ <= lloyd.inertia_ * (1 + 1e-12)
    algorithms = [h["algorithm"] for h in refined.history_]
    assert algorithms[0] == "lloyd" and "hartigan" in algorithms
    assert refined.n_iter_ == len(refined.history_)
    np.testing.assert_array_equal(refined.labels_, refined.predict(X))
    assert refined.stop_reason_ in ("no-improving-move", "max_iter")


def test_hartigan_algorithm_reaches_a_hartigan_optimum(client):
    X, _, _ = make_blobs(120, 2, 4, spread=2.5, box=4.0, seed=2)
    km = KMeans(4, algorithm="hartigan", init=pick_rows(X, 4, seed=1)).fit(X)
    assert km.stop_reason_ == "no-improving-move"
    assert single_move_gains(X, km.labels_, 4) <= 1e-9 * km.inertia_
    # the in-memory standard Hartigan ends at a Hartigan optimum too
    std = standard_hartigan(X, pick_rows(X, 4, seed=1))
    assert single_move_gains(X, std.labels, 4) <= 1e-9 * std.objective


def test_functional_method_tag(client, problem):
    X, C0 = problem
    desc = Descriptor(cluster_count=8, max_iteration_count=200, dtype=np.float64, method="hartigan")
    res = train(desc, X, C0)
    lloyd = train(Descriptor(cluster_count=8, max_iteration_count=200, dtype=np.float64), X, C0)
    assert res.objective_function_value <= lloyd.objective_function_value * (1 + 1e-9)
    assert 0 <= res.iteration_count <= 200 and len(res.history) == res.iteration_count
    assert all(r.moves >= 0 for r in res.history)
    inf = infer(desc, res.model, X)
    np.testing.assert_array_equal(inf.labels, res.labels)
    assert inf.objective_function_value == res.objective_function_value


@pytest.mark.parametrize(
    "params, fragment",
    [
        ({"algorithm": "elkan"}, "algorithm"),
        ({"refine": "lloyd"}, "refine"),
        ({"algorithm": "hartigan", "refine": "hartigan"}, "refine"),
        ({"hartigan_mode": "fast"}, "hartigan_mode"),
    ],
)
def test_bad_hartigan_parameters(client, problem, params, fragment):
    X, _ = problem
    with pytest.raises(InvalidParameterError, match=fragment):
        KMeans(3, **params).fit(X)
    with pytest.raises(InvalidParameterError, match="method"):
        Descriptor(method="elkan")
