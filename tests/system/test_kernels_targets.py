"""The compiled kernels built for CPUs with narrower vector registers than this one.

The vector intrinsics (``dkmeans.kernels.backends.simd``) size their blocks of rows by the vector
width numba compiles for: 64 bytes with AVX-512, 32 with AVX2, 16 otherwise. CI runs on one
kind of CPU, so the other widths are compiled here for an older target (numba's
``NUMBA_CPU_NAME``, which this CPU can run) in a subprocess with its own cache, and checked
against a float64 brute force.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("numba")

CHECK = textwrap.dedent(
    """
    import numpy as np
    from dkmeans.kernels import assign, assign_partials
    from dkmeans.kernels.backends import simd as _simd

    print(_simd.VECTOR_BYTES)
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        for d in (3, 8, 16, 32):
            for k in (1, 5, 33):
                X = rng.normal(size=(601, d)).astype(dtype)
                C = rng.normal(size=(k, d)).astype(dtype)
                w = rng.uniform(0, 2, size=len(X))
                D = ((X.astype(np.float64)[:, None] - C.astype(np.float64)[None]) ** 2).sum(-1)
                lab = D.argmin(1)
                labels, d2 = assign(X, C)
                assert np.array_equal(labels, lab), (dtype, d, k)
                p = assign_partials(X, C, w)
                sums = np.zeros((k, d))
                np.add.at(sums, lab, X.astype(np.float64) * w[:, None])
                np.testing.assert_allclose(p.sums, sums, rtol=1e-12, atol=1e-12)
                np.testing.assert_allclose(p.counts, np.bincount(lab, w, minlength=k), rtol=1e-12)
                rtol = 1e-5 if dtype == np.float32 else 1e-12
                np.testing.assert_allclose(float(p.objective), (D.min(1) * w).sum(), rtol=rtol)
    print("ok")
    """
)


@pytest.mark.parametrize(
    "cpu, features, vector_bytes",
    [("haswell", "+avx,+avx2,+fma,+sse4.2,+popcnt,+f16c", 32), ("generic", "", 16)],
)
def test_kernels_compiled_for_narrower_vectors(tmp_path, cpu, features, vector_bytes):
    env = dict(
        os.environ, NUMBA_CPU_NAME=cpu, NUMBA_CPU_FEATURES=features, NUMBA_CACHE_DIR=str(tmp_path)
    )
    out = subprocess.run(
        [sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == [str(vector_bytes), "ok"]
