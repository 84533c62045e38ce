"""The rules that choose k on hand-computed scores; the BIC against a likelihood summed by row."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from dkmeans.fit.krules import (
    MODEL_CH_SHARE,
    RULE_TEXT,
    RULES,
    Scores,
    answers,
    bic_score,
    gap_choice,
    model_override,
    suggest,
)

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


def _case(ch, db, objective, gaps, bic, *, ks=(2, 3, 4, 5, 6)):
    """Scores whose gap rises to its k and stays flat (sd 0.01) after, gap(1) far below."""
    return Scores(
        ks=list(ks),
        objective=objective,
        calinski_harabasz=ch,
        davies_bouldin=db,
        silhouette=[nan] * len(ks),
        bic=bic,
        gap=gaps,
        gap_sd=[0.01] * len(ks),
        gap_at_1=0.0,
        gap_sd_at_1=0.01,
    )


def test_the_gap_and_the_bic_overrule_the_vote_where_the_separation_index_allows():
    """A small cluster beside a large one (the benchmark's unequal set of seed 14, rounded).

    Calinski-Harabasz and Davies-Bouldin prefer 2 (the small cluster merged), the elbow 2;
    the gap and the BIC agree on 3, whose Calinski-Harabasz index is 6% below the maximum.
    """
    s = _case(
        ch=[3086, 2897, 2362, 2099, 1834],
        db=[0.448, 0.460, 1.078, 0.997, 1.271],
        objective=[3833, 2249, 1877, 1607, 1479],
        gaps=[0.99, 1.13, 1.13, 1.13, 1.13],
        bic=[-4364, -3887, -4064, -4119, -4156],
    )
    got = answers(s)
    assert (got["calinski_harabasz"], got["davies_bouldin"], got["gap"], got["bic"]) == (2, 2, 3, 3)
    assert model_override(s) == 3
    k, reason = suggest(s)
    assert k == 3 and reason.startswith("the gap statistic and the BIC agree on 3"), reason
    assert " over 2 by " in reason


def test_the_vote_stands_where_the_index_is_far_below_its_maximum():
    """Noise read as clusters: the gap and the BIC agree on 5, its index 40% below the best."""
    s = _case(
        ch=[1053, 1707, 1405, 1024, 1002],
        db=[0.53, 0.45, 0.95, 1.04, 1.04],
        objective=[18520, 7256, 6005, 5397, 5115],
        gaps=[1.34, 2.15, 2.24, 2.40, 2.40],
        bic=[-8747, -7215, -6924, -6700, -6714],
    )
    got = answers(s)
    assert (got["gap"], got["bic"], got["calinski_harabasz"]) == (5, 5, 3)
    assert model_override(s) is None
    k, reason = suggest(s)
    assert k == 3 and reason.startswith("the most votes"), reason


def test_without_a_reference_there_is_no_override():
    s = _case(
        ch=[3086, 2897, 2362, 2099, 1834],
        db=[0.448, 0.460, 1.078, 0.997, 1.271],
        objective=[3833, 2249, 1877, 1607, 1479],
        gaps=[nan] * 5,
        bic=[-4364, -3887, -4064, -4119, -4156],
    )
    s = dataclasses.replace(s, gap_sd=[nan] * 5, gap_at_1=nan, gap_sd_at_1=nan)
    assert model_override(s) is None and suggest(s)[0] == 2


finite = st.floats(-1e6, 1e6, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(3, 9).flatmap(
        lambda n: st.tuples(
            st.lists(st.floats(1e-3, 1e6), min_size=n, max_size=n),
            st.lists(st.one_of(finite, st.just(nan)), min_size=n, max_size=n),
            st.lists(st.one_of(st.floats(0, 10), st.just(nan)), min_size=n, max_size=n),
            st.lists(st.one_of(finite, st.just(nan)), min_size=n, max_size=n),
            st.lists(st.one_of(st.floats(-1, 5), st.just(nan)), min_size=n, max_size=n),
            st.lists(st.floats(0, 1), min_size=n, max_size=n),
            st.floats(-1, 5),
        )
    )
)
def test_the_suggestion_is_a_k_of_the_grid_or_none_and_states_its_reason(case):
    """Any scores: a k of the grid (or None, said "no clear k"); an override obeys its bound."""
    objective, ch, db, bic, gaps, sds, gap_1 = case
    ks = list(range(2, 2 + len(objective)))
    s = Scores(
        ks=ks,
        objective=sorted(objective, reverse=True),
        calinski_harabasz=ch,
        davies_bouldin=db,
        silhouette=[nan] * len(ks),
        bic=bic,
        gap=gaps,
        gap_sd=sds,
        gap_at_1=gap_1,
        gap_sd_at_1=0.05,
    )
    k, reason = suggest(s)
    assert (k is None) == reason.startswith("no clear k")
    assert k is None or k in ks
    if reason.startswith("the gap statistic and the BIC"):
        got = answers(s)
        assert got["gap"] == got["bic"] == k
        assert ch[ks.index(k)] >= (1 - MODEL_CH_SHARE) * np.nanmax(np.asarray(ch, float))


def test_a_tie_goes_to_davies_bouldin_s_k():
    """Noise read as a seventh cluster (the benchmark's noise set of seed 16, rounded): the elbow
    and Davies-Bouldin say 6, Calinski-Harabasz and the gap 7; the BIC says 9 (no override)."""
    s = _case(
        ks=(4, 5, 6, 7, 8, 9),
        ch=[3184, 4862, 7864, 8995, 8384, 7898],
        db=[0.426, 0.402, 0.310, 0.368, 0.398, 0.463],
        objective=[15880, 8164, 4130, 3025, 2783, 2585],
        gaps=[1.28, 1.77, 2.24, 2.39, 2.39, 2.39],
        bic=[-6001, -5606, -5184, -4942, -4892, -4846],
    )
    got = answers(s)
    rules = ("elbow", "davies_bouldin", "calinski_harabasz", "gap")
    assert tuple(got[name] for name in rules) == (6, 6, 7, 7)
    k, reason = suggest(s)
    assert k == 6 and reason.startswith("a tie broken by davies_bouldin"), reason
