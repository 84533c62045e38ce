"""Safe model files: one ``.npz`` archive of plain arrays plus JSON metadata, never pickle.

Layout (format version 1): ``centroids`` (k x d, float32/float64) and ``metadata`` (the
UTF-8 bytes of a JSON object as a uint8 array). The metadata records the format version,
the dkmeans version, the SHA-256 of the centroid bytes, and whatever the caller adds
(parameters, objective, iteration count, history). Loading uses
``numpy.load(allow_pickle=False)`` and checks every field, so a truncated, altered,
pickled or wrong-version file fails with :class:`ModelFileError` and runs no code.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from dkmeans.errors import InvalidDataError
from dkmeans.model import Model

FORMAT_VERSION = 1
_FORMAT_NAME = "dkmeans-model"


class ModelFileError(InvalidDataError):
    """A model file is missing, damaged, altered, of another format or version."""


def digest(centroids: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(centroids).tobytes()).hexdigest()


def write_archive(path: Path, arrays: dict, metadata: dict) -> Path:
    """Write plain arrays plus a JSON ``metadata`` blob to an ``.npz`` archive at ``path``, atomically.

    ``path`` is the file written, whatever its suffix (``numpy.savez`` writes to an open
    file, so it adds none). The file is written under a temporary name in the same folder and renamed over
    ``path``, so a reader (or a job killed mid-write) never sees half a file.
    """
    blob = np.frombuffer(json.dumps(metadata, sort_keys=True).encode("utf-8"), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, metadata=blob, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; these are ordinary files
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def read_archive(
    path: Path, names: set, what: str, error=None, optional: frozenset = frozenset()
) -> tuple[dict, dict]:
    """Read an archive written by :func:`write_archive` without unpickling anything.

    ``names``: the arrays the file must hold besides ``metadata``; ``optional``: arrays
    it may hold; any other array is an error. Failures raise ``error`` (default ModelFileError)
    with ``what`` naming the kind of file.
    """
    error = error or ModelFileError
    if not path.is_file():
        raise error(f"{what} {str(path)!r} does not exist")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"PK\x03\x04":  # every .npz is a zip archive
        raise error(f"{path}: not a dkmeans {what} (not an .npz archive)")
    try:
        with np.load(path, allow_pickle=False) as archive:
            found = set(archive.files)
            if not set(names) | {"metadata"} <= found <= set(names) | set(optional) | {"metadata"}:
                raise error(f"{path}: not a dkmeans {what} (arrays {sorted(found)})")
            arrays = {name: archive[name] for name in sorted(found - {"metadata"})}
            blob = archive["metadata"]
    except error:
        raise
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        raise error(f"{path}: damaged or truncated {what} ({exc})") from None
    except ValueError as exc:  # object arrays need pickle, which is refused
        raise error(
            f"{path}: refused to load ({exc}); dkmeans files never contain pickles"
        ) from None
    if blob.dtype != np.uint8 or blob.ndim != 1:
        raise error(f"{path}: metadata is not JSON bytes")
    try:
        meta = json.loads(blob.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{path}: metadata is not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise error(f"{path}: not a dkmeans {what}")
    return arrays, meta


def save_model(path, model: Model, metadata: dict | None = None) -> Path:
    """Write ``model`` (and JSON-serialisable ``metadata``) to ``path`` atomically.

    Parameters
    ----------
    path : str or Path
        The file to write, exactly as named (no suffix is added; ``.npz`` is the usual one).
    model : Model
    metadata : dict, optional
        Extra JSON-serialisable fields (parameters, objective, history, ...).

    Returns
    -------
    Path
        The file written.
    """
    from dkmeans._version import __version__

    path = Path(path)
    C = np.ascontiguousarray(model.centroids)
    meta = dict(metadata or {})
    meta.update(
        format=_FORMAT_NAME,
        format_version=FORMAT_VERSION,
        dkmeans_version=__version__,
        dtype=str(C.dtype),
        shape=list(C.shape),
        centroids_sha256=digest(C),
    )
    return write_archive(path, {"centroids": C}, meta)


def load_model(path) -> tuple[Model, dict]:
    """Read a model file written by :func:`save_model`.

    Returns
    -------
    model : Model
    metadata : dict

    Raises
    ------
    ModelFileError
        Missing, truncated, altered, pickled, or of an unknown format or version.
    """
    path = Path(path)
    arrays, meta = read_archive(path, {"centroids"}, "model file")
    C = arrays["centroids"]
    if meta.get("format") != _FORMAT_NAME:
        raise ModelFileError(f"{path}: not a dkmeans model file")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ModelFileError(
            f"{path}: model file format version {meta.get('format_version')!r} is not supported "
            f"(this dkmeans reads version {FORMAT_VERSION})"
        )
    if C.dtype not in (np.float32, np.float64) or C.ndim != 2 or list(C.shape) != meta.get("shape"):
        raise ModelFileError(
            f"{path}: centroids do not match the metadata (dtype {C.dtype}, shape {C.shape})"
        )
    if digest(C) != meta.get("centroids_sha256"):
        raise ModelFileError(f"{path}: centroids were altered (checksum mismatch)")
    if not np.all(np.isfinite(C)):
        raise ModelFileError(f"{path}: centroids contain NaN or infinity")
    return Model(C), meta
