"""The checkpoint job of a fit: what identifies it, and the state it resumes from."""

from __future__ import annotations

import numpy as np

from dkmeans.drivers.state import FitState
from dkmeans.fit.spec import FitSpec
from dkmeans.io.checkpoint import Checkpointer, data_fingerprint
from dkmeans.io.model_file import digest


def checkpoint_job(spec: FitSpec, data, moments, C0, seed, **job_extra):
    """The checkpoint of this fit (or None) and the state to start from.

    ``job_extra``: more of the job's description, checked on resume (mini-batch: how the
    batches are drawn).
    """
    if spec.checkpoint is None:
        return None, FitState(seed)
    job = dict(spec.job)
    if C0 is not None:
        job["init"] = "array sha256 " + digest(np.asarray(C0))
    job.update(
        n_rows=data.n_rows,
        n_features=data.n_features,
        dtype=str(data.dtype),
        weighted=data.has_weights,
        data=data_fingerprint(moments),
        **job_extra,
    )
    checkpointer = Checkpointer(spec.checkpoint, spec.checkpoint_every, job)
    state = checkpointer.load() if checkpointer.exists() else FitState(seed)
    return checkpointer, state
