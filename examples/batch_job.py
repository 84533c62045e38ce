"""A batch job: the command line end to end, as a scheduler would run it
=====================================================================

Run: .venv/bin/python examples/batch_job.py [WORKDIR]
Calls ``dkmeans fit`` / ``predict`` / ``evaluate`` in subprocesses (what an sbatch script
or a Kubernetes job runs), checking each exit status. Add ``--scheduler tcp://HOST:8786``
to run them on an existing Dask cluster instead of a local one.
"""

import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from dkmeans.testing import make_blobs


def run(*args: str) -> None:
    cmd = [sys.executable, "-m", "dkmeans", *args]
    print("$ dkmeans " + " ".join(args), flush=True)
    subprocess.run(cmd, check=True)


def main(workdir: str | None = None) -> None:
    folder = Path(workdir or tempfile.mkdtemp(prefix="dkmeans-batch-"))
    X, truth, _ = make_blobs(50_000, 3, 6, spread=1.0, seed=11)
    data = pd.DataFrame(X, columns=["f0", "f1", "f2"]).assign(label=truth)
    data.to_csv(folder / "points.csv", index=False)

    run(
        "fit",
        str(folder / "points.csv"),
        "-k",
        "6",
        "--exclude",
        "label",
        "--random-state",
        "1",
        "--model",
        str(folder / "model.npz"),
        "--workers",
        "2",
        "--quiet",
    )
    run(
        "predict",
        str(folder / "model.npz"),
        str(folder / "points.csv"),
        "--output",
        str(folder / "labelled"),
        "--workers",
        "2",
    )
    run(
        "evaluate",
        str(folder / "model.npz"),
        str(folder / "points.csv"),
        "--truth-column",
        "label",
        "--workers",
        "2",
    )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
