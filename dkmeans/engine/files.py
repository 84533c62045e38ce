"""Reading Parquet and CSV into Dask DataFrames, writing labelled Parquet.

Paths may be local or any fsspec URL Dask understands (``s3://...`` with s3fs installed).
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

from dkmeans.engine.sources import register_csv
from dkmeans.errors import InvalidDataError, InvalidParameterError

FORMATS = ("parquet", "csv")


def detect_format(path: str) -> str:
    """``"parquet"`` or ``"csv"`` from a path, directory or glob."""
    p = str(path).rstrip("/")
    lower = p.lower()
    if lower.endswith((".csv", ".csv.gz", ".tsv")) or lower.endswith("*.csv"):
        return "csv"
    if lower.endswith((".parquet", ".pq")) or lower.endswith("*.parquet"):
        return "parquet"
    if "://" not in p and os.path.isdir(p):
        names = os.listdir(p)
        if any(n.endswith(".csv") for n in names) and not any(n.endswith((".parquet", ".pq")) for n in names):
            return "csv"
        return "parquet"
    raise InvalidParameterError(f"cannot tell the format of {path!r}: name a .parquet/.csv file, directory or glob")


def _check_local_exists(path: str) -> None:
    if "://" in path:
        return
    if any(ch in path for ch in "*?["):
        if not glob.glob(path):
            raise InvalidDataError(f"no file matches {path!r}")
    elif not os.path.exists(path):
        raise InvalidDataError(f"input {path!r} does not exist")


def _csv_files(path: str):
    """The CSV files of a file, directory or glob, sorted, and their fsspec filesystem (None: local)."""
    import fsspec

    fs, _ = fsspec.core.url_to_fs(path)
    local = type(fs).__name__ == "LocalFileSystem"
    stripped = fs._strip_protocol(path) if not local else path
    if any(ch in path for ch in "*?["):
        files = fs.glob(stripped)
    elif fs.isdir(stripped):
        files = [f for f in fs.ls(stripped, detail=False) if f.lower().endswith((".csv", ".csv.gz", ".tsv"))]
    else:
        files = [stripped]
    files = sorted(str(f) for f in files)
    if not files:
        raise InvalidDataError(f"no CSV file matches {path!r}")
    return files, (None if local else fs)


def read_table(path, columns=None, fmt: str | None = None, blocksize="64MiB"):
    """Read Parquet (file, directory or glob, with pyarrow) or CSV into a Dask DataFrame.

    Read more in the :ref:`User Guide <guide-data>`.

    CSV: ``dd.read_csv`` over the files (sorted), registered with the engine, which reads
    a fit's feature columns of it in row batches itself (``dkmeans.engine.sources``).

    Parameters
    ----------
    path : str or Path
        A Parquet file, directory or glob, or a CSV file or glob.
    columns : list of str, optional
        Read only these columns (Parquet reads nothing else from disk).
    fmt : {"parquet", "csv"}, optional
        Default: from the path.
    blocksize : str
        CSV partition size.
    """
    import dask.dataframe as dd

    path = str(path)
    _check_local_exists(path)
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise InvalidParameterError(f"format must be one of {FORMATS}, got {fmt!r}")
    try:
        if fmt == "parquet":
            return dd.read_parquet(path, columns=list(columns) if columns else None, engine="pyarrow")
        try:
            files, fs = _csv_files(path)
        except InvalidDataError:
            raise
        except Exception:  # noqa: BLE001 - a listing fsspec cannot make here: Dask reads the path itself
            files, fs = None, None
        df = dd.read_csv(path if files is None else files if fs is None else [fs.unstrip_protocol(f) for f in files],
                         blocksize=blocksize)
        if files and all(f.lower().endswith(".csv") for f in files):  # plain CSV: cut at line ends
            register_csv(df, files, fs)  # a fit reads its feature columns in row batches (engine/sources.py)
        return df[list(columns)] if columns else df
    except (ValueError, KeyError) as exc:
        raise InvalidDataError(f"cannot read {path!r}: {exc}") from exc


def write_parquet(df, path, overwrite: bool = True) -> Path:
    """Write a Dask DataFrame as a Parquet directory, one file per partition (pyarrow).

    Read more in the :ref:`User Guide <guide-data>`.

    Parameters
    ----------
    df : dask.dataframe.DataFrame
        The frame, e.g. ``df.assign(cluster=km.predict(df[features]))``.
    path : str or path-like
        The directory to write.
    overwrite : bool, default True
        Replace what is in the directory.

    Returns
    -------
    pathlib.Path
        The directory.
    """
    df.to_parquet(str(path), engine="pyarrow", write_index=True, overwrite=overwrite)
    return Path(path)


def write_labels_parquet(labels, path, column: str = "cluster") -> Path:
    """Write a Dask array of labels as a one-column Parquet directory (no index)."""
    import dask.dataframe as dd

    dd.from_dask_array(labels, columns=column).to_frame().to_parquet(str(path), write_index=False)
    return Path(path)
