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

from dkmeans.engine.futures import gather
from dkmeans.engine.local import LocalChunks
from dkmeans.engine.memory import MemoryBudget
from dkmeans.engine.persisted import PersistedData
from dkmeans.engine.protocol import ChunkedData, PrunableData
from dkmeans.engine.streamed import StreamedData

__all__ = [
    "ChunkedData",
    "LocalChunks",
    "MemoryBudget",
    "PersistedData",
    "PrunableData",
    "StreamedData",
    "gather",
]
