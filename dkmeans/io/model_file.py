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


def _digest(centroids: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(centroids).tobytes()).hexdigest()


def save_model(path, model: Model, metadata: dict | None = None) -> Path:
    """Write ``model`` (and JSON-serialisable ``metadata``) to ``path`` atomically.

    Parameters
    ----------
    path : str or Path
        Destination; ``.npz`` is appended if missing.
    model : Model
    metadata : dict, optional
        Extra JSON-serialisable fields (parameters, objective, history, ...).

    Returns
    -------
    Path
        The file written.
    """
    from dkmeans import __version__

    path = Path(path)
    if path.suffix != ".npz":
        path = path.with_name(path.name + ".npz")
    C = np.ascontiguousarray(model.centroids)
    meta = dict(metadata or {})
    meta.update(
        format=_FORMAT_NAME,
        format_version=FORMAT_VERSION,
        dkmeans_version=__version__,
        dtype=str(C.dtype),
        shape=list(C.shape),
        centroids_sha256=_digest(C),
    )
    blob = np.frombuffer(json.dumps(meta, sort_keys=True).encode("utf-8"), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, centroids=C, metadata=blob)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a model file is an ordinary file
        os.replace(tmp, path)  # write, then rename: readers never see half a file
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


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
    if not path.is_file():
        raise ModelFileError(f"model file {str(path)!r} does not exist")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"PK\x03\x04":  # every .npz is a zip archive
        raise ModelFileError(f"{path}: not a dkmeans model file (not an .npz archive)")
    try:
        with np.load(path, allow_pickle=False) as archive:
            names = set(archive.files)
            if names != {"centroids", "metadata"}:
                raise ModelFileError(f"{path}: not a dkmeans model file (arrays {sorted(names)})")
            C = archive["centroids"]
            blob = archive["metadata"]
    except ModelFileError:
        raise
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        raise ModelFileError(f"{path}: damaged or truncated model file ({exc})") from None
    except ValueError as exc:  # object arrays need pickle, which is refused
        raise ModelFileError(f"{path}: refused to load ({exc}); dkmeans model files never contain pickles") from None
    if blob.dtype != np.uint8 or blob.ndim != 1:
        raise ModelFileError(f"{path}: metadata is not JSON bytes")
    try:
        meta = json.loads(blob.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFileError(f"{path}: metadata is not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT_NAME:
        raise ModelFileError(f"{path}: not a dkmeans model file")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ModelFileError(
            f"{path}: model file format version {meta.get('format_version')!r} is not supported "
            f"(this dkmeans reads version {FORMAT_VERSION})"
        )
    if C.dtype not in (np.float32, np.float64) or C.ndim != 2 or list(C.shape) != meta.get("shape"):
        raise ModelFileError(f"{path}: centroids do not match the metadata (dtype {C.dtype}, shape {C.shape})")
    if _digest(C) != meta.get("centroids_sha256"):
        raise ModelFileError(f"{path}: centroids were altered (checksum mismatch)")
    if not np.all(np.isfinite(C)):
        raise ModelFileError(f"{path}: centroids contain NaN or infinity")
    return Model(C), meta
