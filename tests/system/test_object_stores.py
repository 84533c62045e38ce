"""Object stores read like local folders, against a real S3-compatible server (moto) on 127.0.0.1.

The fixture starts ``moto.server`` in a subprocess with authentication on (an IAM user and its key
made by the first requests), so wrong credentials are refused as a store refuses them. Fits read a
Spark folder and a CSV folder on the store, in memory and out of core, through the API, ``sweep``
and the CLI; ``predict`` writes its labelled Parquet back to the store; what cannot be read (an
unreachable endpoint, wrong credentials, a missing bucket, a glob matching nothing) ends the CLI
with exit status 2 and one line.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

import dkmeans
from dkmeans import KMeans
from dkmeans.engine.files import read_table
from dkmeans.errors import DataSourceError
from tests.faces.test_parquet_writers import (
    FEATURES,
    INIT,
    NUMBERS,
    N,
    error_lines,
    reference,
    write_spark,
)
from tests.helpers import run_cli

boto3 = pytest.importorskip("boto3")
s3fs = pytest.importorskip("s3fs")
pytest.importorskip("moto")

BUCKET = "etl"
POLICY = (
    '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}'
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """``(storage_options, s3fs filesystem)`` of a moto S3 server holding ``etl/spark/`` and ``etl/csv/``."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    # authentication on after the 3 requests that make the user, its key and its policy
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="3")
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        iam = boto3.client(
            "iam",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id="none",
            aws_secret_access_key="none",
        )
        iam.create_user(UserName="pipeline")
        key = iam.create_access_key(UserName="pipeline")["AccessKey"]
        iam.put_user_policy(UserName="pipeline", PolicyName="all", PolicyDocument=POLICY)
        options = {
            "key": key["AccessKeyId"],
            "secret": key["SecretAccessKey"],
            "endpoint_url": url,
            "client_kwargs": {"region_name": "us-east-1"},
        }
        boto3.client(
            "s3",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id=options["key"],
            aws_secret_access_key=options["secret"],
        ).create_bucket(Bucket=BUCKET)
        fs = s3fs.S3FileSystem(**options)
        local = tmp_path_factory.mktemp("upload")
        write_spark(local / "spark")
        fs.put(str(local / "spark"), f"{BUCKET}/spark", recursive=True)
        frame = pd.DataFrame(
            {"id": np.arange(N), "x": NUMBERS[:, 0], "y": NUMBERS[:, 1], "amount": NUMBERS[:, 2]}
        )
        for i, rows in enumerate((slice(0, 100), slice(100, N))):
            fs.pipe(f"{BUCKET}/csv/part-{i}.csv", frame.iloc[rows].to_csv(index=False).encode())
        yield options, fs
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_store_holds_what_a_spark_job_leaves(store):
    _, fs = store
    names = fs.find(f"{BUCKET}/spark")
    assert any(n.endswith("_SUCCESS") for n in names)
    assert any("region=eu/part-00000" in n and n.endswith(".snappy.parquet") for n in names)


@pytest.mark.parametrize("folder", ["spark", "csv"])
@pytest.mark.parametrize("out_of_core", [False, True])
def test_fit_a_folder_on_the_store_as_a_local_one(client, store, folder, out_of_core):
    options, _ = store
    df = read_table(f"s3://{BUCKET}/{folder}/", columns=FEATURES, storage_options=options)
    km = KMeans(3, init=INIT, n_init=1, out_of_core=out_of_core).fit(df)
    ref = reference()
    assert km.data_mode_ == ("out-of-core" if out_of_core else "in-memory")
    np.testing.assert_allclose(km.cluster_centers_, ref.cluster_centers_, rtol=1e-9)
    labels = km.predict(df).compute().to_numpy()
    assert sorted(np.bincount(labels)) == sorted(np.bincount(ref.labels_))


def test_sweep_reads_a_path_on_the_store(client, store):
    options, _ = store
    result = dkmeans.sweep(f"s3://{BUCKET}/csv/", [2, 3], random_state=0, storage_options=options)
    # the path's every column (id too), in the files' order: the same rows as this array
    local = dkmeans.sweep(np.column_stack([np.arange(N), NUMBERS]), [2, 3], random_state=0)
    assert list(result.models[3].feature_names_in_) == ["id", "x", "y", "amount"]
    for k in (2, 3):
        np.testing.assert_allclose(
            result.models[k].cluster_centers_, local.models[k].cluster_centers_, rtol=1e-9
        )


def test_cli_fits_and_predicts_on_the_store_writing_back(store, tmp_path):
    options, fs = store
    model = tmp_path / "model.npz"
    option_args = [
        f"--storage-option=endpoint_url={options['endpoint_url']}",
        "--storage-option",
        f"key={options['key']}",
        "--storage-option",
        f"secret={options['secret']}",
        "--storage-option",
        "client_kwargs.region_name=us-east-1",
    ]
    res = run_cli(
        "fit",
        f"s3://{BUCKET}/spark/",
        "-k",
        "3",
        "--columns",
        *FEATURES,
        "--model",
        model,
        "--workers",
        1,
        "--quiet",
        "--out-of-core",
        "true",
        *option_args,
    )
    assert res.returncode == 0, res.stderr
    ref = reference()
    fitted = KMeans.load(model).cluster_centers_
    order = np.argsort(fitted[:, 2]), np.argsort(ref.cluster_centers_[:, 2])
    np.testing.assert_allclose(fitted[order[0]], ref.cluster_centers_[order[1]], rtol=1e-6)

    options_file = tmp_path / "store.json"
    options_file.write_text(json.dumps(options))
    out = f"s3://{BUCKET}/labelled/"
    res = run_cli(
        "predict",
        model,
        f"s3://{BUCKET}/spark/",
        "--output",
        out,
        "--workers",
        1,
        "--storage-options",
        options_file,
    )
    assert res.returncode == 0, res.stderr
    assert f"written to {out} " in res.stdout  # the path as written (not s3:/...)
    back = pd.read_parquet(out, storage_options=options)
    assert len(back) == N and back["cluster"].between(0, 2).all()
    assert sorted(back["id"]) == list(range(N))


def test_cli_fits_a_small_folder_on_the_store_in_its_own_process(store, tmp_path, monkeypatch):
    """Files whose footers on the store say they are small: read and fitted in the command's
    process (no cluster started), the model the same as the cluster's fit of them."""
    options, _ = store
    options_file = tmp_path / "store.json"
    options_file.write_text(json.dumps(options))
    common = ["fit", f"s3://{BUCKET}/spark/", "-k", "3", "--columns", *FEATURES, "--json"]
    common += ["--random-state", "0", "--storage-options", options_file]
    res = run_cli(*common, "--model", tmp_path / "here.npz")
    assert res.returncode == 0, res.stderr
    assert "started a local Dask cluster" not in res.stdout + res.stderr, res.stderr
    monkeypatch.setenv("DASK_DKMEANS__IN_PROCESS_BYTES", "0")  # the same command on a cluster
    on_cluster = run_cli(*common, "--model", tmp_path / "cluster.npz", "--workers", 1)
    assert on_cluster.returncode == 0, on_cluster.stderr
    assert "started a local Dask cluster" in on_cluster.stderr
    here, there = (json.loads(r.stdout) for r in (res, on_cluster))
    for outcome in (here, there):
        outcome.pop("seconds"), outcome.pop("model")
    # the sums of other chunks: the objective to rounding
    assert here.pop("inertia") == pytest.approx(there.pop("inertia"), rel=1e-12)
    assert here == there and here["data_mode"] == "in-memory"
    ours, theirs = KMeans.load(tmp_path / "here.npz"), KMeans.load(tmp_path / "cluster.npz")
    np.testing.assert_allclose(ours.cluster_centers_, theirs.cluster_centers_, rtol=1e-12)
    ref = reference()  # and scikit-learn's fit of the same rows
    order = np.argsort(ours.cluster_centers_[:, 2]), np.argsort(ref.cluster_centers_[:, 2])
    np.testing.assert_allclose(
        ours.cluster_centers_[order[0]], ref.cluster_centers_[order[1]], rtol=1e-6
    )


def _error_line(res) -> str:
    assert res.returncode == 2, res.stdout + res.stderr
    lines = error_lines(res)
    assert len(lines) == 1, res.stderr
    return lines[0]


def test_cli_errors_of_the_store_are_one_line_exit_2(store, tmp_path):
    options, _ = store
    good = [
        f"--storage-option=endpoint_url={options['endpoint_url']}",
        f"--storage-option=key={options['key']}",
        f"--storage-option=secret={options['secret']}",
        "--storage-option=client_kwargs.region_name=us-east-1",
    ]
    fit = ["fit", "-k", "3", "--model", tmp_path / "m.npz", "--workers", 1]
    line = _error_line(run_cli(*fit, f"s3://{BUCKET}/spark/*.csv", *good))
    assert f"no file matches s3://{BUCKET}/spark/*.csv" in line
    line = _error_line(run_cli(*fit, "s3://no-such-bucket/data/", *good))
    assert "s3://no-such-bucket/data/" in line and "no such bucket 'no-such-bucket'" in line
    wrong = good[:1] + ["--storage-option=key=wrong", "--storage-option=secret=wrong", good[3]]
    line = _error_line(run_cli(*fit, f"s3://{BUCKET}/spark/", *wrong))
    assert "access denied, check the credentials" in line
    unreachable = [f"--storage-option=endpoint_url=http://127.0.0.1:{_free_port()}"] + good[1:]
    line = _error_line(run_cli(*fit, f"s3://{BUCKET}/spark/", *unreachable))
    assert "is the endpoint reachable?" in line
    line = _error_line(run_cli(*fit, f"s3://{BUCKET}/spark/", "--storage-option", "no-equals-sign"))
    assert "--storage-option takes KEY=VALUE" in line


def test_read_table_errors_name_the_path_as_written(store):
    options, _ = store
    with pytest.raises(DataSourceError, match=f"no file matches s3://{BUCKET}/nothing-\\*.parquet"):
        read_table(f"s3://{BUCKET}/nothing-*.parquet", storage_options=options)
    with pytest.raises(DataSourceError, match=f"input s3://{BUCKET}/absent/ does not exist"):
        read_table(f"s3://{BUCKET}/absent/", storage_options=options)
