"""Parquet and CSV read into Dask DataFrames, labelled Parquet written: locally or on object stores.

Paths may be local or any fsspec URL (``s3://``, ``gs://``, ``abfs://`` with s3fs, gcsfs or
adlfs installed); ``storage_options`` go to the filesystem (credentials, ``endpoint_url``
of an S3-compatible store). A folder on a store is read like a local one: Parquet written
by Spark (``part-*.snappy.parquet`` beside ``_SUCCESS``, ``key=value/`` subfolders),
pandas, polars or ``pyarrow.dataset``, or CSV files. What cannot be read (no such file or
bucket, a glob matching nothing, wrong credentials, an unreachable endpoint) raises
:class:`~dkmeans.errors.DataSourceError` with one line naming the path as written.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from dkmeans.engine.sources import register_csv
from dkmeans.errors import DataSourceError, DKMeansError, InvalidDataError, InvalidParameterError

FORMATS = ("parquet", "csv")
_CSV_SUFFIXES = (".csv", ".csv.gz", ".tsv")
_PARQUET_SUFFIXES = (".parquet", ".pq", ".parq")


def _hidden(name: str) -> bool:
    """What Spark, Hadoop, Dask leave beside the data (``_SUCCESS``, ``_metadata``, ``.crc``)."""
    return name.startswith(("_", ".")) or name.endswith(".crc")


def _problem(exc: BaseException) -> str:
    """One line saying why a store refused: the exception's own first line, or its kind."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@contextlib.contextmanager
def storage_errors(path: str, action: str = "read"):
    """Failures of a filesystem or store as one-line :class:`DataSourceError` naming ``path``."""
    try:
        yield
    except DKMeansError:
        raise
    except FileNotFoundError as exc:
        raise DataSourceError(
            f"cannot {action} {path}: no such file, folder or bucket ({_problem(exc)})"
        ) from exc
    except PermissionError as exc:
        raise DataSourceError(
            f"cannot {action} {path}: access denied, check the credentials ({_problem(exc)})"
        ) from exc
    except ImportError as exc:
        raise DataSourceError(f"cannot {action} {path}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - stores' errors (botocore...) share no base class
        kind = type(exc).__name__ + " " + type(exc).__module__
        words = ("Connect", "Endpoint", "Timeout", "aiohttp", "socket")
        unreachable = any(w in kind for w in words)
        hint = " (is the endpoint reachable?)" if unreachable else ""
        raise DataSourceError(f"cannot {action} {path}{hint}: {_problem(exc)}") from exc


def filesystem(path: str, storage_options=None):
    """The fsspec filesystem of ``path`` (None: a local path) and the path in its terms."""
    import fsspec

    if "://" not in path and not storage_options:
        return None, path
    with storage_errors(path):
        fs, stripped = fsspec.core.url_to_fs(path, **(storage_options or {}))
    local = type(fs).__name__ == "LocalFileSystem"
    return (None if local else fs), (path if local else stripped)


def _is_glob(path: str) -> bool:
    return any(ch in path for ch in "*?[")


def _check_bucket(fs, path: str, stripped: str) -> None:
    """On an object store, a path that does not exist may lack its bucket: say so."""
    if "://" not in path or type(fs).__name__ == "LocalFileSystem":
        return
    bucket = stripped.split("/")[0]
    if bucket and not fs.exists(bucket):
        raise DataSourceError(f"cannot read {path}: no such bucket {bucket!r}")


def list_files(path: str, storage_options=None) -> list:
    """The data files of a file, folder (recursively: ``key=value/`` subfolders) or glob, sorted.

    Raises :class:`DataSourceError` when the path does not exist or a glob matches nothing.
    """
    import fsspec

    with storage_errors(path):
        fs, stripped = fsspec.core.url_to_fs(path, **(storage_options or {}))
        if _is_glob(path):
            found = fs.glob(stripped)
            if not found:
                raise DataSourceError(f"no file matches {path}")
            found = [f for f in found if not fs.isdir(f)] or found
        elif fs.isdir(stripped):
            found = fs.find(stripped)
        elif fs.exists(stripped):
            found = [stripped]
        else:
            _check_bucket(fs, path, stripped)
            raise DataSourceError(f"input {path} does not exist")
    files = sorted(str(f) for f in found if not _hidden(os.path.basename(str(f))))
    if not files:
        raise DataSourceError(f"{path} holds no data file")
    return files


def detect_format(path: str, storage_options=None) -> str:
    """``"parquet"`` or ``"csv"`` from a path, folder or glob (a folder: from its files)."""
    p = str(path).rstrip("/")
    lower = p.lower()
    if lower.endswith(_CSV_SUFFIXES) or lower.endswith("*.csv"):
        return "csv"
    if lower.endswith(_PARQUET_SUFFIXES) or lower.endswith("*.parquet"):
        return "parquet"
    files = list_files(str(path), storage_options)
    if any(f.lower().endswith(_CSV_SUFFIXES) for f in files) and not any(
        f.lower().endswith(_PARQUET_SUFFIXES) for f in files
    ):
        return "csv"
    if _is_glob(p) and not any(f.lower().endswith(_PARQUET_SUFFIXES) for f in files):
        raise InvalidParameterError(
            f"cannot tell the format of {path}: name a .parquet/.csv file, folder or glob"
        )
    return "parquet"  # Spark's part-00000 files may have no suffix


def _csv_files(path: str, storage_options=None):
    """The CSV files of a file, folder or glob, sorted, and their filesystem (None: local)."""
    files = list_files(path, storage_options)
    if not _is_glob(path):  # a folder: its CSV files (a file named is taken whatever its name)
        named = [f for f in files if f.lower().endswith(_CSV_SUFFIXES)]
        files = named if len(files) > 1 or named else files
    if not files:
        raise DataSourceError(f"no CSV file matches {path}")
    fs, _ = filesystem(path, storage_options)
    return files, fs


def read_table(path, columns=None, fmt: str | None = None, blocksize="64MiB", storage_options=None):
    """Read Parquet (file, directory or glob, with pyarrow) or CSV into a Dask DataFrame.

    Read more in the :ref:`User Guide <guide-data>`.

    CSV: ``dd.read_csv`` over the files (sorted), registered with the engine, which reads
    a fit's feature columns of it in row batches itself (``dkmeans.engine.sources``).

    Parameters
    ----------
    path : str or Path
        A local path or an fsspec URL (``s3://bucket/folder/``): a file, a folder (Spark's,
        hive-partitioned ``key=value/`` subfolders included) or a glob.
    columns : list of str, optional
        Read only these columns (Parquet reads nothing else from disk).
    fmt : {"parquet", "csv"}, optional
        Default: from the path (a folder: from its files).
    blocksize : str
        CSV partition size.
    storage_options : dict, optional
        For the filesystem of ``path`` (fsspec): ``key``/``secret``, ``endpoint_url``,
        ``anon``, ``client_kwargs``, ...

    Raises
    ------
    DataSourceError
        No such file, folder or bucket; a glob matching nothing; wrong credentials; an
        unreachable endpoint (one line naming ``path`` as written).
    """
    import dask.dataframe as dd

    path = str(path)
    if fmt is not None and fmt not in FORMATS:
        raise InvalidParameterError(f"format must be one of {FORMATS}, got {fmt!r}")
    fmt = fmt or detect_format(path, storage_options)
    options = dict(storage_options or {})
    try:
        with storage_errors(path):
            if fmt == "parquet":
                list_files(path, storage_options)  # what does not exist says so, in one line
                return dd.read_parquet(
                    path,
                    columns=list(columns) if columns else None,
                    engine="pyarrow",
                    storage_options=options or None,
                )
            files, fs = _csv_files(path, storage_options)
            urls = files if fs is None else [fs.unstrip_protocol(f) for f in files]
            df = dd.read_csv(urls, blocksize=blocksize, storage_options=options or None)
            if all(f.lower().endswith(".csv") for f in files):  # plain CSV: cut at line ends
                register_csv(df, files, fs)  # fits read in row batches (engine/sources.py)
            return df[list(columns)] if columns else df
    except DataSourceError:
        raise
    except (ValueError, KeyError) as exc:
        raise InvalidDataError(f"cannot read {path}: {exc}") from exc


def write_parquet(df, path, overwrite: bool = True, storage_options=None):
    """Write a Dask DataFrame as a Parquet directory, one file per partition (pyarrow).

    Read more in the :ref:`User Guide <guide-data>`.

    Parameters
    ----------
    df : dask.dataframe.DataFrame
        The frame, e.g. ``df.assign(cluster=km.predict(df[features]))``.
    path : str or path-like
        The directory to write: a local path or an fsspec URL (``s3://bucket/out/``).
    overwrite : bool, default True
        Replace what is in the directory.
    storage_options : dict, optional
        fsspec options of an object store (endpoint, credentials), as Dask takes them.

    Returns
    -------
    pathlib.Path or str
        The directory: a :class:`~pathlib.Path` for a local path, the URL as given otherwise.
    """
    path = str(path)
    with storage_errors(path, "write"):
        df.to_parquet(
            path,
            engine="pyarrow",
            write_index=True,
            overwrite=overwrite,
            schema=_object_types(df),
            storage_options=dict(storage_options) if storage_options else None,
        )
    return path if "://" in path else Path(path)


def _object_types(df):
    """The ``schema`` of ``to_parquet``: Dask's inference (``"infer"``), or, where the frame has
    ``object`` columns (Spark's structs and lists, read back by Dask), pyarrow's of each partition
    (None): Dask would infer theirs from its placeholder objects, which Arrow cannot convert."""
    # dtype equality (a NumPy dtype equals ``object``), not a type check
    return None if any(t == object for t in df.dtypes) else "infer"  # noqa: E721


def write_labels_parquet(labels, path, column: str = "cluster") -> Path:
    """Write a Dask array of labels as a one-column Parquet directory (no index)."""
    import dask.dataframe as dd

    dd.from_dask_array(labels, columns=column).to_frame().to_parquet(str(path), write_index=False)
    return Path(path)
