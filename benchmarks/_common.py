"""Shared helpers of the benchmark scripts: where the reference data lives, JSON output."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def sipu_dir() -> Path | None:
    """``../shared/data/sipu`` beside the repository (or $DKMEANS_BENCH_DATA), if present."""
    candidates = [os.environ.get("DKMEANS_BENCH_DATA"), ROOT.parent / "shared" / "data" / "sipu"]
    for c in candidates:
        if c and Path(c).is_dir() and any(Path(c).glob("*.npz")):
            return Path(c)
    return None


def load_sipu(path: Path):
    """(X float64, labels, k) of one benchmark set."""
    with np.load(path, allow_pickle=False) as f:
        return f["X"].astype(np.float64), f["labels"], int(f["k"])


def machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def write_json(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / name
    out.write_text(json.dumps(payload, indent=2, default=float))
    return out
