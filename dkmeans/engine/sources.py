"""Files read by the engine itself, in row batches: one task holds a batch, whatever the file's size.

A Dask DataFrame read with ``dd.read_parquet`` computes a whole partition (a file, or a
row group) per task, as Arrow, then pandas, then (for us) a NumPy array: about three
times the partition's bytes at once, more than a small worker's budget for one task
with the 64 MB to 1 GB files Spark and pandas write. :class:`ParquetSource` reads the
same files with pyarrow instead: only the feature columns, a batch of rows at a time
(``ParquetFile.iter_batches``), each column copied straight into one float32/float64
array (no pandas), so a task of a streamed pass holds one batch plus the kernel's
scratch. Row counts come from the files' footers (no pass counts them).

The rows are those of the DataFrame, in its order (files in ``dask.utils.natural_sort_key``
order, as ``dd.read_parquet`` sorts them, row groups in file order), so global row
indices, and the draws keyed by them, are those of the in-memory fit.

CSV files read through :func:`dkmeans.engine.files.read_table` (the CLI's input) are read the
same way (:class:`CsvSource`): the frame is ``dd.read_csv`` over the listed files, registered
here with those files (:func:`register_csv`); the engine splits each file at line ends
into pieces of about :data:`PIECE_BYTES`, counts each piece's rows in one pass on the
workers (one column converted), and streams a piece with pyarrow's ``open_csv`` (only the
feature columns converted, straight to float arrays), in the files' order, as Dask does.
Dask's graph of any other ``dd.read_csv`` frame names its files only inside private
tasks, so such frames are read by Dask as before.

How much memory a batch takes while read is measured, not guessed
(:func:`measure_read`): a probe task on a worker releases what the allocators keep,
resets the process's peak resident memory (Linux: ``/proc/self/clear_refs``, then
``VmHWM`` of ``/proc/self/status``), reads and converts one batch, and reports the peak
above where it started; two batch sizes give the bytes per row and a fixed part (column
readers, decompression buffers). The batch size is then what a worker's task budget
(:mod:`dkmeans.engine.memory`) holds.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from dataclasses import dataclass, field

import numpy as np

from dkmeans.engine.columns import batch_to_array

#: Consecutive row groups of a file are read by one task of a pass up to about this many
#: bytes of features (a piece); a row group is never split between tasks.
PIECE_BYTES = 64 * 2**20
#: pyarrow reads column chunks through buffered streams of this size (not whole chunks).
READ_BUFFER_BYTES = 2**20
#: Fewer rows per batch than this would make the reads slow (per-batch overheads).
MIN_BATCH_ROWS = 4096
#: More rows per batch than this gain nothing (the kernels tile rows anyway).
MAX_BATCH_ROWS = 2**18
#: What a kernel may hold per row of its batch besides its fixed scratch, in float64 values
#: per feature: a float64 copy of the rows and one temporary of the same size (column
#: moments of float32 rows).
KERNEL_ROW_VALUES = 2
#: Where the process's peak memory cannot be measured: bytes per row read, as multiples of
#: the row's bytes in memory, and a fixed part.
FALLBACK_ROW_FACTOR, FALLBACK_FIXED = 3.0, 32 * 2**20


@dataclass(frozen=True)
class ReadCost:
    """Measured peak memory of reading a batch: ``fixed + per_row * rows`` bytes (see :func:`measure_read`)."""

    per_row: float
    fixed: float
    measured: bool

    def rows_for(self, nbytes: float, kernel_per_row: float = 0.0) -> int:
        """Rows of the largest batch whose read (and ``kernel_per_row`` bytes per row) peaks at ``nbytes``."""
        return max(0, int((nbytes - self.fixed) // (self.per_row + kernel_per_row)))


class _PieceRows:
    """Rows of a file source: its pieces are tuples that end with their row count."""

    @property
    def n_rows(self) -> int:
        return int(sum(p[-1] for p in self.pieces))

    @property
    def piece_rows(self) -> tuple:
        return tuple(int(p[-1]) for p in self.pieces)


@dataclass
class ParquetSource(_PieceRows):
    """Feature columns of Parquet files, read by the engine in row batches (see the module docstring).

    ``pieces``: ``(file index, row groups, rows)``, in row order; every task of a pass
    reads one piece, in batches of ``batch_rows``.
    """

    files: list
    columns: list
    dtype: np.dtype
    filesystem: object = None  # an fsspec filesystem (None: local paths)
    pieces: list = field(default_factory=list)
    batch_rows: int = 65536

    def tail(self, first_piece: int) -> ParquetSource:
        """The pieces from ``first_piece`` on (the streamed tail of hybrid data)."""
        return ParquetSource(
            self.files,
            self.columns,
            self.dtype,
            self.filesystem,
            self.pieces[first_piece:],
            self.batch_rows,
        )

    def _open(self, file_index: int):
        import pyarrow.parquet as pq

        path = self.files[file_index]
        handle = self.filesystem.open(path, "rb") if self.filesystem is not None else path
        return pq.ParquetFile(handle, buffer_size=READ_BUFFER_BYTES, pre_buffer=False)

    def batches(self, piece: int, batch_rows: int | None = None, limit: int | None = None):
        """The rows of ``piece`` as ``(row offset in the piece, array)`` batches of ``batch_rows`` rows."""
        file_index, row_groups, _ = self.pieces[piece]
        pf = self._open(file_index)
        start = 0
        with contextlib.closing(pf):
            for batch in pf.iter_batches(
                batch_size=int(batch_rows or self.batch_rows),
                row_groups=list(row_groups),
                columns=list(self.columns),
                use_threads=False,
            ):
                X = to_array(batch, self.dtype)
                del batch
                yield start, X
                start += X.shape[0]
                if limit is not None and start >= limit:
                    return

    def read(self, piece: int) -> np.ndarray:
        """The whole piece as one array (a persisted chunk, or rows picked from it)."""
        rows = self.pieces[piece][2]
        out = np.empty((rows, len(self.columns)), dtype=self.dtype)
        for start, X in self.batches(piece):
            out[start : start + X.shape[0]] = X
        return out


def to_array(batch, dtype) -> np.ndarray:
    """A pyarrow RecordBatch as a C-ordered ``(rows, columns)`` array, column by column.

    Every numeric Arrow type (ints, floats, bools, decimals) converts; a missing value
    (null) is NaN, which the fit's first pass finds (and the fit service then names the
    columns with their counts: :func:`dkmeans.engine.rowwise.missing_counts`).
    """
    return batch_to_array(batch, dtype, missing="skip")


# -- the files behind a Dask DataFrame --------------------------------------------------------
def parquet_source(frame, dtype, max_bytes: int | None = None) -> ParquetSource | CsvSource | None:
    """A :class:`ParquetSource` for ``frame`` when it is a plain ``dd.read_parquet`` of some columns, a
    :class:`CsvSource` when it is some columns of a CSV frame of :func:`register_csv`, else None.

    ``max_bytes``: None also for Parquet whose rows (as ``dtype``) take more, known from the
    first footers that exceed it (the others are not opened).

    Plain: after Dask's optimisation the expression is the Parquet read itself (column
    projection folded in), with no filters and no partition selection. The path, columns,
    filters and filesystem are read with ``Expr.operand``; dask's public API names no
    file list, so the files are listed here as ``dd.read_parquet`` lists them (fsspec,
    ``natural_sort_key`` order, names starting with ``_`` or ``.`` skipped). Only
    ``_partitions`` (a partition selection such as ``df.partitions[...]``) is a private
    operand: a frame that has one is not read here (it would change the rows).
    """
    csv = _registered_csv(frame, dtype)
    if csv is not None:
        return csv
    try:
        expr = frame.optimize().expr
        parameters = getattr(expr, "_parameters", ())
        if "path" not in parameters or type(expr).__name__ not in (
            "ReadParquetFSSpec",
            "ReadParquetPyarrowFS",
        ):
            return None
        if expr.operand("filters") or ("_partitions" in parameters and expr.operand("_partitions")):
            return None
        columns = list(frame.columns)
        if any(not isinstance(c, str) for c in columns):
            return None
        fs, files = _list_parquet_files(expr.operand("path"), expr.operand("storage_options"))
        if not files:
            return None
        return _plan_pieces(files, columns, dtype, fs, max_bytes)
    except Exception:  # noqa: BLE001 - anything unexpected: Dask reads the frame as before
        return None


def _list_parquet_files(path, storage_options) -> tuple:
    import fsspec
    from dask.utils import natural_sort_key

    paths = path if isinstance(path, (list, tuple)) else [path]
    fs, _ = fsspec.core.url_to_fs(str(paths[0]), **(storage_options or {}))
    files = []
    for p in paths:
        p = str(p)
        stripped = fs._strip_protocol(p) if hasattr(fs, "_strip_protocol") else p
        if any(ch in p for ch in "*?["):
            found = fs.glob(stripped)
        elif fs.isdir(stripped):
            found = [f for f in fs.find(stripped)]
        else:
            found = [stripped]
        for f in found:
            name = os.path.basename(f)
            if name.startswith(("_", ".")) or name.endswith((".crc", ".json")):
                continue
            files.append(f)
    files = sorted(files, key=natural_sort_key)
    local = type(fs).__name__ == "LocalFileSystem"
    return (None if local else fs), files


def _plan_pieces(files, columns, dtype, fs, max_bytes=None) -> ParquetSource | None:
    source = ParquetSource(list(files), list(columns), np.dtype(dtype), fs)
    row_bytes = len(columns) * source.dtype.itemsize
    pieces = []
    for i in range(len(files)):
        if max_bytes is not None and sum(p[2] for p in pieces) * row_bytes > max_bytes:
            return None
        pf = source._open(i)
        with contextlib.closing(pf):
            names = set(pf.schema_arrow.names)
            if not set(columns) <= names:  # e.g. hive partition columns: Dask reads those
                return None
            meta = pf.metadata
            group, rows = [], 0
            for g in range(meta.num_row_groups):
                n = meta.row_group(g).num_rows
                if group and (rows + n) * row_bytes > PIECE_BYTES:
                    pieces.append((i, tuple(group), rows))
                    group, rows = [], 0
                group.append(g)
                rows += n
            if group and rows:
                pieces.append((i, tuple(group), rows))
    if not pieces or (max_bytes is not None and sum(p[2] for p in pieces) * row_bytes > max_bytes):
        return None
    source.pieces = pieces
    return source


# -- CSV files ---------------------------------------------------------------------------------
#: pyarrow's CSV reader parses this many bytes at a time at most (its batches are blocks of bytes).
CSV_BLOCK_BYTES = 4 * 2**20
_csv_frames: dict = {}


def register_csv(frame, files, filesystem=None) -> None:
    """Remember that ``frame`` (a ``dd.read_csv`` with default parsing options) reads ``files`` in this order.

    Column selections of it (``frame[cols]``) are then read by the engine (:class:`CsvSource`).
    """
    if len(_csv_frames) > 256:  # names of frames long gone: keep the registry small
        _csv_frames.clear()
    _csv_frames[frame.expr._name] = (list(files), filesystem, list(frame.columns))


def _registered_csv(frame, dtype) -> CsvSource | None:
    """The :class:`CsvSource` of ``frame`` when it selects columns of a registered CSV frame."""
    try:
        expr = frame.expr
        while expr._name not in _csv_frames and type(expr).__name__ == "Projection":
            expr = expr.operand("frame")
        if expr._name not in _csv_frames:
            return None
        files, fs, names = _csv_frames[expr._name]
        columns = list(frame.columns)
        if not columns or any(c not in names for c in columns):
            return None
        return CsvSource(
            files, columns, np.dtype(dtype), fs, names=names, pieces=_csv_pieces(files, fs)
        )
    except Exception:  # noqa: BLE001 - anything unexpected: Dask reads the frame as before
        return None


def _open_bytes(path, filesystem):
    return filesystem.open(path, "rb") if filesystem is not None else open(path, "rb")


def _line_end(f, offset: int, size: int) -> int:
    """The offset just past the first newline at or after ``offset`` (``size`` if none)."""
    if offset >= size:
        return size
    f.seek(offset)
    while True:
        chunk = f.read(65536)
        if not chunk:
            return size
        at = chunk.find(b"\n")
        if at >= 0:
            return offset + at + 1
        offset += len(chunk)


def _csv_pieces(files, filesystem) -> list:
    """``(file index, first byte, end byte, rows: None until counted)``: each file cut at line ends."""
    pieces = []
    for i, path in enumerate(files):
        size = filesystem.size(path) if filesystem is not None else os.path.getsize(path)
        with _open_bytes(path, filesystem) as f:
            start = 0
            while start < size:
                stop = (
                    _line_end(f, start + PIECE_BYTES, size) if start + PIECE_BYTES < size else size
                )
                pieces.append((i, start, stop, None))
                start = stop
    return pieces


class _ByteRange(io.RawIOBase):
    """Bytes ``start:stop`` of an open binary file, as a readable stream."""

    def __init__(self, f, start: int, stop: int):
        self.f, self.left = f, stop - start
        f.seek(start)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self.left)
        if n <= 0:
            return 0
        data = self.f.read(n)
        buffer[: len(data)] = data
        self.left -= len(data)
        return len(data)


@dataclass
class CsvSource(_PieceRows):
    """Feature columns of CSV files (each with a header line), read by the engine in row batches.

    ``pieces``: ``(file index, first byte, end byte, rows)`` in row order, cut at line ends;
    rows are counted on the workers (:meth:`count_rows`) before the first pass. ``names``:
    the files' columns (from the first file's header, as ``dd.read_csv`` takes them).
    """

    files: list
    columns: list
    dtype: np.dtype
    filesystem: object = None
    names: list = field(default_factory=list)
    pieces: list = field(default_factory=list)
    batch_rows: int = 65536

    @property
    def rows_known(self) -> bool:
        return all(p[3] is not None for p in self.pieces)

    def _reader(self, piece: int, columns, batch_rows: int | None):
        import pyarrow as pa
        import pyarrow.csv as pcsv

        file_index, start, stop, rows = self.pieces[piece]
        f = _open_bytes(self.files[file_index], self.filesystem)
        line_bytes = (stop - start) / rows if rows else 64.0
        block = int(
            min(CSV_BLOCK_BYTES, max(2**16, line_bytes * int(batch_rows or self.batch_rows)))
        )
        stream = io.BufferedReader(_ByteRange(f, start, stop), buffer_size=2**20)
        reader = pcsv.open_csv(
            stream,
            read_options=pcsv.ReadOptions(
                column_names=list(self.names),
                skip_rows=1 if start == 0 else 0,
                block_size=block,
                use_threads=False,
            ),
            convert_options=pcsv.ConvertOptions(
                include_columns=list(columns), column_types={c: pa.float64() for c in columns}
            ),
        )
        return f, reader

    def count(self, piece: int) -> int:
        """Rows of a piece (runs on a worker: the piece parsed, its first feature column converted)."""
        f, reader = self._reader(piece, self.columns[:1], None)
        with contextlib.closing(f):
            return int(sum(batch.num_rows for batch in reader))

    def batches(self, piece: int, batch_rows: int | None = None, limit: int | None = None):
        """The rows of ``piece`` as ``(row offset in the piece, array)`` batches (of about ``batch_rows``)."""
        f, reader = self._reader(piece, self.columns, batch_rows)
        start = 0
        with contextlib.closing(f):
            for batch in reader:
                if not batch.num_rows:
                    continue
                X = to_array(batch.select(list(self.columns)), self.dtype)
                del batch
                yield start, X
                start += X.shape[0]
                if limit is not None and start >= limit:
                    return

    def read(self, piece: int) -> np.ndarray:
        """The whole piece as one array."""
        parts = [X for _, X in self.batches(piece)]
        return (
            np.concatenate(parts) if parts else np.empty((0, len(self.columns)), dtype=self.dtype)
        )


def count_rows(client, source, gather_fn, workers=None) -> None:
    """Fill in the rows of every piece of ``source`` (a :class:`CsvSource`): one task per piece."""
    if getattr(source, "rows_known", True):
        return
    placement = {"workers": list(workers), "allow_other_workers": False} if workers else {}
    futures = client.map(source.count, range(len(source.pieces)), pure=False, **placement)
    rows = gather_fn(futures)
    source.pieces = [(i, a, b, int(n)) for (i, a, b, _), n in zip(source.pieces, rows)]
    source.pieces = [
        p for p in source.pieces if p[3]
    ]  # a header-only file, or trailing blank lines


# -- measuring a read ----------------------------------------------------------------------------
_STATUS = "/proc/self/status"


def _status_bytes(field_name: str) -> int | None:
    try:
        with open(_STATUS) as f:
            found = re.search(field_name + r":\s+(\d+)\s*kB", f.read())
        return int(found.group(1)) * 1024 if found else None
    except OSError:
        return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current resident size
        return True
    except OSError:
        return False


def task_peak_start() -> int | None:
    """Start measuring this process's peak memory (None: not measurable here); see :func:`task_peak`."""
    return _status_bytes("VmRSS") if _reset_peak() else None


def task_peak(start: int | None) -> int:
    """Bytes the process's peak memory rose above ``start`` (0 when not measured)."""
    peak = _status_bytes("VmHWM") if start is not None else None
    return max(0, peak - start) if peak is not None else 0


def _peak_of(fn) -> int | None:
    """Bytes the process's resident memory rose above its start while ``fn()`` ran (None: not measurable)."""
    from dkmeans.engine.release import release_memory

    release_memory()
    if not _reset_peak():
        return None
    start = _status_bytes("VmRSS")
    fn()
    peak = _status_bytes("VmHWM")
    if start is None or peak is None:
        return None
    return max(0, peak - start)


def measure_read(source: ParquetSource, small: int = 65536) -> ReadCost:
    """The peak memory of reading a batch of ``source`` (runs in a task on a worker; see the module docstring)."""
    row_bytes = len(source.columns) * source.dtype.itemsize
    piece_rows = source.piece_rows
    piece = max(range(len(piece_rows)), key=lambda i: piece_rows[i])
    rows = piece_rows[piece]
    small = max(1, min(small, rows // 4 or 1))
    large = min(rows, 4 * small)

    def read(n):
        def run():
            for _, X in source.batches(piece, n, limit=n):
                X.sum()

        return run

    # one unmeasured read first: what a worker's first read imports (pyarrow's readers, pandas
    # where a column needs it) stays with the process, not with each read; the budget is
    # measured again after this probe, imports included
    read(1)()
    peaks = [_peak_of(read(n)) for n in (small, large, small, large)]
    if any(p is None for p in peaks) or large <= small:
        return ReadCost(FALLBACK_ROW_FACTOR * row_bytes, FALLBACK_FIXED, False)
    p_small, p_large = max(peaks[0], peaks[2]), max(peaks[1], peaks[3])
    per_row = max(row_bytes, (p_large - p_small) / (large - small))  # at least the output array
    fixed = max(0.0, p_small - per_row * small)
    return ReadCost(float(per_row), float(fixed), True)


__all__ = [
    "CsvSource",
    "ParquetSource",
    "ReadCost",
    "count_rows",
    "measure_read",
    "parquet_source",
    "register_csv",
    "to_array",
]
