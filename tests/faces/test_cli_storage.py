"""The command line's storage options: repeated KEY=VALUE and a JSON file, combined."""

from __future__ import annotations

import json

import pytest

from dkmeans.cli import _storage_options, build_parser
from dkmeans.errors import InvalidParameterError


def _args(*argv):
    return build_parser().parse_args(["fit", "s3://b/data/", "-k", "2", "--model", "m.npz", *argv])


def test_key_values_are_json_where_they_parse_and_dotted_keys_nest(tmp_path):
    path = tmp_path / "store.json"
    path.write_text(
        json.dumps({"key": "from-file", "secret": "s", "client_kwargs": {"verify": False}})
    )
    args = _args(
        "--storage-options",
        str(path),
        "--storage-option",
        "key=k1",
        "--storage-option",
        "client_kwargs.region_name=eu-west-1",
        "--storage-option",
        "anon=false",
        "--storage-option",
        "endpoint_url=http://127.0.0.1:9000",
        "--storage-option",
        "retries=3",
    )
    assert _storage_options(args) == {
        "key": "k1",
        "secret": "s",
        "anon": False,
        "retries": 3,
        "endpoint_url": "http://127.0.0.1:9000",
        "client_kwargs": {"verify": False, "region_name": "eu-west-1"},
    }
    assert _storage_options(_args()) is None


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--storage-option", "novalue"], "takes KEY=VALUE"),
        (["--storage-option", "=x"], "takes KEY=VALUE"),
        (["--storage-options", "{missing}"], "cannot read"),
        (["--storage-options", "{bad}"], "is not JSON"),
        (["--storage-options", "{list}"], "must hold a JSON object"),
    ],
)
def test_bad_storage_options_are_user_errors(tmp_path, argv, fragment):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    files = {
        "missing": tmp_path / "none.json",
        "bad": tmp_path / "bad.json",
        "list": tmp_path / "list.json",
    }
    with pytest.raises(InvalidParameterError, match=fragment):
        _storage_options(_args(*[a.format(**files) for a in argv]))


def test_predict_and_evaluate_take_missing_and_storage_options():
    parser = build_parser()
    args = parser.parse_args(
        [
            "predict",
            "m.npz",
            "in/",
            "--output",
            "out/",
            "--missing",
            "skip",
            "--storage-option",
            "anon=true",
        ]
    )
    assert args.missing == "skip" and _storage_options(args) == {"anon": True}
    args = parser.parse_args(["fit", "in/", "-k", "2", "--model", "m.npz", "--missing", "skip"])
    assert args.missing == "skip"
    with pytest.raises(SystemExit):
        parser.parse_args(["evaluate", "m.npz", "in/", "--missing", "drop"])
