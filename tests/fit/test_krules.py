"""The rules that choose k on hand-computed scores; the BIC against a likelihood summed by row."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from dkmeans.fit.krules import RULE_TEXT, RULES, Scores, answers, bic_score, gap_choice

nan = float("nan")


def test_bic_is_the_hard_assignment_likelihood_less_the_penalty():
    """Row by row: log(n_j / n) + the spherical normal log-density about the cluster's mean."""
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(0, 1, (30, 3)), rng.normal(6, 1, (50, 3))])
    labels = np.repeat([0, 1], [30, 50])
    means = np.array([X[labels == j].mean(0) for j in (0, 1)])
    sse = float(((X - means[labels]) ** 2).sum())
    n, k, d = 80, 2, 3
    s2 = sse / (d * (n - k))
    log_l = sum(
        math.log(np.sum(labels == labels[i]) / n)
        + norm.logpdf(X[i], means[labels[i]], math.sqrt(s2)).sum()
        for i in range(n)
    )
    want = log_l - ((k - 1) + k * d + 1) / 2 * math.log(n)
    assert bic_score([30, 50], sse, d) == pytest.approx(want, rel=1e-12)


def test_bic_by_hand_and_its_undefined_cases():
    # n = 4, k = 2, d = 1, SSE = 4: s2 = 2; log L = 4 log(1/2) - 2 log(4 pi) - 1;
    # p = 4: penalty 2 log 4
    want = 4 * math.log(0.5) - 2 * math.log(4 * math.pi) - 1 - 2 * math.log(4)
    assert bic_score([2, 2, 0], 4.0, 1) == pytest.approx(
        want
    )  # an empty cluster is not a component
    assert math.isnan(bic_score([1, 1], 3.0, 2))  # n <= k
    assert math.isnan(bic_score([3, 3], 0.0, 2))  # no variance


def _scores(ks, **columns):
    return Scores(ks=ks, objective=columns.pop("objective", [float(10 - k) for k in ks]), **columns)


def test_best_of_each_index_skips_undefined_values():
    s = _scores(
        [2, 3, 4, 5],
        calinski_harabasz=[10, nan, 30, 20],
        davies_bouldin=[0.9, 0.4, nan, 0.5],
        silhouette=[nan, nan, nan, nan],
        bic=[-5, -3, -4, -6],
    )
    got = answers(s)
    assert (got["calinski_harabasz"], got["davies_bouldin"], got["silhouette"], got["bic"]) == (
        4,
        3,
        None,
        3,
    )
    assert set(got) == set(RULES) == set(RULE_TEXT)


@pytest.mark.parametrize(
    "gap_1, gaps, sds, expected",
    [
        # 1: 0.1 >= 0.15 - 0.1: k = 1, no clusters
        (0.1, [0.15, 0.2, 0.3], [0.1, 0.1, 0.1], None),
        # 1: 0.1 < 0.5 - 0.1; 2: 0.5 < 1.2 - 0.1; 3: 1.2 >= 1.25 - 0.1: k = 3
        (0.1, [0.5, 1.2, 1.25], [0.1, 0.1, 0.1], 3),
        # rising to the end of the grid: no k
        (0.0, [1.0, 2.0, 3.0], [0.1, 0.1, 0.1], None),
        # no reference (NaN): no k
        (nan, [nan, nan, nan], [nan, nan, nan], None),
    ],
)
def test_the_gap_rule_by_hand(gap_1, gaps, sds, expected):
    s = _scores([2, 3, 4], gap=gaps, gap_sd=sds, gap_at_1=gap_1, gap_sd_at_1=0.1)
    assert gap_choice(s) == expected


def test_the_gap_rule_s_next_k_is_the_next_value_of_the_grid():
    # coarse grid 2, 4, 8: at 4, compare with 8 (not 5): 1.0 >= 1.05 - 0.1
    s = _scores(
        [2, 4, 8], gap=[0.5, 1.0, 1.05], gap_sd=[0.05, 0.05, 0.1], gap_at_1=0.0, gap_sd_at_1=0.05
    )
    assert gap_choice(s) == 4
