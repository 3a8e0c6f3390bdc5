"""roles/vllm_runtime/files/model_fetch.py's checks that need no server (the fetch itself through a real mirror:
tests/runtime/test_hub_mirror.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "roles" / "vllm_runtime" / "files" / "model_fetch.py"
spec = importlib.util.spec_from_file_location("model_fetch", SCRIPT)
model_fetch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(model_fetch)


@pytest.mark.parametrize("name", ["config.json", "model-00001-of-00030.safetensors", "original/params.json"])
def test_a_relative_name_inside_the_model_is_kept(name):
    assert model_fetch.inside(name) == name


@pytest.mark.parametrize("name", ["../etc/passwd", "/etc/passwd", "a/../../b", "a//b", "./a", "a\\b", ".fetch/x.part",
                                  "", None, 7])
def test_a_name_that_leaves_the_model_directory_is_refused(name):
    with pytest.raises(model_fetch.FetchError, match="outside the model directory"):
        model_fetch.inside(name)


def run(capsys, *argv):
    code = model_fetch.main(list(argv))
    return code, [line.split(" ", 1) for line in capsys.readouterr().out.splitlines()]


@pytest.mark.parametrize(("repo_id", "revision", "says"), [
    ("meta-llama/Llama-3.1-70B-Instruct", "main", "is not a commit id (40 hex digits)"),
    ("meta-llama/Llama-3.1-70B-Instruct", "0" * 39, "is not a commit id (40 hex digits)"),
    ("Llama-3.1-70B-Instruct", "0" * 40, "is not a hub repository id (<org>/<name>)"),
    ("a/b/c", "0" * 40, "is not a hub repository id (<org>/<name>)"),
])
def test_a_refused_argument_exits_2_before_any_request(capsys, tmp_path, repo_id, revision, says):
    code, lines = run(capsys, repo_id, revision, str(tmp_path / "dest"))
    assert code == 2 and lines[0][0] == "error" and says in json.loads(lines[0][1])["msg"]
    assert not (tmp_path / "dest").exists()


def test_a_missing_token_file_is_named_not_a_traceback(capsys, tmp_path):
    code, lines = run(capsys, "org/name", "a" * 40, str(tmp_path / "dest"), "--token-file", str(tmp_path / "none"))
    assert code == 2 and json.loads(lines[0][1])["msg"].startswith(f"cannot read the token file {tmp_path / 'none'}")


@pytest.mark.parametrize("endpoint", [None, "", "mirror:8090", "ftp://mirror"])
def test_no_endpoint_or_one_that_is_not_a_url_is_refused_naming_it(capsys, tmp_path, monkeypatch, endpoint):
    if endpoint is None:
        monkeypatch.delenv("HF_ENDPOINT", raising=False)
    else:
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
    code, lines = run(capsys, "org/name", "a" * 40, str(tmp_path / "dest"))
    msg = json.loads(lines[0][1])["msg"]
    assert code == 2 and msg.startswith(f"HF_ENDPOINT={endpoint or ''!r}: expected the hub's or the mirror's URL")
    assert not (tmp_path / "dest").exists()
