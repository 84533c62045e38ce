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
    DIFFUSE_DB_SHARE,
    MODEL_CH_SHARE,
    RULE_TEXT,
    RULES,
    Scores,
    answers,
    bic_score,
    diffuse_split,
    gap_choice,
    model_override,
    real_split,
    separated_k,
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
    # the elbow here says 3 too: the tie (2: CH, DB; 3: elbow, gap) already goes to 3, a real
    # split over Davies-Bouldin's 2 (the index 3% worse, the gap +0.13); without the elbow's
    # vote the override gives 3
    k, reason = suggest(s)
    assert k == 3 and reason.startswith("a tie broken by davies_bouldin's 2 raised to"), reason
    flat = dataclasses.replace(s, objective=[3833, 3000, 2200, 1500, 1479])
    assert answers(flat)["elbow"] != 3
    k, reason = suggest(flat)
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
    if " are diffuse (" in reason.split(" over ")[0]:
        assert k == separated_k(s) and k <= max(v for v in answers(s).values() if v is not None)


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


def _noise_split():
    """The benchmark's noise set of seed 16 (6 clusters and 5% uniform rows) on the coarse grid,
    rounded: the gap and the BIC agree on 8 (two clusters of noise), Calinski-Harabasz's
    maximum; Davies-Bouldin says 6."""
    return Scores(
        ks=[2, 3, 4, 6, 8, 10, 12],
        objective=[63215, 32494, 15878, 4130, 2783, 2450, 2192],
        calinski_harabasz=[1697, 2095, 3184, 7864, 8384, 7405, 6766],
        davies_bouldin=[0.581, 0.508, 0.426, 0.310, 0.398, 0.585, 0.824],
        silhouette=[nan] * 7,
        bic=[-6639, -6373, -6001, -5184, -4892, -4908, -5011],
        gap=[0.700, 0.986, 1.277, 2.244, 2.361, 2.211, 2.136],
        gap_sd=[0.024, 0.022, 0.010, 0.051, 0.048, 0.017, 0.032],
        gap_at_1=0.262,
        gap_sd_at_1=0.02,
    )


def test_extra_clusters_of_noise_give_davies_bouldin_s_k():
    """8 against 6: the index of separation 28% worse (0.398 / 0.310) and the gap, less its
    standard error, only 0.069 above 6's (2.361 - 0.048 - 2.244), under 0.1 per extra cluster:
    the two extra clusters are diffuse, so 6 (before: the gap and the BIC's 8)."""
    s = _noise_split()
    got = answers(s)
    assert (got["gap"], got["bic"], got["calinski_harabasz"], got["davies_bouldin"]) == (8, 8, 8, 6)
    assert model_override(s) == 8
    assert diffuse_split(s, 8) == 6
    k, reason = suggest(s)
    assert k == 6, reason
    want = "6 (Davies-Bouldin's k): the 2 extra cluster(s) of 8 are diffuse"
    assert reason.startswith(want), reason
    assert "28% worse" in reason and "+0.07 above 6's" in reason
    assert "over 8 by the gap statistic and the BIC agree on 8" in reason


def test_overlapping_pairs_that_raise_davies_bouldin_but_cut_the_objective_stay():
    """The issue's 8 blobs with two pairs 5 sd apart (``test_sweep``'s coarse grid, rounded):
    Davies-Bouldin and the elbow say 6, the index 40% worse at 8; but the gap rises 0.35 from 6
    to 8, well above 0.1 per extra cluster: the pairs are real clusters, so 8."""
    ks = [2, 3, 4, 6, 8, 10, 12]
    s = Scores(
        ks=ks,
        objective=[60000, 47000, 36000, 14000, 10500, 10300, 10100],
        calinski_harabasz=[4740, 4652, 6180, 15430, 17771, 14260, 12062],
        davies_bouldin=[0.980, 0.761, 0.596, 0.476, 0.665, 1.416, 1.963],
        silhouette=[nan] * 7,
        bic=[-99954, -95439, -88670, -69591, -63672, -64268, -64782],
        gap=[0.663, 0.789, 1.113, 2.184, 2.533, 2.485, 2.443],
        gap_sd=[0.01] * 7,
        gap_at_1=0.3,
        gap_sd_at_1=0.01,
    )
    got = answers(s)
    assert (got["davies_bouldin"], got["calinski_harabasz"], got["gap"], got["bic"]) == (6, 8, 8, 8)
    assert diffuse_split(s, 8) is None
    assert suggest(s)[0] == 8


@pytest.mark.parametrize(
    "db_3, gap_3, expected",
    [
        # 25% worse, the gap 0.05 above 2's: diffuse
        (1.25, 1.05, 2),
        # 25% worse, the gap 0.3 above: a real cluster
        (1.25, 1.3, None),
        # the gap flat, the index worse by less than the share: kept
        (1 + DIFFUSE_DB_SHARE - 0.01, 1.0, None),
        # the index better at 3: 3 is Davies-Bouldin's k, nothing smaller to fall back to
        (0.9, 1.0, None),
        # no gap at 3 (undefined): no test
        (1.25, nan, None),
    ],
)
def test_diffuse_split_by_hand(db_3, gap_3, expected):
    """Davies-Bouldin's index 1.0 at k = 2, gap 1.0 (standard errors 0); the k chosen is 3."""
    s = _scores(
        [2, 3, 4],
        calinski_harabasz=[100.0, 100.0, 1.0],
        davies_bouldin=[1.0, db_3, 5.0],
        gap=[1.0, gap_3, 0.0],
        gap_sd=[0.0, 0.0, 0.0],
    )
    assert answers(s)["davies_bouldin"] == (3 if db_3 < 1.0 else 2)
    assert diffuse_split(s, 3) == expected
    assert diffuse_split(s, 2) is None  # not larger than Davies-Bouldin's k


def _four_way():
    """The benchmark's noise set of seed 38 (8 clusters, 5% uniform rows), fine grid, rounded:
    four voters, four k (Davies-Bouldin 6, elbow 8, Calinski-Harabasz 9, the gap 10)."""
    ks = list(range(2, 13))
    return Scores(
        ks=ks,
        objective=[172387, 108943, 49844, 25646, 20090, 14797, 9531, 7878, 7269, 6683, 6369],
        calinski_harabasz=[1031, 1182, 2219, 3528, 3670, 4224, 5715, 6078, 5863, 5745, 5482],
        davies_bouldin=[
            1.033,
            0.666,
            0.494,
            0.421,
            0.391,
            0.437,
            0.419,
            0.476,
            0.557,
            0.641,
            0.642,
        ],
        silhouette=[nan] * 11,
        bic=[-13513, -13098, -11989, -11041, -10807, -10466, -9864, -9560, -9448, -9341, -9282],
        gap=[0.557, 0.800, 1.364, 1.846, 1.901, 2.077, 2.385, 2.495, 2.523, 2.542, 2.536],
        gap_sd=[0.011, 0.032, 0.023, 0.008, 0.010, 0.013, 0.040, 0.014, 0.010, 0.019, 0.016],
        gap_at_1=0.282,
        gap_sd_at_1=0.01,
    )


def test_a_four_way_tie_goes_to_the_real_split_over_davies_bouldin_s_k():
    """8 over 6: the index 7% worse (at most 10%), the gap +0.22 per extra cluster (at least
    0.1): real clusters. 9 and 10 worsen the index by 22% and 42%: not real. So 8."""
    s = _four_way()
    got = answers(s)
    rules = ("davies_bouldin", "elbow", "calinski_harabasz", "gap")
    assert tuple(got[name] for name in rules) == (6, 8, 9, 10)
    assert real_split(s, 6, 8) and not real_split(s, 6, 9) and not real_split(s, 6, 10)
    assert separated_k(s) == 8
    k, reason = suggest(s)
    assert k == 8, reason
    assert reason.startswith("a tie broken by davies_bouldin's 6 raised to a real split"), reason


def test_on_the_coarse_grid_the_diffuse_test_starts_from_the_real_split():
    """The same set on the coarse grid: Calinski-Harabasz and the gap say 10 (two votes); over 6
    its extra clusters are not diffuse on average (+0.15 per cluster), but over 8, the real split
    of 6, they are (the index 33% worse, the gap +0.06 per cluster): so 8."""
    full = _four_way()
    at = [full.ks.index(k) for k in (2, 3, 4, 6, 8, 10, 12)]
    s = Scores(
        ks=[full.ks[i] for i in at],
        **{
            name: [getattr(full, name)[i] for i in at]
            for name in (
                "objective",
                "calinski_harabasz",
                "davies_bouldin",
                "silhouette",
                "bic",
                "gap",
                "gap_sd",
            )
        },
        gap_at_1=full.gap_at_1,
        gap_sd_at_1=full.gap_sd_at_1,
    )
    got = answers(s)
    assert (got["calinski_harabasz"], got["gap"], got["elbow"], got["davies_bouldin"]) == (
        10,
        10,
        8,
        6,
    )
    assert separated_k(s) == 8 and diffuse_split(s, 10) == 8
    k, reason = suggest(s)
    assert k == 8, reason
    assert reason.startswith("8 (Davies-Bouldin's 6 raised to a real split): the 2 extra"), reason


def test_a_db_index_next_to_a_subnormal_one_is_infinitely_worse_without_a_warning():
    """DB(k0) a subnormal positive number (points of k0 clusters all but on their centroids):
    DB(k) / DB(k0) overflows to infinity, a result, not a NumPy overflow warning."""
    import warnings

    from dkmeans.fit.krules import _steps

    s = _scores([2, 3], davies_bouldin=[1e-310, 0.5], gap=[1.0, 1.2], gap_sd=[0.1, 0.1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        worse, rise = _steps(s, 2, 3)
    assert worse == float("inf") and rise == pytest.approx(1.2 - 0.1 - 1.0)
