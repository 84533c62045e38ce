"""Rules that choose k from a sweep's per-k scores, each a pure function of the scores on the grid.

Every rule takes a :class:`Scores` (the grid of k and the per-k criteria) and returns a k of
the grid, or None where it finds no k (a curve without an elbow, data without clusters, a
criterion undefined on every k). :data:`RULES` names them; :func:`answers` applies them all.
How well each finds a known k is measured in ``benchmarks/choose_k.py``; the sweep's
default suggestion (:func:`suggest`) is the rule that table chose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Scores:
    """Per-k criteria of a sweep, each a list aligned with ``ks`` (NaN where undefined).

    Attributes
    ----------
    ks : list of int
        Increasing.
    objective, calinski_harabasz, davies_bouldin, silhouette, bic, gap, gap_sd : list of float
        ``gap_sd`` is Tibshirani's ``s_k = sd_k * sqrt(1 + 1 / B)``.
    gap_at_1 : float
        The gap at k = 1 (NaN without a reference curve), the rule's first candidate.
    gap_sd_at_1 : float
    """

    ks: list
    objective: list
    calinski_harabasz: list = field(default_factory=list)
    davies_bouldin: list = field(default_factory=list)
    silhouette: list = field(default_factory=list)
    bic: list = field(default_factory=list)
    gap: list = field(default_factory=list)
    gap_sd: list = field(default_factory=list)
    gap_at_1: float = float("nan")
    gap_sd_at_1: float = float("nan")

    def column(self, name: str) -> np.ndarray:
        values = getattr(self, name)
        return np.asarray(
            values if len(values) == len(self.ks) else [np.nan] * len(self.ks), dtype=np.float64
        )


def elbow(k_values, objectives) -> int | None:
    """The elbow of a decreasing objective curve (``RULE_TEXT["elbow"]``), or None.

    ``k`` and ``log(objective)`` are each scaled to [0, 1]; the elbow is the k whose point
    lies farthest below the chord from the first point to the last (the largest vertical
    gap, which is the largest distance to the chord: the chord's slope is fixed). Where an
    objective is 0 (as many distinct rows as clusters) the objective itself is scaled. None
    for fewer than three values, a flat curve, or a curve with no point below the chord.

    Parameters
    ----------
    k_values : sequence of int, increasing
    objectives : sequence of float
    """
    k = np.asarray(k_values, dtype=np.float64)
    f = np.asarray(objectives, dtype=np.float64)
    if k.size < 3 or not np.all(np.isfinite(f)) or f.max() == f.min():
        return None
    if f.min() > 0:
        f = np.log(f)
    x = (k - k[0]) / (k[-1] - k[0])
    y = (f - f.min()) / (f.max() - f.min())
    gap = (y[0] + (y[-1] - y[0]) * x) - y  # chord minus curve: positive below the chord
    best = int(np.argmax(gap))
    return int(k_values[best]) if gap[best] > 1e-12 else None


def _best(ks, values, *, largest: bool) -> int | None:
    values = np.asarray(values, dtype=np.float64)
    ok = np.isfinite(values)
    if not ok.any():
        return None
    masked = np.where(ok, values, -np.inf if largest else np.inf)
    return int(ks[int(np.argmax(masked) if largest else np.argmin(masked))])


def bic_score(sizes, objective: float, n_features: int) -> float:
    """The BIC of a partition as X-means scores it (Pelleg and Moore 2000): higher is better.

    A mixture of spherical Gaussians, one per cluster holding weight, with mixing weights
    ``n_j / n`` and one variance ``s2 = objective / (d (n - k))`` (the unbiased pooled
    estimate); the log-likelihood of the hard assignment
    ``sum_j n_j log(n_j / n) - n d / 2 log(2 pi s2) - d (n - k) / 2`` less
    ``p / 2 log(n)`` for ``p = (k - 1) + k d + 1`` parameters. NaN where ``n <= k`` or the
    objective is 0.
    """
    n_j = np.asarray(sizes, dtype=np.float64)
    n_j = n_j[n_j > 0]
    k, n, d = n_j.size, float(n_j.sum()), int(n_features)
    if n <= k or not objective > 0:
        return float("nan")
    s2 = objective / (d * (n - k))
    log_l = (
        float(np.sum(n_j * np.log(n_j / n)))
        - n * d / 2 * math.log(2 * math.pi * s2)
        - d * (n - k) / 2
    )
    return log_l - ((k - 1) + k * d + 1) / 2 * math.log(n)


def gap_choice(scores: Scores) -> int | None:
    """Tibshirani et al.'s rule: the smallest k with ``gap(k) >= gap(k') - s_k'``.

    ``k'`` is the next k of the grid.

    k = 1 is the first candidate (its gap from the data's total scatter), so data without
    clusters gives None. A k whose gap is undefined ends the search (None where the first is).
    """
    ks = [1] + [k for k in scores.ks if k != 1]
    gap = [scores.gap_at_1] + [g for k, g in zip(scores.ks, scores.column("gap")) if k != 1]
    sd = [scores.gap_sd_at_1] + [s for k, s in zip(scores.ks, scores.column("gap_sd")) if k != 1]
    for i in range(len(ks) - 1):
        if not (math.isfinite(gap[i]) and math.isfinite(gap[i + 1]) and math.isfinite(sd[i + 1])):
            return None
        if gap[i] >= gap[i + 1] - sd[i + 1]:
            return None if ks[i] == 1 else ks[i]
    return None


#: The rules, by name: what each says it does (as :attr:`SweepResult.rule` states a choice).
RULE_TEXT = {
    "elbow": (
        "elbow of the objective curve: the k farthest below the straight line from the first "
        "to the last point, with k and the logarithm of the objective each scaled to [0, 1] "
        "(Kneedle on the log objective; the objective itself where one is 0); none where no "
        "point lies below that line"
    ),
    "calinski_harabasz": "the largest Calinski-Harabasz index",
    "davies_bouldin": "the smallest Davies-Bouldin index",
    "silhouette": "the largest silhouette of a sample of rows",
    "gap": (
        "the gap statistic: the smallest k whose gap is within one standard error of the next k's "
        "(Tibshirani et al. 2001; none when that k is 1)"
    ),
    "bic": "the largest BIC of a spherical Gaussian mixture with one shared variance (X-means)",
}


def _rule(name: str):
    if name == "elbow":
        return lambda s: elbow(s.ks, s.objective)
    if name == "gap":
        return gap_choice
    largest = name != "davies_bouldin"
    return lambda s: _best(s.ks, s.column(name), largest=largest)


RULES = {name: _rule(name) for name in RULE_TEXT}


def answers(scores: Scores) -> dict:
    """Every rule's k (or None), by name."""
    return {name: rule(scores) for name, rule in RULES.items()}


#: How far (in log objective) some k's gap, less its standard error, must exceed the gap at k = 1
#: for the data to count as clustered (uniform data: at most 0.04 above; clustered sets: 0.2 and
#: more).
STRUCTURE_MARGIN = 0.1
#: The rules that vote for the default suggestion (the best single rules of the benchmark's
#: tuning sets).
VOTERS = ("calinski_harabasz", "davies_bouldin", "elbow", "gap")
#: On a tie, the first of these rules whose k is tied gives the k: Davies-Bouldin's (the index
#: least drawn to a cluster of noise), then Calinski-Harabasz's (where the separation favours
#: more clusters, the gap and the BIC overrule, :func:`model_override`).
TIE_BREAKERS = ("davies_bouldin", "calinski_harabasz")
#: The gap statistic and the BIC, where they agree on a k, overrule the vote when that k's
#: Calinski-Harabasz index is within this share of the maximum (the benchmark's sets where the
#: vote missed had it within 1-6%; the sets where the two agreed on a wrong k, 41% and more).
MODEL_CH_SHARE = 0.15
#: A larger k than Davies-Bouldin's whose index is worse than at Davies-Bouldin's k by more than
#: this share (and whose gap rises by less than STRUCTURE_MARGIN per extra cluster) adds diffuse
#: clusters: :func:`diffuse_split`. Tuning sets: real extra clusters that pass the gap test
#: raise the Davies-Bouldin index by at most 14%, clusters of uniform noise by 28%.
DIFFUSE_DB_SHARE = 0.2
#: A larger k whose Davies-Bouldin index is at most this share worse (and whose gap rises by at
#: least STRUCTURE_MARGIN per extra cluster) splits off real clusters: :func:`real_split`. Below
#: DIFFUSE_DB_SHARE, so that the two tests leave a margin between them (a cluster of noise
#: worsened the index by 19% in the benchmark's noise set of seed 16).
REAL_DB_SHARE = 0.1


def clustered(scores: Scores) -> bool | None:
    """Whether some k clusters the data better than uniform data (None without a reference curve).

    True when ``max_k (gap(k) - s_k) - gap(1) > STRUCTURE_MARGIN``: some k's objective falls
    below the reference's by a factor of ``exp(0.1)`` more than the whole data's scatter does.
    """
    gap, sd = scores.column("gap"), scores.column("gap_sd")
    ok = np.isfinite(gap) & np.isfinite(sd)
    if not math.isfinite(scores.gap_at_1) or not ok.any():
        return None
    return bool(np.max(gap[ok] - sd[ok]) - scores.gap_at_1 > STRUCTURE_MARGIN)


def suggest(scores: Scores) -> tuple:
    """The sweep's default suggestion: ``(k or None, the reason)``.

    1. No clear k where the gap statistic's reference finds no structure (:func:`clustered`).
    2. Else the k most of :data:`VOTERS` choose. On a tie, the k of the first of
       :data:`TIE_BREAKERS` that is tied (else the smallest tied k); where that is
       Davies-Bouldin's, the tied k :func:`separated_k` raises it to, if any.
    3. Unless the gap rule and the BIC agree on another k whose Calinski-Harabasz index is
       within :data:`MODEL_CH_SHARE` of the maximum: then that k (:func:`model_override`).
    4. Unless the k of steps 2 and 3 is larger than Davies-Bouldin's (raised by
       :func:`separated_k`) and its extra clusters over that k are diffuse
       (:func:`diffuse_split`): then that smaller k.
    """
    found = answers(scores)
    has_structure = clustered(scores)
    if has_structure is False:
        return None, (
            f"no clear k: no k's gap statistic, less its standard error, exceeds the gap at "
            f"k = 1 by "
            f"more than {STRUCTURE_MARGIN} (the data clusters no better than uniform data)"
        )
    votes: dict = {}
    for name in VOTERS:
        if found[name] is not None:
            votes.setdefault(found[name], []).append(name)
    if not votes:
        return None, "no clear k: none of " + ", ".join(VOTERS) + " finds one"
    top = max(len(v) for v in votes.values())
    tied = sorted(k for k, v in votes.items() if len(v) == top)
    k, how = tied[0], "the most votes"
    if len(tied) > 1:
        breaker = next((name for name in TIE_BREAKERS if found[name] in tied), None)
        k = found[breaker] if breaker else tied[0]
        how = f"a tie broken by {breaker or 'the smallest k'}"
        base = separated_k(scores, found)
        if breaker == "davies_bouldin" and base in tied and base != k:
            k = base
            how = f"a tie broken by davies_bouldin's {found[breaker]} raised to a real split"
    detail = "; ".join(f"{', '.join(names)}: {v}" for v, names in sorted(votes.items()))
    note = "" if has_structure else "; no gap reference, so no test for data without clusters"
    reason = f"{how} of {', '.join(VOTERS)} ({detail}){note}"
    agreed = model_override(scores, found)
    if agreed is not None and agreed != k:
        k, reason = (
            agreed,
            (
                f"the gap statistic and the BIC agree on {agreed}, whose Calinski-Harabasz index is "
                f"within {MODEL_CH_SHARE:.0%} of the maximum, over {k} by {reason}"
            ),
        )
    fewer = diffuse_split(scores, k, found)
    if fewer is not None:
        worse, rise = _steps(scores, fewer, k)
        return fewer, (
            f"{fewer} ({_base_text(found, fewer)}): the {k - fewer} extra cluster(s) of {k} "
            f"are diffuse (the Davies-Bouldin index {worse:.0%} worse, more than "
            f"{DIFFUSE_DB_SHARE:.0%}; the gap, less its standard error, {rise:+.2f} above "
            f"{fewer}'s, less than {STRUCTURE_MARGIN} per extra cluster), over {k} by {reason}"
        )
    return k, reason


def diffuse_split(scores: Scores, k: int, found: dict | None = None) -> int | None:
    """:func:`separated_k` where the larger ``k`` only adds diffuse clusters (noise), else None.

    Two signs, both needed. (a) A cluster of scattered rows (uniform noise between the
    clusters, or a piece cut out of a cloud) has a large scatter close to the others' centres:
    the Davies-Bouldin index (the mean over clusters of the worst ratio of two clusters'
    scatters to their centres' distance) is worse at ``k`` than at ``k0`` (its own k, or the
    real split :func:`separated_k` raises that to) by more than :data:`DIFFUSE_DB_SHARE`.
    Overlapping real clusters raise the index too, so (b): the extra clusters lower the
    objective little more than they would lower uniform data's, the gap statistic's test of
    step 1 applied to the step from ``k0`` to ``k``:
    ``gap(k) - s_k - gap(k0) < STRUCTURE_MARGIN * (k - k0)``. A real cluster split off cuts
    the objective far more than a split of uniform rows does.

    Parameters
    ----------
    scores : Scores
    k : int
        The k chosen so far (a value of ``scores.ks``).
    found : dict, optional
        :func:`answers` of ``scores``, when already computed.

    Returns
    -------
    int or None
        ``k0`` where both signs hold; None where either fails, where ``k0`` is not smaller
        than ``k``, or where a score it needs is undefined (no gap reference: no test).
    """
    found = answers(scores) if found is None else found
    k0 = separated_k(scores, found)
    if k0 is None or k is None or not k0 < k:
        return None
    steps = _steps(scores, k0, k)
    if steps is None:
        return None
    worse, rise = steps
    diffuse = worse > DIFFUSE_DB_SHARE
    no_structure = rise < STRUCTURE_MARGIN * (k - k0)
    return k0 if diffuse and no_structure else None


def _steps(scores: Scores, k0: int, k: int):
    """``(DB(k) / DB(k0) - 1, gap(k) - s_k - gap(k0))``, or None where one is undefined."""
    db, gap, sd = (scores.column(c) for c in ("davies_bouldin", "gap", "gap_sd"))
    i, j = scores.ks.index(k), scores.ks.index(k0)
    if not (db[j] > 0 and np.isfinite([db[i], gap[i], sd[i], gap[j]]).all()):
        return None
    # Python floats: a DB index next to a subnormal one is infinitely worse, without NumPy's warning
    return float(db[i]) / float(db[j]) - 1.0, float(gap[i] - sd[i] - gap[j])


def real_split(scores: Scores, k0: int, k: int) -> bool:
    """Whether the extra clusters of ``k`` over ``k0 < k`` are real: compact and structured.

    The opposite of :func:`diffuse_split`'s two signs, with a margin: the Davies-Bouldin
    index at most :data:`REAL_DB_SHARE` worse at ``k`` than at ``k0``, and the gap, less its
    standard error, at least :data:`STRUCTURE_MARGIN` per extra cluster above ``k0``'s.
    False where a score is undefined.

    Parameters
    ----------
    scores : Scores
    k0, k : int
        Values of ``scores.ks``.
    """
    steps = _steps(scores, k0, k) if k0 < k else None
    if steps is None:
        return False
    worse, rise = steps
    return worse <= REAL_DB_SHARE and rise >= STRUCTURE_MARGIN * (k - k0)


def separated_k(scores: Scores, found: dict | None = None) -> int | None:
    """Davies-Bouldin's k, raised to the largest k of :data:`VOTERS` that is a real split of it.

    Davies-Bouldin's index is the least drawn to a cluster of noise but merges clusters that
    a little noise between them makes look close; where another voter's larger k splits off
    clusters that are compact and structured (:func:`real_split`), that k is the base the
    tie rule and :func:`diffuse_split` start from. None where Davies-Bouldin has no k.

    Parameters
    ----------
    scores : Scores
    found : dict, optional
        :func:`answers` of ``scores``, when already computed.
    """
    found = answers(scores) if found is None else found
    k0 = found["davies_bouldin"]
    if k0 is None:
        return None
    larger = {found[name] for name in VOTERS if found[name] is not None and found[name] > k0}
    real = [k for k in larger if real_split(scores, k0, k)]
    return max(real) if real else k0


def _base_text(found: dict, base: int) -> str:
    k0 = found["davies_bouldin"]
    if base == k0:
        return "Davies-Bouldin's k"
    return f"Davies-Bouldin's {k0} raised to a real split"


def model_override(scores: Scores, found: dict | None = None) -> int | None:
    """The k the two model-based rules agree on where the separation of clusters allows it.

    The gap rule (the data against uniform reference data) and the BIC (a spherical Gaussian
    mixture) see clusters that overlap or are small beside a large one, which the elbow and
    the indices of separation (Calinski-Harabasz, Davies-Bouldin) merge. Their common k is
    returned when its Calinski-Harabasz index is within :data:`MODEL_CH_SHARE` of the maximum;
    else None (where they agree on a k that splits noise or elongated clusters, the index is
    far below its maximum there).

    Parameters
    ----------
    scores : Scores
    found : dict, optional
        :func:`answers` of ``scores``, when already computed.
    """
    found = answers(scores) if found is None else found
    k = found["gap"]
    if k is None or k != found["bic"]:
        return None
    ch = scores.column("calinski_harabasz")
    if not np.isfinite(ch).any() or not ch[scores.ks.index(k)] >= (1 - MODEL_CH_SHARE) * float(
        np.nanmax(ch)
    ):
        return None
    return k


__all__ = [
    "DIFFUSE_DB_SHARE",
    "MODEL_CH_SHARE",
    "REAL_DB_SHARE",
    "RULES",
    "RULE_TEXT",
    "STRUCTURE_MARGIN",
    "TIE_BREAKERS",
    "Scores",
    "VOTERS",
    "answers",
    "bic_score",
    "clustered",
    "diffuse_split",
    "elbow",
    "gap_choice",
    "model_override",
    "real_split",
    "separated_k",
    "suggest",
]
