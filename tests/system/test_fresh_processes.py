"""What a user meets in a fresh Python process: ``dkmeans demo`` with no traceback while kernels
compile in the background, a large NumPy fit without a client that starts no cluster, ``import
dkmeans`` that loads no matplotlib, and ``dkmeans fit --algorithm minibatch`` on Parquet."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

import dkmeans
from dkmeans import MiniBatchKMeans
from dkmeans.testing import make_blobs
from tests.helpers import loaded_after, run_cli, run_python


@pytest.fixture
def data():
    X, _, _ = make_blobs(6000, 4, 6, spread=1.0, box=10.0, seed=3)
    return X


def test_demo_prints_no_traceback(tmp_path):
    """``dkmeans demo`` in a fresh process, under the default compile rule as for a user."""
    env = dict(os.environ, DASK_DKMEANS__COMPILE="auto")
    out = run_cli(
        "demo",
        "--n-samples",
        300000,
        "--output",
        tmp_path / "out",
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    for bad in ("Traceback", "failed", "Error"):
        assert bad not in text, text


def test_large_numpy_fit_without_a_client_starts_no_cluster():
    """40 MiB of NumPy rows (above dkmeans.in-process-bytes) with no client: fitted here on threads,
    no cluster started, no scheduler changed; the result equals a fit on one thread."""
    code = textwrap.dedent("""
        import json, warnings, numpy as np, dask, distributed
        import dkmeans
        from dkmeans.testing import make_blobs
        X, _, _ = make_blobs(700_000, 8, 6, spread=1.0, box=10.0, seed=0)
        X = X.astype(np.float32)  # 21 MiB: above the limit set below
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # an EmbeddedClusterWarning would fail here
            with dask.config.set({"dkmeans.in-process-bytes": "8MiB"}):
                km = dkmeans.KMeans(6, random_state=0).fit(X)
        try:
            distributed.default_client()
            started = True
        except ValueError:
            started = False
        one = dkmeans.KMeans(6, random_state=0).fit(X)  # within the default limit: one thread
        print("RESULT " + json.dumps(dict(started=started, mode=km.data_mode_, same_iter=km.n_iter_ == one.n_iter_,
                                          diff=float(np.max(np.abs(km.cluster_centers_ - one.cluster_centers_))))))
    """)
    out = run_python(code, timeout=300)
    lines = [x for x in out.splitlines() if x.startswith("RESULT ")]
    assert lines, out
    result = json.loads(lines[0][len("RESULT ") :])
    assert not result["started"] and result["mode"] == "in-memory"
    assert (
        result["diff"] < 1e-3 and result["same_iter"]
    )  # two chunks' sums against one: rounding only


def test_import_dkmeans_loads_no_matplotlib_and_reaches_submodules_lazily():
    code = (
        "import sys, dkmeans; assert 'matplotlib' not in sys.modules; "
        "assert 'dkmeans.plot' not in sys.modules and 'dkmeans.metrics' not in sys.modules; "
        "print(dkmeans.plot.__name__, dkmeans.metrics.__name__, dkmeans.io.__name__, "
        "dkmeans.testing.__name__); "
        "assert 'matplotlib' not in sys.modules; assert 'plot' in dir(dkmeans)"
    )
    assert run_python(code).split() == [
        "dkmeans.plot",
        "dkmeans.metrics",
        "dkmeans.io",
        "dkmeans.testing",
    ]
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        dkmeans.nope  # noqa: B018


#: What importing an estimator must not load: Dask's collections, distributed, numba, pyarrow.
HEAVY = ("dask.array", "dask.dataframe", "distributed", "numba", "pyarrow")


def test_importing_the_estimators_loads_what_scikit_learns_do():
    """``from dkmeans import KMeans, MiniBatchKMeans`` (and constructing them) loads neither Dask's
    collections, distributed nor numba: the fit service is imported at the first fit. pyarrow only
    where scikit-learn's own estimator base loads it (pandas 3 imports it, scikit-learn pandas)."""
    ours = loaded_after(
        "from dkmeans import BisectingKMeans, KMeans, MiniBatchKMeans\n"
        "KMeans(3).get_params(); MiniBatchKMeans(5, batch_size=64); BisectingKMeans(2); repr(KMeans())",
        HEAVY,
    )
    theirs = loaded_after("import sklearn.base, sklearn.utils.validation", HEAVY)
    assert not {"dask.array", "dask.dataframe", "distributed", "numba"} & set(ours), ours
    assert set(ours) <= set(theirs), (ours, theirs)
    # and the estimator imported so fits: the modules it left out load at its first fit
    fitted = loaded_after(
        "import numpy as np\nfrom dkmeans import KMeans\n"
        "km = KMeans(2, random_state=0).fit(np.array([[0.0, 0], [0, 1], [9, 9], [9, 8]]))\n"
        "assert sorted(km.labels_.tolist()) == [0, 0, 1, 1], km.labels_",
        HEAVY,
    )
    assert "dask.array" in fitted


def test_cli_fit_minibatch_on_parquet(tmp_path, data):
    import pandas as pd

    pd.DataFrame(data, columns=["a", "b", "c", "d"]).to_parquet(tmp_path / "x.parquet")
    model = tmp_path / "m.dkm"
    res = run_cli(
        "fit",
        tmp_path / "x.parquet",
        "-k",
        6,
        "--algorithm",
        "minibatch",
        "--batch-size",
        512,
        "--model",
        model,
        "--random-state",
        0,
        "--workers",
        1,
        timeout=180,
    )
    assert res.returncode == 0, res.stderr
    loaded = MiniBatchKMeans.load(model)
    assert loaded.batch_size == 512 and list(loaded.feature_names_in_) == ["a", "b", "c", "d"]
