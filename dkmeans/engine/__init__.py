"""Everything that knows Dask's machinery, behind the data protocol (:mod:`.protocol`: the base
:class:`~.protocol.ChunkedData` of every implementation, and its optional capabilities).

* :mod:`.persisted`: data persisted on the workers; one pass is one graph of O(workers) tasks.
* :mod:`.streamed`: data read from its source in every pass (out of core).
* :mod:`.sources`, :mod:`.reader`: files cut into pieces, and the tasks that read a piece in
  row batches.
* :mod:`.local`: chunks in one process (the one-task mode, and tests).
* :mod:`.spmd`, :mod:`.mailbox`: loops run SPMD, one task per worker thread, partials
  exchanged worker to worker.
* :mod:`.balance`: where persisted chunks live (spread and balanced by rows).
* :mod:`.memory`: the workers' memory budgets.
* :mod:`.futures`: waiting on futures and naming cluster failures.
* :mod:`.passes`: the reduction tree of a pass.
"""

from dkmeans._lazy import lazy_attributes as _lazy_attributes

#: The package's names, each imported from its module on first use (PEP 562): a worker that runs
#: one light engine function (the memory probe, :mod:`.probe`) imports that module only, not the
#: whole engine with Dask's array collection (about 2 s of a fresh worker's start on 2 cores).
_NAMES = {
    "gather": "dkmeans.engine.futures",
    "LocalChunks": "dkmeans.engine.local",
    "MemoryBudget": "dkmeans.engine.memory",
    "PersistedData": "dkmeans.engine.persisted",
    "ChunkedData": "dkmeans.engine.protocol",
    "PrunableData": "dkmeans.engine.protocol",
    "StreamedData": "dkmeans.engine.streamed",
}


__getattr__ = _lazy_attributes(__name__, _NAMES, globals())


__all__ = [
    "ChunkedData",
    "LocalChunks",
    "MemoryBudget",
    "PersistedData",
    "PrunableData",
    "StreamedData",
    "gather",
]
