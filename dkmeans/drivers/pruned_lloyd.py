"""Lloyd's assignment passes with pruning: per-chunk bounds kept with the rows between passes.

:class:`PrunedPasses` gives :func:`dkmeans.drivers.lloyd.lloyd_iterations` each iteration's
partials. With pruning on, a pass is :func:`dkmeans.kernels.pruned.pruned_partials` through
``data.map_reduce_stateful``: each chunk keeps its rows' labels and distance bounds where the
chunk is (in this process, in the one task, on its SPMD rank, or as futures on its worker),
and the caller passes each centroid's drift since the previous pass. The partials equal the
unpruned kernel's to the bit, so every stop rule, the empty-cluster rule and the history are
unchanged; only the share of distances computed (``distances_computed`` in the history) and
the time differ.

Only data that stays in memory (``data.in_memory``) is pruned: out-of-core and mini-batch
loops keep their passes (rows read again from their source have no per-row state).

**How long the bounds live.** Given ``prune`` as a value, a :class:`PrunedPasses` lives as long as
one block of iterations (one :meth:`run_loop`). A fit makes one per run instead
(:meth:`PrunedPasses.for_run`, passed as ``prune`` to every :func:`~dkmeans.drivers.lloyd.lloyd`
of the run: the Lloyd before the local search, each search's confirmation, the Lloyd after) and
releases it when the run ends (:meth:`PrunedPasses.release`), so the short blocks of a run prune
as one loop: bounds stay valid for any later centroids once each centroid's drift from the
centroids of the last pruned pass is applied, whatever happened between (a confirmation whose
result was rejected included). Between blocks each chunk's bounds stay where the chunk is
(:meth:`~dkmeans.engine.protocol.PrunableData.keep_state`, a capability the driver tests for
by type; data without it rebuilds the bounds in every block): in this process, as futures on the
workers (one graph per pass), or in the registry of the worker that ran the one task or SPMD
rank (:mod:`dkmeans.engine.kept`), tagged with the partition's token and a digest of the
centroids they refer to; a chunk whose bounds are not found (another worker, a rank that
failed) builds them again in its next pass. The bookkeeping the driver decides by (the
centroids of the last pass, the groups, the pauses) is the same on every rank and comes back
with the block's result (:attr:`~dkmeans.drivers.lloyd.LloydResult.pruning`). A resumed fit
builds its bounds again.

``prune``:

* ``True``: every pass pruned (the first of a block, or of a run, builds the bounds: every distance);
* ``"auto"``: pruned where it pays: loops of at least :data:`AUTO_MIN_WORK` multiply-adds a
  pass and :data:`AUTO_MIN_ROW_WORK` a row (``k x d``; below, the compiled kernel is cheaper than
  the bookkeeping), bounds built only in blocks of at least :data:`AUTO_MIN_ITERS` iterations
  (a run's shorter blocks prune only with the bounds the run already kept: see
  :meth:`PrunedPasses.begin`); a chunk whose
  bounds leave more than :func:`plain_share` of its distances to compute (8-22%, by the groups'
  width) takes the unpruned kernel for that pass (and builds its bounds again in the next);
  a pass that still computed more than :func:`off_share` of the distances (25-39%) switches
  pruning off (its bounds no longer used; their arrays kept for the rebuild) for a number of
  passes that doubles each time
  (:data:`AUTO_FIRST_PAUSE`), after which the bounds are built again;
* ``False``: never.

A backend that cannot prune (see :mod:`dkmeans.kernels.pruned`) answers with the unpruned
partials, and pruning stops for the block.
"""

from __future__ import annotations

import hashlib
import math
import uuid

import numpy as np

from dkmeans.engine.protocol import PrunableData
from dkmeans.kernels import assign_partials, combine_partials
from dkmeans.kernels.pruned import centroid_groups, combine_pruned, group_count, pruned_partials

#: ``prune="auto"`` prunes loops of at least this many multiply-adds per pass (rows x centroids x
#: features): below, a pass takes milliseconds and the bookkeeping would be most of it.
AUTO_MIN_WORK = 2**26
#: ``prune="auto"`` prunes loops of at least this many multiply-adds per row (centroids x features).
#: A pruned pass still reads every row (the partials) and its bounds, about 0.1 us a row on one
#: core, and a candidate's distances cost several times the compiled kernel's (BLAS products by
#: group); at 2M x 16, k = 32 the compiled kernel's whole pass took 8 ms per 500k rows, the pruned
#: pass 7 ms with 1% of the distances left, 25 ms with 13%.
AUTO_MIN_ROW_WORK = 2**14
#: ``prune="auto"``: a pruned pass computing more than this share of the distances switches pruning
#: off. Measured on 31k x 128, k = 256 (one core): a pass computing 20% of the distances took 1.4x
#: the unpruned pass, 2.3% took 0.36x, none 0.14x (the partials alone). For groups of many
#: centroids it grows as :func:`plain_share` does (:func:`off_share`).
AUTO_OFF_FRACTION = 0.25
#: ``prune="auto"``: passes without pruning after the first switch-off (doubled at each later one).
AUTO_FIRST_PAUSE = 4
#: ``prune="auto"`` builds bounds in a block of at least this many iterations (a shorter block of a
#: run still prunes with the bounds the run kept: :meth:`PrunedPasses.begin`).
#: Building the bounds cost 1.9x an unpruned pass in one process and 2.2-3.3x on two workers
#: when this was chosen (since, with the streamed build, 1.2-1.4x in one process: see
#: :mod:`dkmeans.kernels.pruned`; not measured again for this choice), which the pruned passes
#: must win back (a local search's confirming Lloyd runs at most 3 iterations, the Lloyd before
#: the searches 5, and right after the seeding the centroids still move far).
AUTO_MIN_ITERS = 8
#: ``prune="auto"``: a chunk whose bounds leave more than this share of its distances to compute
#: takes the unpruned kernel for the pass (scoring that many candidates costs more) and builds
#: its bounds again in the next. The decision costs little: a sample of the rows estimates the
#: share before any per-row work (:data:`~dkmeans.kernels.pruned.NEED_SAMPLE_STRIDE`), and such a
#: pass took 1.03-1.08x the unpruned one. The share is where a pruned pass costs what the
#: unpruned one does, on the slower of the two processors measured (``benchmarks/pruned.py
#: --passes``, one thread, a 62,500 x 128 chunk, k = 256 in 25 groups): on one, passes computing
#: 3.8% and 13% of the distances took 0.63-0.67x and 1.31-1.35x the unpruned pass (1.0x at about
#: 8.5%); on the other 16% took 0.94-0.99x and 27% 1.19-1.22x. That holds for narrow groups (here
#: about 10 centroids each); see :data:`AUTO_PLAIN_ABOVE_WIDE`.
AUTO_PLAIN_ABOVE = 0.08
#: ``prune="auto"``: the share of :data:`AUTO_PLAIN_ABOVE` for groups of many centroids, whose
#: candidates are scored by wider products (a 62,500 x 64 chunk, k = 2,048 in 32 groups): 15.6%,
#: 31% and 39% of the distances took 0.68-0.69x, 1.19-1.21x and 1.45x on one processor (1.0x at
#: about 25%); on the other (a 25,000-row chunk) 24% took 0.60x and 41% 1.01x.
AUTO_PLAIN_ABOVE_WIDE = 0.22
#: Centroids per group (mean) at and below which :data:`AUTO_PLAIN_ABOVE` holds, and at and above
#: which :data:`AUTO_PLAIN_ABOVE_WIDE` does; in between, the share goes from one to the other
#: with the logarithm of the width.
AUTO_PLAIN_WIDTHS = (16, 64)


def _digest(C: np.ndarray, *extra) -> int:
    """A 63-bit digest of the centroids (and ``extra``): the same on every rank for the same bits."""
    h = hashlib.blake2b(np.ascontiguousarray(C).view(np.uint8).ravel(), digest_size=8)
    h.update(repr((C.shape, str(C.dtype)) + extra).encode())
    return int.from_bytes(h.digest(), "little") >> 1


def _partials_chunk(X, w, offset, C):
    return assign_partials(X, C, w)


def _pruned_chunk(X, w, offset, state, C, groups, drift, plain_above):
    return pruned_partials(X, C, state, w, groups, drift, plain_above=plain_above)


def prune_groups(data, k: int) -> int:
    """Groups of centroids for the bounds of a loop over ``data`` (0: pruning has no room).

    :func:`~dkmeans.kernels.pruned.group_count`, with the state within what the data's memory
    budget leaves per row (:meth:`~dkmeans.engine.protocol.ChunkedData.row_state_bytes`).
    """
    if not data.in_memory:
        return 0
    return group_count(k, data.n_features, np.dtype(data.dtype).itemsize, data.row_state_bytes())


def _wide(k: int, n_groups: int) -> float:
    """0 for groups of at most ``AUTO_PLAIN_WIDTHS[0]`` centroids, 1 from ``AUTO_PLAIN_WIDTHS[1]`` on,
    the logarithm of the width in between."""
    lo, hi = AUTO_PLAIN_WIDTHS
    width = k / max(1, n_groups)
    return min(1.0, max(0.0, math.log(width / lo) / math.log(hi / lo)))


def plain_share(k: int, n_groups: int) -> float:
    """``prune="auto"``'s ``plain_above`` for ``k`` centroids in ``n_groups`` groups (see
    :data:`AUTO_PLAIN_ABOVE`, :data:`AUTO_PLAIN_ABOVE_WIDE`, :data:`AUTO_PLAIN_WIDTHS`)."""
    t = _wide(k, n_groups)
    if t <= 0.0 or t >= 1.0:  # (exactly the ends, whatever they are)
        return AUTO_PLAIN_ABOVE if t <= 0.0 else AUTO_PLAIN_ABOVE_WIDE
    return AUTO_PLAIN_ABOVE + t * (AUTO_PLAIN_ABOVE_WIDE - AUTO_PLAIN_ABOVE)


def off_share(k: int, n_groups: int) -> float:
    """``prune="auto"`` switches pruning off after a pass computing more than this share of the
    distances: :data:`AUTO_OFF_FRACTION`, raised for wide groups by as much as :func:`plain_share` is."""
    t = _wide(k, n_groups)
    return (
        AUTO_OFF_FRACTION
        if t <= 0.0
        else AUTO_OFF_FRACTION + t * (AUTO_PLAIN_ABOVE_WIDE - AUTO_PLAIN_ABOVE)
    )


def centroid_drift(new: np.ndarray, old: np.ndarray) -> np.ndarray:
    """Upper bounds on ``||new_j - old_j||`` (float64 from the data-dtype centroids, rounded up)."""
    diff = new.astype(np.float64) - old.astype(np.float64)
    return np.sqrt(np.einsum("ij,ij->i", diff, diff)) * (1.0 + 2.0**-40)


class PrunedPasses:
    """The assignment passes of one block of Lloyd iterations, or of a whole run (see the module docstring).

    Parameters
    ----------
    data : ChunkedData
    prune : {"auto", True, False}
    k : int
        Number of centroids.
    n_groups : int, optional
        Groups of centroids for the bounds (:func:`prune_groups` of the data the loop was
        planned on; 0: no room, no pruning); default: from ``data``.
    iterations : int, optional
        Iterations the block (the run) may run at most (``"auto"`` prunes at least
        :data:`AUTO_MIN_ITERS`).
    run : bool
        Bounds kept between blocks (:meth:`for_run`): :meth:`end` keeps them where the chunks are
        instead of dropping them, and :meth:`release` drops them.
    """

    def __init__(
        self,
        data,
        prune,
        k: int,
        n_groups: int | None = None,
        iterations: int | None = None,
        *,
        run: bool = False,
    ):
        self.mode = prune
        work = float(data.n_rows) * k * data.n_features
        self.n_groups = prune_groups(data, k) if n_groups is None else int(n_groups)
        worth = (
            work >= AUTO_MIN_WORK
            and k * data.n_features >= AUTO_MIN_ROW_WORK
            and (iterations is None or iterations >= AUTO_MIN_ITERS)
        )
        self.on = bool(
            data.in_memory
            and k >= 2
            and data.n_rows > 0
            and self.n_groups > 0
            and (prune is True or (prune == "auto" and worth))
        )
        self.k = k
        self.groups = None
        self.state = None
        self.reference = None  # the centroids the bounds refer to
        self.pause, self.next_pause = 0, AUTO_FIRST_PAUSE
        self.key = f"dkmeans-bounds-{uuid.uuid4().hex[:16]}" if run and self.on else None
        self.build = True  # whether this block may build bounds (a run's: see :meth:`begin`)

    @classmethod
    def for_run(cls, data, prune, k: int, iterations: int | None = None):
        """The passes of a whole run (bounds kept across its Lloyd blocks), or ``prune`` itself where
        nothing is pruned (``False``)."""
        if prune is False or isinstance(prune, PrunedPasses):
            return prune
        return cls(data, prune, k, iterations=iterations, run=True)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["state"] = None  # the bounds stay where the chunks are (:meth:`end`)
        return state

    def _tag(self):
        return (self.groups.token, _digest(self.reference))

    def begin(self, data, iterations: int | None = None) -> None:
        """At a block of ``iterations`` updates' start (where its loop runs): pick up the bounds an
        earlier block of the run kept.

        With ``"auto"`` each block of a run starts with no pause, and builds bounds only where it
        is at least :data:`AUTO_MIN_ITERS` iterations long (as a block of its own would): the short
        blocks of the default fit are the local search's confirmations, which start from centroids
        fitted to a sample and move every centroid far (manyk: with ``prune=True`` both passes of
        every confirmation computed all the distances), and pauses carried over from them kept the
        last block from pruning at all. A short block still prunes with bounds it was given.
        """
        if self.key is None:
            return
        if self.mode == "auto":
            self.pause, self.next_pause = 0, AUTO_FIRST_PAUSE
            self.build = iterations is None or iterations >= AUTO_MIN_ITERS
        if (
            self.on
            and self.reference is not None
            and self.state is None
            and isinstance(data, PrunableData)
        ):
            self.state = data.kept_state(self.key, self._tag())

    def end(self, data) -> None:
        """At a block's end: keep the bounds for the run's next block (:meth:`for_run`), else drop them."""
        if self.key is None:
            self.close()
        elif self.state is not None:
            if self.reference is not None and isinstance(data, PrunableData):
                data.keep_state(self.key, self._tag(), self.state)
            self.state = None

    def adopt(self, other: PrunedPasses) -> None:
        """Take the bookkeeping of this run's passes as a block run elsewhere (a task) left it."""
        if other is not self:
            for name in ("on", "groups", "reference", "pause", "next_pause"):
                setattr(self, name, getattr(other, name))

    def release(self, data) -> None:
        """The run's Lloyd ended: drop its bounds wherever they are kept (no more pruning after)."""
        self.close()
        if self.key is not None and isinstance(data, PrunableData):
            data.drop_state(self.key)
        self.key, self.on = None, False

    def partials(self, data, C: np.ndarray):
        """``(Partials, share of distances computed)`` of the assignment to ``C`` (data dtype)."""
        if not self.on or self.pause > 0 or (self.reference is None and not self.build):
            self.pause = max(0, self.pause - 1)
            return data.map_reduce(_partials_chunk, combine_partials, (C,)), 1.0
        drift = None
        # (decided by what every rank shares: a chunk whose bounds were not found builds them)
        if self.reference is None:  # (chunks still holding stale bounds build into their arrays)
            self.groups = centroid_groups(C, self.n_groups, token=_digest(C, self.n_groups))
        else:
            drift = centroid_drift(C, self.reference)
        plain_above = (
            plain_share(self.k, self.groups.n_groups) if self.mode == "auto" else float("inf")
        )
        out, self.state = data.map_reduce_stateful(
            _pruned_chunk, combine_pruned, (C, self.groups, drift, plain_above), self.state
        )
        self.reference = C
        fraction = out.distances / out.pairs if out.pairs else 1.0
        if not out.pruned:  # a backend that cannot prune: unpruned passes from now on
            self.on = False
            self.close()
        elif (
            self.mode == "auto"
            and drift is not None
            and fraction > off_share(self.k, self.groups.n_groups)
        ):
            # the bounds no longer hold; the chunks keep their arrays for the build after the pause
            # (fresh arrays cost the build their page faults)
            self.reference = None
            self.pause, self.next_pause = self.next_pause, 2 * self.next_pause
        return out.partials, fraction

    def close(self) -> None:
        """Drop the bounds (frees them where the chunks are)."""
        self.state = None
        self.reference = None


__all__ = [
    "AUTO_FIRST_PAUSE",
    "AUTO_MIN_ITERS",
    "AUTO_MIN_ROW_WORK",
    "AUTO_MIN_WORK",
    "AUTO_OFF_FRACTION",
    "AUTO_PLAIN_ABOVE",
    "AUTO_PLAIN_ABOVE_WIDE",
    "AUTO_PLAIN_WIDTHS",
    "PrunedPasses",
    "centroid_drift",
    "off_share",
    "plain_share",
    "prune_groups",
]
