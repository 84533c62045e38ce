"""What a scheduler or a pipeline sees of a `dkmeans` command: the exit status (0 done, 2 user
error, 1 internal error, 143/130 stopped by SIGTERM/SIGINT), one line on stderr when it did not
finish, and with --json the outcome as one JSON line on stdout."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pandas as pd
import pytest

from dkmeans import KMeans, cli
from dkmeans.testing import make_blobs


@pytest.fixture(scope="module")
def parquet(tmp_path_factory):
    folder = tmp_path_factory.mktemp("outcome")
    X, _, _ = make_blobs(3000, 2, 4, spread=0.8, seed=3)
    for i in range(2):
        pd.DataFrame(X[i * 1500 : (i + 1) * 1500], columns=["a", "b"]).to_parquet(
            folder / f"part{i}.parquet"
        )
    return folder


def test_json_fit_prints_one_line_that_matches_the_model(client, parquet, tmp_path, capsys):
    model = tmp_path / "m.npz"
    status = cli.main(
        ["fit", str(parquet), "-k", "4", "--model", str(model), "--random-state", "0", "--json"]
    )
    out, err = capsys.readouterr()
    assert status == 0, err
    lines = out.splitlines()
    assert len(lines) == 1  # the human summary went to stderr
    outcome = json.loads(lines[0])
    km = KMeans.load(model)
    assert (
        outcome["command"] == "fit" and outcome["status"] == "done" and outcome["exit_status"] == 0
    )
    assert outcome["model"] == str(model) and outcome["columns"] == ["a", "b"]
    assert outcome["n_iter"] == km.n_iter_ and outcome["inertia"] == pytest.approx(
        km.inertia_, rel=1e-12
    )
    assert f"model written to {model}" in err


def test_user_error_exits_2_with_one_line_and_a_json_outcome(client, tmp_path, capsys):
    status = cli.main(
        ["fit", str(tmp_path / "missing"), "-k", "4", "--model", str(tmp_path / "m.npz"), "--json"]
    )
    out, err = capsys.readouterr()
    assert status == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("dkmeans: error: ")
    outcome = json.loads(out)
    assert outcome["status"] == "error" and outcome["exit_status"] == 2 and outcome["error"] in err


def test_internal_error_exits_1_with_one_line_naming_the_traceback_file(
    client, parquet, tmp_path, capsys, monkeypatch
):
    def broken(args):
        raise RuntimeError("an invariant broke\nsecond line")

    monkeypatch.setattr(cli, "_fit", broken)
    status = cli.main(["fit", str(parquet), "-k", "4", "--model", str(tmp_path / "m.npz")])
    _, err = capsys.readouterr()
    assert status == 1
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(
        "dkmeans: internal error: RuntimeError: an invariant broke (traceback in "
    )
    log = Path(err.split("traceback in ", 1)[1].split(";", 1)[0])
    try:
        text = log.read_text()
        assert (
            "Traceback (most recent call last)" in text
            and "in broken" in text
            and "second line" in text
        )
    finally:
        log.unlink()


@pytest.mark.parametrize("signum, expected", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_stops_the_command_with_its_status(
    client, parquet, tmp_path, capsys, monkeypatch, signum, expected
):
    """The signal arrives while the command works: one line, 128 + signal, the handlers restored."""
    before = signal.getsignal(signum)
    reached = []

    def working(args):
        signal.raise_signal(signum)
        reached.append("after the signal")  # never: the handler raised
        return 0

    monkeypatch.setattr(cli, "_fit", working)
    status = cli.main(
        ["fit", str(parquet), "-k", "4", "--model", str(tmp_path / "m.npz"), "--json"]
    )
    out, err = capsys.readouterr()
    assert status == expected and reached == []
    assert err.strip() == f"dkmeans: interrupted ({signal.Signals(signum).name})"
    assert json.loads(out) == {
        "command": "fit",
        "signal": signal.Signals(signum).name,
        "status": "interrupted",
        "exit_status": expected,
    }
    assert signal.getsignal(signum) is before


def test_the_console_script_runs_main_then_freezes_what_the_ended_command_left(tmp_path, capsys):
    from importlib.metadata import entry_points

    (script,) = entry_points(group="console_scripts", name="dkmeans")
    assert script.value == "dkmeans.cli:run"
    import gc

    gc.collect()
    before = gc.get_freeze_count()
    left = [[i] for i in range(1000)]  # objects alive when the command ends
    status = cli.run(["fit", str(tmp_path / "missing"), "-k", "4", "--model", str(tmp_path / "m")])
    assert status == 2 and "dkmeans: error: " in capsys.readouterr().err  # main's status, as main
    assert gc.get_freeze_count() >= before + len(left)
