"""Checkpoints of a running fit, so that a killed batch job resumes where it stopped.

A checkpoint is a safe ``.npz`` + JSON file (the model-file format: no pickle, SHA-256
of every array, written to a temporary name and renamed, so a job killed mid-write
leaves the previous checkpoint intact). It holds what the rest of the fit depends on:

* the resolved random seed (so ``random_state=None`` resumes with the same draws),
* which initialisation run (of ``n_init``) is in progress and the best finished run,
* the current centroids, the iteration count, the last objective (the
  objective-decrease rule compares against it) and the per-iteration history,
* a description of the job (data shape and dtype, a fingerprint of the data, the
  parameters), which must match on resume: a checkpoint is never applied to another job.

Lloyd passes are deterministic given the centroids, so a resumed run ends with the same
result as an uninterrupted one. Hartigan rounds are not checkpointed one by one: a fit
that ends with Hartigan resumes from its Lloyd result (or its initial centroids).

A mini-batch fit (phase ``"minibatch"``) saves its :class:`~dkmeans.drivers.state.PassState`
instead: centers and counts, the step count and the early-stopping bookkeeping, every
step's record and, for sequential passes over out-of-core data, the position (pass and
next row) and the rows of the unfinished batch. Its draws are keyed by ``(seed, step)``
and its sequential batches by row index, so it resumes to the uninterrupted result too.

Format version 2 added the mini-batch section; a Lloyd checkpoint, unchanged, is still
written as version 1 (so that an older dkmeans resumes it), and both versions are read.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from dkmeans.drivers.state import (
    FitState,
    LoopState,
    MiniBatchState,
    PassState,
    RunSummary,
    history_dicts,
    history_records,
)
from dkmeans.errors import InvalidDataError
from dkmeans.io.model_file import digest, read_archive, write_archive

logger = logging.getLogger("dkmeans")

FORMAT_NAME = "dkmeans-checkpoint"
#: The version written for a mini-batch state; Lloyd/Hartigan checkpoints are written as version 1.
FORMAT_VERSION = 2
READ_VERSIONS = (1, 2)
#: The arrays of a mini-batch state besides ``centroids``.
_MINIBATCH_ARRAYS = ("counts", "pending", "pending_weights")


class CheckpointError(InvalidDataError):
    """A checkpoint file is damaged, or belongs to another job."""


def data_fingerprint(moments) -> list:
    """A short description of the data from its column moments: mean and variance per column.

    Rounded to 9 significant digits, so that the order in which chunks were combined
    does not matter.
    """
    count = np.maximum(np.asarray(moments.count, dtype=np.float64), 1)
    values = np.concatenate(
        [
            np.asarray(moments.mean, dtype=np.float64).ravel(),
            (np.asarray(moments.m2, dtype=np.float64) / count).ravel(),
        ]
    )
    return [float(f"{v:.9g}") for v in values]


def checkpoint_path(path) -> Path:
    """The file a checkpoint ``path`` names: that file, exactly (no suffix is added)."""
    return Path(path)


def _differences(a: dict, b: dict, prefix: str = "") -> list:
    out = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out += _differences(x, y, f"{prefix}{key}.")
        elif x != y:
            out.append(f"{prefix}{key}")
    return out


def _plain(value):
    return value.item() if isinstance(value, np.generic) else str(value)


class Checkpointer:
    """Reads and writes one job's checkpoint file.

    Parameters
    ----------
    path : str or Path
        The checkpoint file, exactly as named (no suffix is added).
    every : int
        Write after every ``every`` Lloyd iterations or mini-batch steps (and always after
        an initialisation and at the end of each run).
    job : dict
        JSON-serialisable description of the job; a checkpoint whose job differs is refused.
    """

    def __init__(self, path, every: int, job: dict):
        self.path = checkpoint_path(path)
        self.every = int(every)
        # as it reads back from JSON (numpy scalars -> Python, tuples -> lists), for comparison
        self.job = json.loads(json.dumps(job, default=_plain))
        self.writes = 0

    # -- reading --------------------------------------------------------------------
    def exists(self) -> bool:
        return self.path.is_file()

    def load(self) -> FitState:
        """The saved state; :class:`CheckpointError` if damaged or written by another job."""
        arrays, meta = self._read()
        if meta.get("format") != FORMAT_NAME or meta.get("format_version") not in READ_VERSIONS:
            raise CheckpointError(
                f"{self.path}: not a dkmeans checkpoint of format version "
                f"{' or '.join(map(str, READ_VERSIONS))}"
            )
        for name, value in arrays.items():
            if digest(value) != meta["sha256"].get(name):
                raise CheckpointError(
                    f"{self.path}: array {name!r} was altered (checksum mismatch)"
                )
        saved = meta.get("job", {})
        if saved != self.job:
            diff = _differences(saved, self.job)
            raise CheckpointError(
                f"{self.path} was written by another job (differs in: {', '.join(diff)}). "
                "Resume with the same data and parameters, or choose another checkpoint path."
            )
        state = FitState(seed=int(meta["seed"]), run=int(meta["run"]), phase=meta["phase"])
        if "minibatch" in meta:
            state.minibatch = _minibatch_state(arrays, meta["minibatch"])
        elif "centroids" in arrays:
            loop = meta["loop"]
            state.loop = LoopState(
                arrays["centroids"],
                int(loop["n_iter"]),
                loop["previous_objective"],
                history_records(loop["history"]),
            )
        if "best_centroids" in arrays:
            best = meta["best"]
            state.best = RunSummary(
                arrays["best_centroids"],
                best["score"],
                best["n_iter"],
                best["stop_reason"],
                best["converged"],
                history_records(best["history"]),
            )
        logger.info(
            "resuming from checkpoint %s (run %d, %s, %s %d)",
            self.path,
            state.run,
            state.phase,
            *(
                ("step", state.minibatch.run.n_steps)
                if state.minibatch
                else ("iteration", state.loop.n_iter if state.loop else 0)
            ),
        )
        return state

    def _read(self):
        return read_archive(
            self.path,
            set(),
            "checkpoint",
            CheckpointError,
            optional=frozenset({"centroids", "best_centroids", *_MINIBATCH_ARRAYS}),
        )

    def progress(self) -> dict:
        """Where the saved fit stands (``run``, ``phase``, ``n_iter``), without checking the job.

        For monitoring a running job from another process. ``n_iter`` counts Lloyd
        iterations, or mini-batch steps; a mini-batch fit adds ``epoch`` and ``next_row``
        (its position in the current sequential pass).
        """
        _, meta = self._read()
        if "minibatch" in meta:
            mb = meta["minibatch"]
            return {
                "run": int(meta["run"]),
                "phase": meta["phase"],
                "n_iter": int(mb["n_steps"]),
                "epoch": int(mb["epoch"]),
                "next_row": int(mb["next_row"]),
            }
        return {
            "run": int(meta["run"]),
            "phase": meta["phase"],
            "n_iter": int(meta.get("loop", {}).get("n_iter", 0)),
        }

    # -- writing --------------------------------------------------------------------
    def save(self, state: FitState) -> None:
        """Write ``state`` atomically (the previous checkpoint stays whole until the rename)."""
        arrays, meta = (
            {},
            {
                "format": FORMAT_NAME,
                "format_version": FORMAT_VERSION if state.minibatch is not None else 1,
                "job": self.job,
                "seed": str(state.seed),
                "run": state.run,
                "phase": state.phase,
            },
        )
        if state.minibatch is not None:
            mb_arrays, meta["minibatch"] = _minibatch_record(state.minibatch)
            arrays.update(mb_arrays)
        elif state.loop is not None:
            arrays["centroids"] = np.ascontiguousarray(state.loop.centroids)
            meta["loop"] = {
                "n_iter": state.loop.n_iter,
                "previous_objective": state.loop.previous_objective,
                "history": history_dicts(state.loop.history),
            }
        if state.best is not None:
            arrays["best_centroids"] = np.ascontiguousarray(state.best.centroids)
            meta["best"] = {
                "score": state.best.score,
                "n_iter": state.best.n_iter,
                "stop_reason": state.best.stop_reason,
                "converged": state.best.converged,
                "history": history_dicts(state.best.history),
            }
        meta["sha256"] = {name: digest(a) for name, a in arrays.items()}
        write_archive(self.path, arrays, meta)
        self.writes += 1

    def loop_hook(self, state: FitState):
        """An ``on_state`` callback for :func:`dkmeans.drivers.lloyd.lloyd`: saves every ``every`` updates."""

        def save_loop(loop: LoopState) -> None:
            state.phase, state.loop = "lloyd", loop
            if loop.n_iter % self.every == 0:
                self.save(state)

        return save_loop

    def minibatch_hook(self, state: FitState):
        """An ``on_state`` callback for the mini-batch drivers (:mod:`dkmeans.drivers.minibatch`):
        saves each state given.

        The drivers decide when (every ``every`` steps, and at the end of the run).
        """

        def save_run(progress: PassState) -> None:
            state.phase, state.minibatch = "minibatch", progress
            self.save(state)

        return save_run


def _minibatch_record(progress: PassState) -> tuple[dict, dict]:
    """The arrays and the JSON section of a mini-batch state (floats exact: JSON keeps every bit)."""
    run = progress.run
    arrays = {
        "centroids": np.ascontiguousarray(run.centroids),
        "counts": np.ascontiguousarray(run.counts),
    }
    if progress.pending is not None and len(progress.pending):
        arrays["pending"] = np.ascontiguousarray(progress.pending)
        if progress.pending_w is not None:
            arrays["pending_weights"] = np.ascontiguousarray(progress.pending_w)
    section = {
        "n_steps": run.n_steps,
        "n_since_reassign": run.n_since_reassign,
        "ewa_objective": run.ewa_objective,
        "ewa_objective_min": run.ewa_objective_min,
        "no_improvement": run.no_improvement,
        "stop_reason": progress.stop_reason,
        "epoch": progress.epoch,
        "next_row": progress.next_row,
        "history": history_dicts(progress.history),
    }
    return arrays, section


def _minibatch_state(arrays: dict, section: dict) -> PassState:
    """The inverse of :func:`_minibatch_record`."""
    run = MiniBatchState(
        arrays["centroids"],
        arrays["counts"],
        int(section["n_steps"]),
        int(section["n_since_reassign"]),
        section["ewa_objective"],
        section["ewa_objective_min"],
        int(section["no_improvement"]),
    )
    return PassState(
        run,
        arrays.get("pending"),
        arrays.get("pending_weights"),
        history_records(section["history"]),
        section["stop_reason"],
        int(section["epoch"]),
        int(section["next_row"]),
    )


__all__ = ["CheckpointError", "Checkpointer", "checkpoint_path", "data_fingerprint"]
