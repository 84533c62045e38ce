"""Size-capped assignment over the data protocol: per-cluster prices moved by counting passes.

With a size range ``[lower, upper]`` per cluster (weighted rows), the assignment of rows to
fixed centroids that minimises the objective is a transportation problem. Its dual has one
price per cluster, and at the right prices each row goes to ``argmin_j d(x, c_j) + p_j``
(:mod:`dkmeans.kernels.capacitated`, with exact integer costs and ties split by global row
index). :class:`CapacitatedPasses` finds such prices with an auction over passes:

0. (unit weights, up to :data:`MODEL_MAX_K` clusters) *model passes*: each counts the rows of
   each cluster and bins every row's margin to every other cluster; a small linear program over
   the bins (:mod:`dkmeans.drivers.price_model`) moves the prices, pass after pass, until a few
   rows are left off the caps; the exact moves over exchange lists (``_certify``) take those and
   certify the assignment (at once, without model passes, where the previous assignment began
   at most :data:`EXACT_FIRST_AT` rows off the caps: late Lloyd iterations, whose centroids move
   little), mostly in the pass that lists the moves
   (:func:`~dkmeans.kernels.exchange.list_certificate`). Where this ends without a certificate,
   the auction below runs;
1. every pass counts the rows of each cluster under the current prices and, for the clusters
   found over (under) their cap in the previous pass, reports the smallest price rises (cuts)
   at which one of their rows would leave (join);
2. an over-full cluster raises its price by the margin of the row that brings it exactly to its
   cap; once none is over-full, an under-full cluster lowers its price likewise. Raises only
   move rows out of the cluster that raised, cuts only into the one that cut, so no step breaks
   a cap another step met;
3. the rounds end when every size is within its caps: the pass that shows it gives the Lloyd
   partials too. The prices are then optimal duals when complementary slackness holds (a
   cluster with a positive price is full, one with a negative price at its floor). Prices carry
   over from one Lloyd iteration to the next; where the carried prices end without slackness
   the rounds restart from zero prices, where the auction's rises are optimal.

A pass moves at most :data:`MOVES_PER_PASS` rows in all (split between the clusters): the
data shipped per pass stays small whatever n.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
from dataclasses import dataclass, field

import numpy as np

from dkmeans.drivers.price_model import model_price_changes
from dkmeans.errors import InvalidDataError
from dkmeans.kernels.capacitated import (
    TIE_BITS,
    PricePartials,
    RepairAsk,
    combine_price_partials,
    cost_cache,
    exchange_flow,
    exchange_flow_compiled,
    exchange_index,
    exchange_row_costs,
    margin_edges,
    max_sq_distance,
    price_partials,
    priced_label_objective,
    take_moves,
)
from dkmeans.kernels.common import Partials
from dkmeans.kernels.exchange import CERTIFIED, MOVED, list_certificate
from dkmeans.kernels.nearest import cluster_sums

logger = logging.getLogger("dkmeans")

#: Rows' moves reported per pass, over all clusters (each at least 64).
MOVES_PER_PASS = 1 << 18
#: Passes without a smaller gap to the caps after which the auction hands over to the repair.
STALL_PASSES = 3
#: Price passes of one assignment at most before the repair takes the rows left over ...
AUCTION_PASSES = 12
#: ... above :data:`EXACT_MAX_K` clusters, where the auction rarely meets the caps and its later
#: passes leave the repair no better a start (benchmarks/balanced.py --case ivf, k = 1,024, the
#: repair's 4 alternatives: 12 passes 198 s, objective 160,395; 4 passes 167 s, 156,838).
AUCTION_PASSES_ABOVE_EXACT = 4
#: Rounds that move prices toward optimality once the sizes are within their caps, at most.
REPAIR_ROUNDS = 20
#: Passes of the final repair at most (each moves rows; the repair ends in a few).
FIX_PASSES = 50
#: Clusters with room a repair pass reports per row of an over-full cluster (cheapest first): the
#: caller moves a row to the next where the first filled up in that pass.
REPAIR_ALTERNATIVES = 4
#: A capped Lloyd iteration counts as progress where its objective is lower than the previous
#: assignment's at the new centroids by more than this share (the rounding of the float64 sums);
#: otherwise the exact solve decides, and where it is no lower either the loop has settled.
STOP_RTOL = 1e-9
#: Uncertified assignments in a row no cheaper than the previous one after which the loop stops.
STOP_PATIENCE = 3
#: Bits of the integer squared distances (their largest about ``2**QUANTUM_BITS``).
QUANTUM_BITS = 44
#: Moves of the exact solve's exchange lists per pass, over all pairs of clusters (each pair at
#: least one, at most :data:`EXCHANGE_PER_PAIR`).
EXCHANGE_MOVES = 1 << 16
EXCHANGE_PER_PAIR = 64
#: The exact solve from the last optimal prices hands over to the auction where the first pass's
#: rows over and under the caps are more than this share of its exchange lists' moves.
BAIL_SHARE = 4
#: Clusters above which no assignment is certified (the caller's shortest paths grow as k^3 a
#: move, the exchange lists as k^2): the auction and the repair alone, as for weighted rows.
EXACT_MAX_K = 128
#: Passes of the exact solve's moves over exchange lists at most.
CERTIFY_PASSES = 200
#: Cycles and paths of the caller's moves over one pass's exchange lists at most.
EXCHANGE_STEPS = 1 << 20
#: Clusters above which the exact solve takes no model passes (a pass's histogram holds ``k^2``
#: pairs' bins: 8 MiB of scratch a chunk at 64).
MODEL_MAX_K = 64
#: Model passes of one assignment at most (benchmarks/balanced_phases.py, 2,000,000 x 16, k = 32:
#: the largest gap, 122,788 rows off the caps, then 34,832, 12,888, 5,632, 1,248, 292, 36).
MODEL_PASSES = 16
#: A model pass must leave at most this share of the previous pass's rows off the caps.
MODEL_SHRINK = 0.75
#: A model pass counts one row in ``2**s`` in its histogram, the largest such share that keeps
#: this many counted rows per row off the caps (the gap's bins need counts, not every row: at
#: 2,000,000 rows, k = 32, a late assignment's first pass counts one row in 4: 33.5 -> 31.4 s;
#: 128 rows a gap row, one in 32, took twice the passes).
MODEL_ROWS_PER_GAP = 1024
#: Rows over and under the caps at which the model hands over to the exact moves.
MODEL_HANDOFF = 256
#: A model pass after the first counts the margins up to this many times the last step's largest
#: price change, and its step stays within half of that (most margins are far larger than a late
#: step: their bins cost scattered adds and the program's size).
MODEL_LIMIT_GROWTH = 8.0
#: An assignment whose previous one began at most this many rows off the caps starts with the
#: exact moves, skipping the model passes (2,000,000 x 16, k = 32, balanced, against 256 rows:
#: 17.5 -> 15.5 s; from 2,048 rows 16.1 s, and from 8,192 21 to 36 passes) ...
EXACT_FIRST_AT = 1024
#: ... where the caller's moves are compiled (with the NumPy code, 500 to 700 rows took seconds a
#: pass at 20,000 rows: from at most :data:`MODEL_HANDOFF` rows there, where the model would hand
#: over at once) ...
EXACT_FIRST_AT_NUMPY = MODEL_HANDOFF
#: ... and turns to model passes where their first pass finds more than this many times as many
#: rows off the caps.
EXACT_FIRST_BAIL = 4


@dataclass(frozen=True)
class Certified:
    """What :meth:`CapacitatedPasses._certify` ended with."""

    #: the last pass's partials (None where the exact moves gave up: see ``_certify``)
    part: PricePartials | None
    #: the rows moved off their priced labels, ``(rows, labels)``, or None
    overrides: tuple | None
    #: the passes it took
    passes: int
    #: optimal prices, where a pass certified the assignment, else None
    duals: np.ndarray | None
    #: the rows over and under the caps at its first pass (None where it made none)
    first_gap: float | None


class CapacityError(InvalidDataError):
    """The capacitated assignment's prices did not settle (rows tied between clusters in numbers)."""


@dataclass(frozen=True)
class Capacity:
    """Resolved size caps: every cluster's weighted size within ``[lower, upper]``."""

    lower: float
    upper: float
    #: the rows' count (weighted: their weights' sum) the caps were resolved against, if known
    total: float | None = field(default=None, compare=False)

    def __post_init__(self):
        if self.lower > self.upper:
            raise ValueError(f"lower cap {self.lower} above upper cap {self.upper}")


def _chunk(
    X,
    w,
    offset,
    C,
    P,
    Q,
    q,
    shed_wanted,
    enter_wanted,
    exit_from=None,
    exit_to=None,
    exit_wanted=0,
    overrides=None,
    repair=None,
    exchange=0,
    histogram=0,
    margin_limit=math.inf,
):
    return price_partials(
        X,
        w,
        offset,
        C,
        P,
        Q,
        q,
        shed_wanted,
        enter_wanted,
        exit_from,
        exit_to,
        exit_wanted,
        overrides,
        repair,
        exchange=exchange,
        histogram=histogram,
        margin_limit=margin_limit,
    )


def _cached_chunk(X, w, offset, cache, C, P, Q, q, *rest):
    """:func:`_chunk` with the chunk's integer costs kept between the passes of one assignment
    (built again where the centroids or the quantum changed)."""
    tag = _digest(C, q)
    if cache is None or cache.tag != tag:
        cache = cost_cache(X, C, q, offset, tag, reuse=cache)
    exchange = rest[7] if len(rest) > 7 else 0
    histogram = rest[8] if len(rest) > 8 else 0
    margin_limit = rest[9] if len(rest) > 9 else math.inf
    return cache, price_partials(
        X,
        w,
        offset,
        C,
        P,
        Q,
        q,
        *rest[:7],
        cache=cache,
        exchange=exchange,
        histogram=histogram,
        margin_limit=margin_limit,
    )


def _max_sq_chunk(X, w, offset, C):
    return max_sq_distance(X, C)


def _max_of(parts) -> float:
    return max((float(p) for p in parts if p is not None), default=0.0)


def _digest(C, q: float) -> bytes:
    C = np.ascontiguousarray(C, dtype=np.float64)
    return hashlib.blake2b(
        C.tobytes() + np.float64(q).tobytes() + repr(C.shape).encode(), digest_size=16
    ).digest()


def _labels_chunk(X, w, offset, C, P, Q, q, overrides=None):
    labels, per = priced_label_objective(X, w, offset, C, P, Q, q, overrides)
    return [(offset, labels)], per


def _sums_chunk(X, w, offset, C, P, Q, q, overrides=None):
    return priced_label_objective(X, w, offset, C, P, Q, q, overrides)[1]


def _sum_arrays(parts):
    return np.sum([p for p in parts if p is not None], axis=0)


def _combine_labels(parts):
    parts = [p for p in parts if p is not None]
    return [piece for p in parts for piece in p[0]], np.sum([p[1] for p in parts], axis=0)


@dataclass
class CapacitatedPasses:
    """The Lloyd passes of size-capped k-means: each iteration's partials under solved prices.

    Used by :func:`dkmeans.drivers.lloyd.lloyd_iterations` in place of its plain passes
    (same ``begin``/``partials``/``end``). ``passes_per_solve`` records the passes each
    assignment took (the partials included).
    """

    capacity: Capacity
    quantum: float | None = None
    prices: tuple | None = None
    passes_per_solve: list = field(default_factory=list)
    #: the last assignment's rows moved by the final repair: ``(rows, labels)`` or None
    overrides: tuple | None = None
    #: per assignment, the rows the final repair moved (0: the prices alone met the caps)
    repaired_per_solve: list = field(default_factory=list)
    #: the last assignment's objective and the dual lower bound on the optimal transport's
    bounds: tuple | None = None

    #: per chunk, the integer costs of the current centroids (:class:`~dkmeans.kernels.capacitated.
    #: CostCache`), kept where the chunks are during one block of iterations; None: none kept
    state: object = None
    #: whether the passes keep the costs (in-memory data with room for ``8 k`` bytes a row)
    keep: bool | None = None
    #: per assignment, whether it is certified optimal (no negative cycle in the exchange graph,
    #: or optimal prices alone); None: not checked (a cheap Lloyd iteration, weighted rows)
    certified_per_solve: list = field(default_factory=list)
    #: the Lloyd loop's assignments proved no cheaper than the previous one: the loop stops
    settled: bool = False
    _misses: int = field(default=0, repr=False)
    #: the last accepted Lloyd assignment: its centroids (float64) and partials
    _previous: tuple | None = field(default=None, repr=False)
    #: prices the next assignment starts from (the last certified assignment's optimal duals)
    _warm: tuple | None = field(default=None, repr=False)
    #: prices handed over by :meth:`seed` with their quantum, for the next assignment
    _seeded: tuple | None = field(default=None, repr=False)
    #: rows off the caps at the last assignment's first model pass (its histogram's sampling)
    _model_gap: float = field(default=0.0, repr=False)
    #: the margins the next assignment's first model pass counts: MODEL_LIMIT_GROWTH times the
    #: largest price change of the last assignment's model (inf: every margin)
    _model_reach: float = field(default=math.inf, repr=False)
    #: rows off the caps at the last assignment's first pass, of any kind (how it starts)
    _opening_gap: float = field(default=math.inf, repr=False)
    #: a model pass found rows of unequal weights (no model passes, no exact moves for them)
    _weighted: bool = field(default=False, repr=False)

    def __getstate__(self):
        out = dict(self.__dict__)
        out["state"] = None  # the costs stay where the chunks are
        return out

    def adopt(self, other: CapacitatedPasses) -> None:
        """Take what a block run elsewhere (a task, an SPMD rank) left in its copy of these passes:
        the passes and certificates of its assignments, the prices the next starts from."""
        if other is not self:
            self.__dict__.update(other.__getstate__())
            self.state = None

    def begin(self, data, iterations: int | None = None) -> None:
        """Keep the chunks' costs between passes where the data stays in memory and has room."""
        self.keep = None  # decided at the first pass, which knows k
        self._previous, self.settled, self._misses = None, False, 0  # a new block: a first solve

    def end(self, data) -> None:
        """Keep the chunks' costs past the block: the next block's first pass, and the final
        assignment's, build their costs into the same arrays (a fresh array's first touch costs
        more than the build into it: ``benchmarks/balanced_costs.py``). They go with these
        passes, at the end of the fit."""

    def _pass(self, data, combine, args):
        """One pass of :func:`_chunk` (the costs kept per chunk where :meth:`begin` allowed it)."""
        if self.keep is None:
            per_row = 8.0 * (len(args[0]) + 1)
            in_memory = bool(getattr(data, "in_memory", False))
            self.keep = in_memory and data.row_state_bytes() >= per_row
        if self.keep and args[3]:  # q 0: the scale's pass, no costs to keep
            out, self.state = data.map_reduce_stateful(_cached_chunk, combine, args, self.state)
            return out
        return data.map_reduce(_chunk, combine, args)

    def _plain_pass(self, data, C, P, Q, q, overrides, ask=None, exchange: int = 0):
        """A pass at prices ``P`` asking for no shed or entry margins: the labels with
        ``overrides``, and the repair's moves (``ask``) or the exchange lists (``exchange``
        moves per pair)."""
        none = _Requests.none(len(C))
        combine = functools.partial(
            combine_price_partials,
            shed_wanted=none.shed,
            enter_wanted=none.enter,
            repair=ask,
            exchange=exchange,
        )
        return self._pass(data, combine, (C, P, Q, q) + none.args() + (overrides, ask, exchange))

    def partials(self, data, C: np.ndarray):
        """The :class:`~dkmeans.kernels.common.Partials` of a Lloyd iteration's capped assignment to
        ``C``, and 1.0 (every distance computed).

        Each assignment is the exact one (:meth:`solve`): from the previous one's optimal prices,
        a pass's priced labels and exchange lists, the caller's moves over those lists, and a pass
        that certifies the result (two or three passes where the centroids moved little). Where it
        is not cheaper than the previous assignment at ``C`` (computed from that one's sums) by more
        than :data:`STOP_RTOL`, :attr:`settled` is set: the loop stops on these centroids. The
        passes of the iteration are one entry of :attr:`passes_per_solve`.
        """
        C = np.asarray(C)
        C64 = C.astype(np.float64)
        previous, self._previous = self._previous, None
        part, passes, certified = self._solve(data, C, exact=True)
        if previous is not None:
            bound = _objective_at(previous[1], previous[0], C64)
            worse = float(part.partials.objective) > bound - STOP_RTOL * abs(bound)
            # certified: nothing cheaper exists, the loop has settled; otherwise (weighted rows,
            # k above EXACT_MAX_K) a few tries, the loop keeping its best iterate
            self._misses = self._misses + 1 if worse else 0
            self.settled = worse if certified else self._misses >= STOP_PATIENCE
        self.passes_per_solve.append(passes)
        self.certified_per_solve.append(certified)
        self._previous = (C64, part.partials)
        return part.partials, 1.0

    def _scale(self, data, C) -> float:
        """The quantum: a power of two about ``2**-QUANTUM_BITS`` of four times the largest squared
        distance (centroids stay in the rows' hull, within a factor 4 of it), fixed for the fit."""
        if self.quantum is None:
            top = 4.0 * data.map_reduce(_max_sq_chunk, _max_of, (C,))
            self.quantum = 2.0 ** (math.ceil(math.log2(top)) - QUANTUM_BITS) if top > 0 else 1.0
        return self.quantum

    def solve(self, data, C: np.ndarray, exact: bool = True) -> PricePartials:
        """The capacitated assignment to ``C``: the last pass's :class:`PricePartials`.

        Prices are moved until every size is within the caps (from the previous assignment's
        prices where it has some; where those end without complementary slackness, again from
        zero prices), the repair moves the rows they leave over or under, and (``exact``, rows
        of unit weight) the cycle cancelling over exchange lists makes the assignment optimal:
        equal in cost to the optimal transport of ``C`` (integer costs of the quantum).
        """
        part, passes, certified = self._solve(data, C, exact)
        self.passes_per_solve.append(passes)
        self.certified_per_solve.append(certified)
        return part

    def seed(self, P, quantum: float) -> None:
        """Start the next assignment from prices ``P`` of another problem's quantum ``quantum``
        (a sample's, :func:`~dkmeans.drivers.capped_start.capped_start`): rescaled to this one's
        quantum once it is known. Only a start: the assignment is solved (and certified) as any."""
        self._seeded = (np.array(P, dtype=np.float64), float(quantum))
        # the other problem's gaps and price changes say nothing of this one's
        self._opening_gap, self._model_reach = math.inf, math.inf

    def warm_prices(self) -> tuple | None:
        """The prices the next assignment would start from (the last optimal ones, else the last
        ones found), or None."""
        prices = self._warm if self._warm is not None else self.prices
        return None if prices is None else tuple(np.array(p, np.float64) for p in prices)

    def _solve(self, data, C: np.ndarray, exact: bool):
        """:meth:`solve`'s work: the last pass, the passes, whether it is certified optimal."""
        k = len(C)
        q = self._scale(data, C)
        if self._seeded is not None:  # prices of another quantum: in this one's integers
            P, q_seed = self._seeded
            self._seeded = None
            if P.shape == (k,) and np.all(np.isfinite(P)):
                self._warm = (np.rint((P - P.min()) * (q_seed / q)), np.zeros(k))
        passes = 0
        if exact and 2 <= k <= MODEL_MAX_K and not self._weighted:
            # model passes close the gap, exact moves take the rest
            start = self._warm if self._warm is not None else self.prices
            P, Q = (
                (np.array(p, dtype=np.float64) for p in start)
                if start is not None
                else (np.zeros(k), np.zeros(k))
            )
            first_at = EXACT_FIRST_AT if exchange_flow_compiled() else EXACT_FIRST_AT_NUMPY
            if self._warm is not None and self._opening_gap <= first_at:
                # the last assignment began a few rows off the caps: the exact moves at once,
                # the model only where they bail
                bail = EXACT_FIRST_BAIL * first_at
                done = self._certify(data, C, q, P, Q, None, CERTIFY_PASSES, bail=bail)
                passes += done.passes
                if done.first_gap is not None:
                    self._opening_gap = done.first_gap
                if done.duals is not None:
                    return (
                        self._certified(done.part, P, Q, done.overrides, done.duals),
                        passes,
                        True,
                    )
            part, more = self._model(data, C, q, P, Q)
            passes += more
            if part is not None and self.optimal(P, part.partials.counts):
                return self._certified(part, P, Q, None, P.copy()), passes, True
            if part is not None:
                done = self._certify(data, C, q, P, Q, None, CERTIFY_PASSES, bail=math.inf)
                passes += done.passes
                if done.duals is not None:
                    return (
                        self._certified(done.part, P, Q, done.overrides, done.duals),
                        passes,
                        True,
                    )
        elif exact and self._warm is not None:  # the last optimal prices: moves over exchange lists
            P, Q = (np.array(p, dtype=np.float64) for p in self._warm)
            done = self._certify(data, C, q, P, Q, None, CERTIFY_PASSES, bail=math.inf)
            passes += done.passes
            if done.duals is not None:
                return self._certified(done.part, P, Q, done.overrides, done.duals), passes, True
        start = self._warm if self._warm is not None else self.prices
        warm = start is not None
        P, Q = (
            (np.array(p, dtype=np.float64) for p in start) if warm else (np.zeros(k), np.zeros(k))
        )
        part, more = self._auction(data, C, q, P, Q)
        passes += more
        if warm and part is not None and not self.optimal(P, part.partials.counts):
            P0, Q0 = np.zeros(k), np.zeros(k)
            cold, more = self._auction(data, C, q, P0, Q0)
            passes += more
            if cold is not None:
                part, P, Q = cold, P0, Q0
        moved = None
        if (
            part is None
        ):  # the prices left a few rows over (under) their caps: the repair moves them
            part, moved, more = self._repair(data, C, q, P, Q)
            passes += more
        self.repaired_per_solve.append(0 if moved is None else int(moved[0].shape[0]))
        self.bounds = (float(part.partials.objective), self.dual_bound(part, P))
        self.prices, self.overrides, self._warm = (P, Q), moved, None
        certified = None
        if moved is None and self.optimal(P, part.partials.counts):
            certified = True  # optimal prices alone: complementary slackness
            self._warm = (P.copy(), Q.copy())
        elif exact:
            cancelled = self._certify(data, C, q, P, Q, moved, CERTIFY_PASSES)
            passes += cancelled.passes
            if cancelled.part is not None:
                part, moved, duals = cancelled.part, cancelled.overrides, cancelled.duals
                self.overrides, certified = moved, duals is not None
                if duals is not None:
                    self._warm = (duals, Q.copy())
                    self.bounds = (float(part.partials.objective), float(part.partials.objective))
        return part, passes, certified

    def _certified(self, part, P, Q, moved, duals):
        """Keep a certified assignment (prices ``P``, ``Q`` with the ``moved`` overrides): its
        bounds (the objective is the optimum), and ``duals`` as the next assignment's start."""
        self.prices, self.overrides, self._warm = (P, Q), moved, (duals, Q.copy())
        self.repaired_per_solve.append(0 if moved is None else int(moved[0].shape[0]))
        self.bounds = (float(part.partials.objective),) * 2
        return part

    def _model(self, data, C, q: float, P, Q):
        """Model passes from prices ``P`` (changed in place): each reports the sizes and the margin
        histogram, from which :func:`~dkmeans.drivers.price_model.model_price_changes` moves the
        prices, until the rows over and under the caps are at most :data:`MODEL_HANDOFF`, a pass
        leaves more than :data:`MODEL_SHRINK` of the last one's, or :data:`MODEL_PASSES` passes
        ran. ``P`` ends at the prices of the smallest gap measured.

        Returns ``(part, passes)``: the pass at the final prices, or None where the rows are
        weighted (the exact moves need unit weights: the auction takes such rows) or the model
        found no prices.

        The first pass counts the margins up to :attr:`_model_reach` (the last assignment's
        model moved its prices by at most an eighth of it: this one's centroids moved less), the
        later ones up to :data:`MODEL_LIMIT_GROWTH` times the last step; a step held at its limit
        is followed by one with twice the room.
        """
        start = P.copy()
        out = self._model_passes(data, C, q, P, Q, self._model_reach)
        spread = float(np.ptp(P - start))  # prices matter up to a common shift
        if spread > 0:
            self._model_reach = MODEL_LIMIT_GROWTH * spread
        return out

    def _model_passes(self, data, C, q: float, P, Q, limit: float):
        """:meth:`_model`'s passes, the first counting the margins up to ``limit``."""
        k = len(C)
        lower, upper = self.capacity.lower, self.capacity.upper
        none = _Requests.none(k)
        combine = functools.partial(
            combine_price_partials,
            shed_wanted=none.shed,
            enter_wanted=none.enter,
            histogram=1,
        )
        edges = margin_edges()
        best = None  # (gap, part, P)
        passes = 0
        gap = self._model_gap  # the last assignment's first gap: this one's likely scale
        held = False  # the last step was held at its limit (its pass may close little)
        for passes in range(1, MODEL_PASSES + 1):
            bits = int(math.log2(max(1.0, gap / MODEL_ROWS_PER_GAP)))
            args = (C, P, Q, q) + none.args() + (None, None, 0, 1 + bits, limit)
            part = self._pass(data, combine, args)
            sizes = part.partials.counts
            if not np.all(part.rows == sizes):
                self._weighted = True  # the next assignments go to the auction at once
                return None, passes
            gap = float(np.sum(np.maximum(sizes - upper, 0) + np.maximum(lower - sizes, 0)))
            if passes == 1:
                self._model_gap = self._opening_gap = gap
            logger.debug("size caps: model pass %d, %d rows off the caps", passes, gap)
            if best is not None and gap > best[0] * MODEL_SHRINK and not held:  # stalled
                if gap >= best[0]:  # the best pass's partials are those of its prices
                    part, P[:] = best[1], best[2]
                return part, passes
            best = (gap, part, P.copy())
            if gap <= MODEL_HANDOFF:
                return part, passes
            hist = part.histogram
            pi = model_price_changes(hist.index, hist.count, sizes, lower, upper, edges, limit / 2)
            if pi is None:
                return part, passes
            step = float(np.abs(pi).max())
            # the next step's room: MODEL_LIMIT_GROWTH times this one's (steps shrink with the
            # gap), more where this one was held at its limit
            held = 2 * step >= 0.99 * limit
            limit = MODEL_LIMIT_GROWTH * max(step, 1.0) * (2.0 if held else 1.0)
            P += np.rint(pi)
            P -= P.min()
        part, P[:] = best[1], best[2]  # the last change untried: the best measured prices
        return part, passes

    def _certify(
        self, data, C, q: float, P, Q, overrides, limit: int, bail: float | None = None
    ) -> Certified:
        """Moves over exchange lists until the assignment is an optimal transport of ``C`` (integer
        costs), certified by a pass that finds nothing to move.

        The assignment (priced labels at ``P``, ``Q`` with ``overrides``) need not be within the
        caps. Each pass reports every pair of clusters' cheapest moves
        (:func:`~dkmeans.kernels.capacitated.exchange_moves`); the caller
        (:func:`~dkmeans.kernels.exchange.exchange_flow`) pushes the rows of over-full (under-floor)
        clusters along the cheapest paths of moves to clusters with room (from donors) and cancels
        negative cycles, until the sizes are within the caps and the lists hold no negative cycle,
        or a list runs out; the next pass, with the moves as overrides, looks again. A pass that
        moves nothing certifies the assignment, and gives optimal prices (the shortest distances
        of the exchange graph, negated).

        Returns a :class:`Certified`: its ``duals`` None where ``limit`` passes did not end in a
        certificate, its ``part`` None too where ``k`` is above :data:`EXACT_MAX_K`, rows are
        weighted (moves of rows of unequal weights change the sizes unequally: no such
        certificate), the lists left no path, or (``bail`` given) the first pass's sizes are
        further from the caps than a few passes' lists can move, or than ``bail`` rows: the
        prices are then the model's or the auction's to move.
        """
        k = len(C)
        if k < 2 or k > EXACT_MAX_K:
            return Certified(None, overrides, 0, None, None)
        lower, upper = self.capacity.lower, self.capacity.upper
        m = int(min(EXCHANGE_PER_PAIR, max(1, EXCHANGE_MOVES // (k * (k - 1)))))
        moved: dict[int, int] = {}
        if overrides is not None:
            moved.update(zip(overrides[0].tolist(), overrides[1].tolist()))
        part, first_gap = None, None
        for passes in range(1, limit + 1):
            part = self._plain_pass(data, C, P, Q, q, overrides, exchange=m)
            ex, sizes = part.exchange, part.partials.counts
            if not (np.all(ex.weight == 1.0) and np.all(part.rows == sizes)):
                return Certified(None, overrides, passes, None, first_gap)
            gap = float(np.sum(np.maximum(sizes - upper, 0) + np.maximum(lower - sizes, 0)))
            if passes == 1:
                first_gap = gap
                if bail is not None and (gap * BAIL_SHARE > ex.row.shape[0] or gap > bail):
                    return Certified(None, overrides, passes, None, first_gap)
            found, duals, outcome, proved = exchange_moves_of(ex, sizes, lower, upper, k, m)
            if outcome == CERTIFIED:
                return Certified(part, overrides, passes, duals, first_gap)
            if not found:  # no path among the lists (not expected: every pair has a list)
                return Certified(None, overrides, passes, None, first_gap)
            moved.update((row, to) for row, (_, to) in found.items())
            rows = np.array(sorted(moved), dtype=np.int64)
            overrides = (rows, np.array([moved[r] for r in rows], dtype=np.int32))
            if proved:  # optimal already: the moved rows' partials here, no pass to confirm
                part = _moved_partials(part, data, C, found)
                return Certified(part, overrides, passes, duals, first_gap)
        logger.debug("size caps: the exchange moves stopped after %d passes", limit)
        return Certified(part, overrides, limit, None, first_gap)

    def dual_bound(self, part: PricePartials, P) -> float:
        """A lower bound on the optimal transport's objective: the Lagrangian dual at prices ``P``
        (weak duality; exact up to the quantum's rounding, ``n q / 2``)."""
        lower, upper = self.capacity.lower, self.capacity.upper
        caps = np.where(P > 0, P * upper, P * lower)
        return float((part.dual - caps.sum()) * self.quantum)

    def _repair(self, data, C, q: float, P, Q):
        """Move the rows left over the caps (under the floors) to the clusters with room (below their
        floors), the cheapest moves first: by the extra squared distance, then global row index.

        Over-full clusters shed first (each row to its nearest cluster with room), then under-full
        ones take rows from clusters above their floor. The moves are kept as ``(rows, labels)``
        overrides of the priced labels. Returns the last pass's partials, the overrides and the
        passes.
        """
        lower, upper = self.capacity.lower, self.capacity.upper
        moved: dict[int, int] = {}
        ask = None
        overrides = None
        need, asked_need = 0.0, -1.0  # the heaviest candidate row seen, and the asks' one
        for passes in range(1, FIX_PASSES + 1):
            part = self._plain_pass(data, C, P, Q, q, overrides, ask=ask)
            sizes = part.partials.counts.astype(np.float64).copy()
            slack = _slack(sizes)
            over, under = sizes - upper > slack, lower - sizes > slack
            if not (over.any() or under.any()):
                return part, overrides, passes
            mean_weight = np.where(
                part.rows > 0, part.partials.counts / np.maximum(part.rows, 1), 1.0
            )
            need = max(need, float(mean_weight.max()))
            if ask is not None:
                if part.moves.row.shape[0]:
                    need = max(need, float(part.moves.weight.max()))
                if not _apply_moves(part.moves, ask.shed, sizes, lower, upper, slack, moved):
                    if asked_need >= need:
                        break  # the clusters asked for could take (give) the heaviest rows
                    # the targets' room was too small for the rows: ask again for room for them
                rows = np.array(sorted(moved), dtype=np.int64)
                overrides = (
                    (rows, np.array([moved[r] for r in rows], dtype=np.int32))
                    if rows.shape[0]
                    else overrides
                )
                over, under = sizes - upper > slack, lower - sizes > slack
            asked_need = need
            if over.any():
                room = _fits(sizes < upper - slack, upper - sizes >= need - slack)
                gap = np.where(over, sizes - upper, 0.0)
                wanted = _repair_wanted(gap, mean_weight) * REPAIR_ALTERNATIVES
                ask = RepairAsk(True, over, room, wanted, REPAIR_ALTERNATIVES)
            elif under.any():
                donors = _fits(sizes > lower + slack, sizes - lower >= need - slack)
                gap = np.where(under, lower - sizes, 0.0)
                ask = RepairAsk(False, donors, under, _repair_wanted(gap, mean_weight))
            else:
                ask = None
        raise CapacityError(
            f"the size caps' repair did not settle in {passes} passes (sizes "
            f"{np.round(sizes).astype(np.int64).tolist()} against caps [{lower:g}, {upper:g}]): "
            "no move of a single row brings a cluster within its caps (weighted rows whose weights "
            "do not fit the caps' room)"
        )

    def optimal(self, P, sizes) -> bool:
        """Whether prices ``P`` are optimal duals for ``sizes`` (feasible sizes, complementary slackness)."""
        lower, upper = self.capacity.lower, self.capacity.upper
        slack = _slack(sizes)
        if np.any(sizes > upper + slack) or np.any(sizes < lower - slack):
            return False
        below_cap, above_floor = P[sizes < upper - slack], P[sizes > lower + slack]
        # prices matter up to a common shift (the sizes sum to n): one level must separate them
        return not (below_cap.size and above_floor.size and below_cap.max() > above_floor.min())

    def _auction(self, data, C, q: float, P, Q):
        """Rounds of moves (``P``, ``Q`` changed in place) until the sizes are within their caps and the
        prices optimal: over-full clusters raise their prices first (an ascending auction), then
        under-full ones cut theirs, then prices on the wrong side of the common level move toward it.
        Where the last of these do not end in :data:`REPAIR_ROUNDS`, the last sizes within the caps
        are kept (their prices short of optimal)."""
        k = len(C)
        lower, upper = self.capacity.lower, self.capacity.upper
        ask = _Requests.none(k)
        per_cluster = max(64, MOVES_PER_PASS // k)
        previous_gap, repairs, feasible = math.inf, 0, None
        best_gap, best_pass = math.inf, 0
        passes = 0
        limit = AUCTION_PASSES if k <= EXACT_MAX_K else AUCTION_PASSES_ABOVE_EXACT
        for passes in range(1, limit + 1):
            part = self._pass(data, ask.combine(), (C, P, Q, q) + ask.args())
            sizes = part.partials.counts
            slack = _slack(sizes)
            over = sizes - upper > slack
            under = lower - sizes > slack
            mean_weight = np.where(part.rows > 0, sizes / np.maximum(part.rows, 1), 1.0)
            if not (over.any() or under.any()):
                if self.optimal(P, sizes):
                    return part, passes
                feasible = (part, P.copy(), Q.copy())
                repairs += 1
                if repairs > REPAIR_ROUNDS:
                    break
                level = _level(P, sizes, lower, upper, slack)
                high = (P > level) & (
                    sizes < upper - slack
                )  # priced up yet not full: cut toward the level
                low = (P < level) & (
                    sizes > lower + slack
                )  # priced down yet above its floor: raise toward it
                _move(part.enter, upper - sizes, high, P, Q, sign=-1.0, limit=level)
                _move(part.shed, sizes - lower, low, P, Q, sign=1.0, limit=level)
                Q -= Q.min()
                ask = _Requests(
                    _wanted(sizes - lower, low, mean_weight, per_cluster),
                    _wanted(upper - sizes, high, mean_weight, per_cluster),
                )
                previous_gap = math.inf
                continue
            up = bool(over.any())  # this round's direction
            gap = (
                float(np.sum((sizes - upper)[over]))
                if up
                else float(np.sum((lower - sizes)[under]))
            )
            if gap < best_gap:
                best_gap, best_pass = gap, passes
            elif passes - best_pass > STALL_PASSES and feasible is None:
                break  # rows passed around without the gap shrinking: the repair takes the rest
            closed = sizes >= upper - slack if up else sizes > lower + slack
            uniform = (
                ask.exit_from is not None
                and ask.exits_up == up
                and part.exits.cluster.shape[0] > 0
                and np.array_equal(ask.exit_from, closed)
            )
            if up and uniform:  # the closed clusters raise together: rows leave the set
                _move_set(
                    part.exits,
                    float(np.sum(np.maximum(sizes - upper, 0)[closed])),
                    closed,
                    P,
                    Q,
                    1.0,
                )
            elif up:
                _move(part.shed, sizes - upper, over, P, Q, sign=1.0)
            elif uniform:  # the clusters at their floor cut together: rows join the set
                _move_set(
                    part.exits,
                    float(np.sum(np.maximum(lower - sizes, 0)[~closed])),
                    ~closed,
                    P,
                    Q,
                    -1.0,
                )
            else:
                _move(part.enter, lower - sizes, under, P, Q, sign=-1.0)
            Q -= Q.min()  # a common shift of the second prices changes no choice; keeps them small
            # a round of single moves that did not shrink the gap (clusters passing rows between them):
            # the next moves a whole set of clusters alike
            stalled = gap >= previous_gap and not uniform
            previous_gap = gap
            exit_rows = int(
                min(
                    MOVES_PER_PASS,
                    np.ceil(gap / max(float(np.mean(mean_weight)), 1e-300) * 1.25) + 4,
                )
            )
            ask = _Requests(
                _wanted(sizes - upper, over, mean_weight, per_cluster),
                _wanted(lower - sizes, under, mean_weight, per_cluster),
                closed if stalled else None,
                ~closed if stalled else None,
                exit_rows if stalled else 0,
                exits_up=up,
            )
        if feasible is None:
            return None, passes  # sizes still outside the caps: the repair moves the rows left over
        part, P[:], Q[:] = feasible
        logger.debug(
            "size caps: prices within the caps kept after %d repair rounds (not proven optimal)",
            repairs,
        )
        return part, passes

    def sums(self, data, C: np.ndarray) -> np.ndarray:
        """Per cluster ``(objective, size)`` (k, 2) under the prices :meth:`solve` found for ``C``."""
        P, Q = self.prices
        return data.map_reduce(_sums_chunk, _sum_arrays, (C, P, Q, self.quantum, self.overrides))

    def labels(self, data, C: np.ndarray):
        """Labels of the in-memory rows (one array in row order) and per cluster ``(objective, size)``,
        under the prices :meth:`solve` found for ``C``."""
        P, Q = self.prices
        pieces, per = data.map_reduce(
            _labels_chunk, _combine_labels, (C, P, Q, self.quantum, self.overrides)
        )
        pieces.sort(key=lambda piece: piece[0])
        labels = np.concatenate([p[1] for p in pieces]) if pieces else np.empty(0, np.int32)
        return labels, per


@dataclass(frozen=True)
class _Requests:
    """What the next pass reports: moves out of and into clusters, and out of the closed set."""

    shed: np.ndarray
    enter: np.ndarray
    exit_from: np.ndarray | None = None
    exit_to: np.ndarray | None = None
    exits: int = 0
    exits_up: bool = True

    @classmethod
    def none(cls, k: int) -> _Requests:
        return cls(np.zeros(k, dtype=np.int64), np.zeros(k, dtype=np.int64))

    def args(self) -> tuple:
        return (self.shed, self.enter, self.exit_from, self.exit_to, self.exits)

    def combine(self):
        return functools.partial(
            combine_price_partials,
            shed_wanted=self.shed,
            enter_wanted=self.enter,
            exit_wanted=self.exits,
        )


def _fits(some, whole) -> np.ndarray:
    """The clusters with room (to give) for the heaviest row, ``some & whole``, where there are
    any; else those with any room (``some``): a cluster whose room is below a row's weight takes
    no row, so the repair asks for rows to the clusters that can take them."""
    both = some & whole
    return both if both.any() else some


def _repair_wanted(gap, mean_weight) -> np.ndarray:
    """Candidate moves per cluster for the repair: twice the rows of its gap and some, capped."""
    rows = np.ceil(gap / np.maximum(mean_weight, 1e-300) * 2.0) + 8
    return np.where(gap > 0, np.minimum(rows, MOVES_PER_PASS), 0).astype(np.int64)


def _apply_moves(
    moves, shed: bool, sizes, lower: float, upper: float, slack: float, moved: dict
) -> int:
    """Take the candidate ``moves`` (sorted by cost, row, target) greedily: a move is kept while its
    source is over its cap (shed) or above its floor, and its target has room (shed) or is under
    its floor (:func:`~dkmeans.kernels.capacitated.take_moves`). ``sizes`` (float64) and
    ``moved`` (row -> cluster) are updated in place; returns the moves kept."""
    kept = take_moves(moves, shed, sizes, lower, upper, slack)
    moved.update(zip(moves.row[kept].tolist(), moves.target[kept].tolist()))
    return int(kept.shape[0])


def _wanted(gap, mask, mean_weight, per_cluster: int) -> np.ndarray:
    """Moves to report next pass per cluster: the rows the gap takes, with a margin, capped."""
    rows = np.ceil(np.where(mask, gap, 0.0) / np.maximum(mean_weight, 1e-300) * 1.25) + 4
    return np.where(mask, np.minimum(rows, per_cluster), 0).astype(np.int64)


def _move(margins, gap, mask, P, Q, sign: float, limit: float | None = None) -> None:
    """Raise (``sign`` 1) or cut (-1) the prices of the clusters in ``mask`` by the margin that moves
    rows of weight ``gap`` (or all the reported rows, where fewer were reported); ``limit``: a
    primary price stops there (rows whose move needs more stay)."""
    for j in np.flatnonzero(mask):
        sel = margins.cluster == j
        if not sel.any():
            continue  # not asked for in this pass: the next pass reports its moves
        step, second = _step(
            margins.primary[sel], margins.secondary[sel], margins.weight[sel], gap[j]
        )
        if limit is not None and step >= abs(P[j] - limit):
            P[j] = limit  # rows whose margin is below the old price move; the price is at the level
            continue
        P[j] += sign * step
        Q[j] += sign * second


def _move_set(margins, gap: float, members, P, Q, sign: float) -> None:
    """Raise (``sign`` 1) or cut (-1) the prices of all ``members`` alike by the margin that moves rows of
    weight ``gap`` out of (into) the set."""
    if gap <= 0:
        return
    step, second = _step(margins.primary, margins.secondary, margins.weight, gap)
    P[members] += sign * step
    Q[members] += sign * second


def _step(primary, secondary, weight, gap: float):
    """The price change ``(primary, secondary)`` that moves the first rows of the sorted margins
    up to weight ``gap``, strictly between two margins: no row is left exactly tied.

    Rows of equal margins move together: where ``gap`` ends inside such a group, the step stops
    before it (or takes it whole, where it is the first).
    """
    n = primary.shape[0]
    at = min(int(np.searchsorted(np.cumsum(weight), gap * (1 - 1e-12))), n - 1)
    same = (primary == primary[at]) & (secondary == secondary[at])
    lo, hi = int(np.argmax(same)), n - 1 - int(np.argmax(same[::-1]))
    if hi > at:
        at = lo - 1 if lo > 0 else hi
    if (
        at + 1 < n and primary[at + 1] == primary[at]
    ):  # midway to the next margin (an integer where one fits)
        gap_to_next = secondary[at + 1] - secondary[at]
        return primary[at], secondary[at] + (
            np.floor(gap_to_next / 2) if gap_to_next >= 2 else gap_to_next / 2
        )
    # past the next row's margin (unknown, or of a larger primary): a step no other margin is likely to
    # equal, varied with the margin (two moves by one constant would leave two rows equally tied)
    scatter = (int(secondary[at]) * 2654435761 + int(primary[at]) * 40503) % (1 << (TIE_BITS - 16))
    return primary[at], secondary[at] + float((1 << (TIE_BITS - 12)) + scatter)


def _level(P, sizes, lower: float, upper: float, slack: float) -> float:
    """The common level ``t`` of optimal prices: ``P_j > t`` only where cluster ``j`` is full, ``P_j < t``
    only where it is at its floor (the sizes sum to n, so prices matter up to a common shift).

    Where no level separates them, the middle of the conflict (an integer): prices move toward it.
    """
    below_cap = P[sizes < upper - slack]
    above_floor = P[sizes > lower + slack]
    low = below_cap.max() if below_cap.size else -math.inf
    high = above_floor.min() if above_floor.size else math.inf
    if low <= high:
        return low if math.isfinite(low) else (high if math.isfinite(high) else 0.0)
    return float(np.floor((low + high) / 2))


def exchange_moves_of(ex, sizes, lower: float, upper: float, k: int, m: int | None = None):
    """:func:`~dkmeans.kernels.exchange.exchange_flow` on a pass's exchange lists ``ex`` (sorted
    by pair, cost and row): ``(moves, duals, outcome, proved)``, ``moves`` a dict row -> ``(from,
    to)``, ``duals`` optimal prices where the outcome is ``CERTIFIED`` or, with ``m`` (the moves
    asked for a pair), where the moves made are proved optimal from the same lists
    (:func:`~dkmeans.kernels.exchange.list_certificate`: ``proved`` True), else None."""
    starts, ends, rows, group = exchange_index(ex, k)
    used = np.full(rows.shape[0], -1, np.int64)
    duals = np.zeros(k)
    cost = np.ascontiguousarray(ex.cost, dtype=np.float64)
    row_costs = exchange_row_costs(ex, group, rows.shape[0], k)
    sizes = np.asarray(sizes, dtype=np.float64).copy()
    slack = _slack(sizes)
    outcome = exchange_flow(
        starts,
        ends,
        cost,
        group,
        k,
        sizes,
        float(lower),
        float(upper),
        slack,
        used,
        EXCHANGE_STEPS,
        duals,
        row_costs,
    )
    origin = np.empty(rows.shape[0], np.int64)
    origin[group] = ex.source
    hit = np.flatnonzero(used >= 0)
    moves = dict(zip(rows[hit].tolist(), zip(origin[hit].tolist(), used[hit].tolist())))
    if outcome == CERTIFIED:
        return moves, duals, outcome, False
    if outcome == MOVED and m is not None and hit.shape[0]:
        full = (ends - starts) >= m
        proved = list_certificate(
            starts, ends, cost, group, origin, k, sizes, lower, upper, slack, used, row_costs, full
        )
        if proved is not None:
            return moves, proved, outcome, True
    return moves, None, outcome, False


def _moved_partials(part: PricePartials, data, C, found: dict) -> PricePartials:
    """``part`` (a pass's) with the rows of ``found`` (row -> ``(from, to)``) moved: their rows
    fetched (:meth:`~dkmeans.engine.protocol.ChunkedData.rows`), taken out of their clusters'
    sums, sizes and objective and put into their new ones' (unit weights: the exact moves')."""
    rows = np.array(sorted(found), dtype=np.int64)
    source = np.array([found[r][0] for r in rows], dtype=np.int32)
    target = np.array([found[r][1] for r in rows], dtype=np.int32)
    X = np.asarray(data.rows(rows), dtype=np.float64)
    C64 = np.asarray(C, dtype=np.float64)
    k = C64.shape[0]
    into, into_sizes = cluster_sums(X, target, k)
    out_of, out_sizes = cluster_sums(X, source, k)
    sums = np.asarray(part.partials.sums, dtype=np.float64) + (into - out_of)
    shift = into_sizes - out_sizes
    counts = np.asarray(part.partials.counts, dtype=np.float64) + shift
    before, after = X - C64[source], X - C64[target]
    change = float(np.einsum("ij,ij->", after, after) - np.einsum("ij,ij->", before, before))
    objective = np.asarray(float(part.partials.objective) + change, dtype=np.float64)
    return part._replace(
        partials=Partials(sums, counts, objective), rows=np.asarray(part.rows) + shift
    )


def _objective_at(partials, C_old, C_new) -> float:
    """The objective of the assignment of ``partials`` (made for centroids ``C_old``) at ``C_new``:
    ``sum w ||x - c'||^2 = sum w ||x - c||^2 - 2 S . (c' - c) + n (||c'||^2 - ||c||^2)`` per
    cluster, from its sums ``S`` and size ``n`` (float64)."""
    S, n = np.asarray(partials.sums, np.float64), np.asarray(partials.counts, np.float64)
    shift = -2.0 * np.einsum("ij,ij->", S, C_new - C_old)
    norms = np.einsum("ij,ij->i", C_new, C_new) - np.einsum("ij,ij->i", C_old, C_old)
    return float(partials.objective) + float(shift) + float(np.dot(n, norms))


def _slack(sizes) -> float:
    """Tolerance of a size against a cap: rounding of weighted sums (none for unit weights)."""
    return 1e-9 * max(1.0, float(np.sum(sizes))) / max(1, sizes.shape[0])


__all__ = [
    "AUCTION_PASSES",
    "AUCTION_PASSES_ABOVE_EXACT",
    "CERTIFY_PASSES",
    "EXACT_MAX_K",
    "STOP_PATIENCE",
    "STOP_RTOL",
    "Capacity",
    "CapacitatedPasses",
    "CapacityError",
    "FIX_PASSES",
    "REPAIR_ALTERNATIVES",
    "MOVES_PER_PASS",
    "REPAIR_ROUNDS",
]
