"""The command line in process: model files, help for every option, and main() with a scheduler
(the commands run in processes of their own are in ``tests/system/test_cli_commands.py``)."""

from __future__ import annotations

import argparse
import logging

import numpy as np
import pytest

from dkmeans import KMeans
from dkmeans.io import ModelFileError, load_model, save_model
from dkmeans.model import Model


def test_model_file_round_trip_and_damage(tmp_path):
    C = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    path = save_model(tmp_path / "m", Model(C), {"objective": 1.5})
    assert path == tmp_path / "m" and sorted(p.name for p in tmp_path.iterdir()) == [
        "m"
    ]  # no suffix added
    model, meta = load_model(path)
    np.testing.assert_array_equal(model.centroids, C)
    assert model.centroids.dtype == np.float32 and meta["objective"] == 1.5
    raw = path.read_bytes()
    (tmp_path / "trunc.npz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ModelFileError, match="damaged or truncated"):
        load_model(tmp_path / "trunc.npz")
    np.savez(
        tmp_path / "pickled.npz",
        centroids=np.array([{"a": 1}], dtype=object),
        metadata=np.zeros(1, np.uint8),
    )
    with pytest.raises(ModelFileError, match="pickle"):
        load_model(tmp_path / "pickled.npz")
    with pytest.raises(ModelFileError, match="does not exist"):
        load_model(tmp_path / "missing.npz")


def test_estimator_save_writes_the_file_named(client, tmp_path):
    X = np.random.default_rng(1).normal(size=(200, 3))
    km = KMeans(3, random_state=0).fit(X)
    assert km.save(tmp_path / "m.model") == tmp_path / "m.model"
    assert km.save(str(tmp_path / "plain")) == tmp_path / "plain"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.model", "plain"]
    for name in ("m.model", "plain"):
        loaded = KMeans.load(tmp_path / name)
        np.testing.assert_array_equal(loaded.cluster_centers_, km.cluster_centers_)
        np.testing.assert_array_equal(loaded.predict(X), km.labels_)


def _options_without_help(parser, name="dkmeans"):
    """``command option`` for every argument of ``parser`` and its subcommands' parsers that has no help."""
    missing = []
    for action in parser._actions:
        if not action.help or action.help == argparse.SUPPRESS:
            missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
        if isinstance(action, argparse._SubParsersAction):
            for command, sub in action.choices.items():
                missing += _options_without_help(sub, f"{name} {command}")
    return missing


def test_every_option_has_help():
    from dkmeans.cli import build_parser

    parser = build_parser()
    assert _options_without_help(parser) == []
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(commands) == {
        "fit",
        "sweep",
        "bisect",
        "predict",
        "evaluate",
        "demo",
        "warm-up",
    }  # walked too
    demo_help = {a.option_strings[0]: a.help for a in commands["demo"]._actions if a.option_strings}
    for option, default in (
        ("--n-samples", "3000000"),
        ("--n-features", "8"),
        ("--chunk-rows", "250000"),
        ("--max-iter", "100"),
        ("--tol", "0.0001"),
        ("--seed", "0"),
        ("--spread", "2.0"),
    ):
        assert demo_help[option].endswith(f"(default {default})"), demo_help[option]


def test_main_closes_the_client_it_opened(client, parquet_dir, monkeypatch, capsys):
    """``--scheduler``: main() disconnects before returning and leaves no logging handler behind.

    A client left open kept trying to reconnect after the test session's cluster closed, and
    logged through a handler bound to a stream pytest had closed by then: ``make test`` ended
    in "--- Logging error --- ... ValueError: I/O operation on closed file".
    """
    import distributed

    from dkmeans.cli import main

    opened = []

    class Recording(distributed.Client):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            opened.append(self)

    monkeypatch.setattr(distributed, "Client", Recording)
    root, dkmeans_logger = logging.getLogger(), logging.getLogger("dkmeans")
    before = list(root.handlers), list(dkmeans_logger.handlers)
    root_dir, _ = parquet_dir
    code = main(
        [
            "fit",
            str(root_dir / "data.csv"),
            "-k",
            "4",
            "--exclude",
            "truth",
            "--model",
            str(root_dir / "closed.dkm"),
            "--scheduler",
            client.scheduler.address,
            "--quiet",
        ]
    )
    assert code == 0, capsys.readouterr().err
    assert len(opened) == 1 and opened[0].status == "closed"
    assert (list(root.handlers), list(dkmeans_logger.handlers)) == before
    assert client.status == "running"  # the scheduler it connected to is untouched


def test_warm_up_loads_the_compiled_kernels(monkeypatch, capsys):
    """``dkmeans warm-up`` runs the compiled loops of each dtype and width once (numba's disk cache
    keeps them for later processes); this process then counts them as loaded, so that its small
    fits of those rows take them."""
    import json

    import numpy as np

    from dkmeans.cli import main
    from dkmeans.kernels import plans

    monkeypatch.setattr(plans, "_loaded", set())
    assert main(["warm-up", "--n-features", "3", "--json"]) == 0
    outcome = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert outcome["status"] == "done" and outcome["n_features"] == [3]
    assert (
        plans.loaded(np.float32, 3)
        and plans.loaded(np.float64, 3)
        and not plans.loaded(np.float32, 4)
    )
    assert main(["warm-up", "--n-features", "0"]) == 2


def test_warm_up_runs_the_size_caps_loops(monkeypatch):
    """``dkmeans warm-up`` runs the capped assignment's compiled loops once per dtype (priced
    choice, margins, partials, exchange lists, the caller's moves), compiled after it."""
    import numpy as np

    from dkmeans import kernels
    from dkmeans.cli import main
    from dkmeans.kernels import plans, warm
    from dkmeans.kernels.backends import compiled_capacitated

    seen = []

    def spy(dtype):
        seen.append(np.dtype(dtype))
        assert kernels.plans.compiled_allowed()
        return kernels.capacitated.warm_up(dtype)

    monkeypatch.setattr(plans, "_loaded", set())
    monkeypatch.setattr(warm, "warm_up_capacitated", spy)
    assert main(["warm-up", "--n-features", "3"]) == 0
    assert seen == [np.dtype(np.float32), np.dtype(np.float64)]
    for loop in ("best_rows", "partial_rows", "exchange_rows", "exchange_flow"):
        assert getattr(compiled_capacitated, loop).signatures, loop
