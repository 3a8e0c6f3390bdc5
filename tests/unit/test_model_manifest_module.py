"""Module model_manifest: built, verified, check mode, and the refusal naming node, file and both digests,
in-process and once through Ansible (AnsiballZ ships module_utils/model to the node's Python)."""

import hashlib
import json
import os

import pytest
from ansible.module_utils import basic
from ansible_collections.vllm_ops.cluster.plugins.modules import model_manifest
from test_facts_modules import run_local_tasks

NODE = "node-b"


def run_module(monkeypatch, capsys, check_mode=False, **args):
    """One module run in this process: (failed, result)."""
    args = {"node": NODE, **args, "_ansible_check_mode": check_mode}
    monkeypatch.setattr(basic, "_ANSIBLE_ARGS", json.dumps({"ANSIBLE_MODULE_ARGS": args}).encode())
    monkeypatch.setattr(basic, "_ANSIBLE_PROFILE", "legacy")
    with pytest.raises(SystemExit) as exited:
        model_manifest.main()
    result = json.loads(capsys.readouterr().out)
    return exited.value.code != 0, result


@pytest.fixture
def model(tmp_path):
    root = tmp_path / "model"
    root.mkdir()
    (root / "config.json").write_text('{"model_type": "llama"}\n')
    (root / "model.safetensors").write_bytes(os.urandom(50_000))
    return root


def test_built_writes_the_manifest_once_and_check_mode_writes_nothing(model, tmp_path, monkeypatch, capsys):
    manifest = tmp_path / "out" / "model.manifest.json"
    failed, preview = run_module(monkeypatch, capsys, check_mode=True, state="built", path=str(model),
                                 manifest=str(manifest))
    assert not failed and preview["changed"] and not manifest.exists()
    failed, built = run_module(monkeypatch, capsys, state="built", path=str(model), manifest=str(manifest))
    assert not failed and built["changed"] and built["digest"] == preview["digest"]
    written = json.loads(manifest.read_text())
    assert written["digest"] == built["digest"] and built["files"] == 2 and built["total_bytes"] == 50_024
    assert oct(manifest.stat().st_mode & 0o777) == "0o644"
    failed, again = run_module(monkeypatch, capsys, state="built", path=str(model), manifest=str(manifest))
    assert not failed and not again["changed"]


def test_a_manifest_inside_the_model_is_left_out_of_it(model, monkeypatch, capsys):
    manifest = model / "manifest.json"
    _, first = run_module(monkeypatch, capsys, state="built", path=str(model), manifest=str(manifest))
    _, second = run_module(monkeypatch, capsys, state="built", path=str(model), manifest=str(manifest))
    assert first["files"] == 2 and not second["changed"] and second["digest"] == first["digest"]
    _, verified = run_module(monkeypatch, capsys, path=str(model), manifest=str(manifest))
    assert verified["extras"] == [{"kind": "extra", "path": "manifest.json", "expected_size": None,
                                   "found_size": manifest.stat().st_size, "expected_sha256": None,
                                   "found_sha256": None,
                                   "message": f"host {NODE}: manifest.json: extra: not in the manifest "
                                              f"({manifest.stat().st_size} bytes)"}]


def test_verified_fails_naming_node_file_and_both_digests(model, tmp_path, monkeypatch, capsys):
    manifest = tmp_path / "model.manifest.json"
    _, built = run_module(monkeypatch, capsys, state="built", path=str(model), manifest=str(manifest))
    failed, healthy = run_module(monkeypatch, capsys, check_mode=True, path=str(model), manifest=str(manifest))
    assert not failed and healthy["problems"] == [] and healthy["checked_bytes"] == 50_024
    shard = model / "model.safetensors"
    expected = hashlib.sha256(shard.read_bytes()).hexdigest()
    data = bytearray(shard.read_bytes())
    data[40_000] ^= 0xFF
    shard.write_bytes(bytes(data))
    found = hashlib.sha256(bytes(data)).hexdigest()
    failed, size_only = run_module(monkeypatch, capsys, path=str(model), manifest=str(manifest), size_only=True)
    assert not failed and size_only["checked_bytes"] == 0  # same size: the cheap check cannot see it
    failed, result = run_module(monkeypatch, capsys, path=str(model), manifest=str(manifest))
    assert failed and not result["changed"]
    assert [(p["kind"], p["path"]) for p in result["problems"]] == [("corrupt", "model.safetensors")]
    for text in (f"host {NODE}: model.safetensors: corrupt", expected, found, built["digest"]):
        assert text in result["msg"], text
    (model / "config.json").unlink()
    failed, cheap = run_module(monkeypatch, capsys, path=str(model), manifest=str(manifest), size_only=True)
    assert failed and [(p["kind"], p["path"]) for p in cheap["problems"]] == [("missing", "config.json")]


def test_unusable_inputs_fail_naming_the_node(model, tmp_path, monkeypatch, capsys):
    failed, result = run_module(monkeypatch, capsys, path=str(model), manifest=str(tmp_path / "absent.json"))
    assert failed and result["msg"] == f"host {NODE}: no manifest at {tmp_path / 'absent.json'}"
    edited = tmp_path / "edited.json"
    run_module(monkeypatch, capsys, state="built", path=str(model), manifest=str(edited))
    edited.write_text(edited.read_text().replace('"size": 50000', '"size": 50001'))
    failed, result = run_module(monkeypatch, capsys, path=str(model), manifest=str(edited))
    assert failed and result["msg"].startswith(f"host {NODE}: the manifest {edited}:") and "edited" in result["msg"]
    failed, result = run_module(monkeypatch, capsys, state="built", path=str(model),
                                manifest=str(tmp_path / "hub.json"), hub_sha256={"model.safetensors": "0" * 64})
    assert failed and result["msg"].startswith(f"host {NODE}: model.safetensors: sha256 ")
    assert result["msg"].endswith("where the hub's is " + "0" * 64) and not (tmp_path / "hub.json").exists()


def test_through_ansible_on_the_nodes_python(model, tmp_path):
    manifest = tmp_path / "model.manifest.json"
    common = {"path": str(model), "manifest": str(manifest), "node": "{{ inventory_hostname }}"}
    tasks = [
        {"name": "build", "vllm_ops.cluster.model_manifest": dict(common, state="built")},
        {"name": "verify", "vllm_ops.cluster.model_manifest": common},
        {"name": "corrupt", "ansible.builtin.copy": {"dest": str(model / "config.json"), "content": "{}\n"}},
        {"name": "verify again", "vllm_ops.cluster.model_manifest": common, "ignore_errors": True},
    ]
    result = run_local_tasks(tmp_path, tasks)
    assert result["build"]["changed"] and result["verify"]["problems"] == []
    assert result["verify"]["digest"] == result["build"]["digest"] == json.loads(manifest.read_text())["digest"]
    failed = result["verify again"]
    assert failed["failed"] and [(p["kind"], p["path"]) for p in failed["problems"]] == [("short", "config.json")]
    assert "host localhost: config.json: short: expected 24 bytes" in failed["msg"]


def test_built_without_a_manifest_file_returns_the_document_and_writes_nothing(model, tmp_path, monkeypatch, capsys):
    failed, built = run_module(monkeypatch, capsys, state="built", path=str(model))
    assert not failed and not built["changed"] and built["manifest"] is None
    assert built["document"]["digest"] == built["digest"]
    assert sorted(entry["path"] for entry in built["document"]["files"]) == ["config.json", "model.safetensors"]
    assert sorted(os.listdir(tmp_path)) == ["model"]


def test_room_counts_only_what_is_still_to_fetch_and_refuses_naming_node_path_and_need(model, tmp_path,
                                                                                       monkeypatch, capsys):
    _, built = run_module(monkeypatch, capsys, state="built", path=str(model))
    document = built["document"]
    target = tmp_path / "nodes" / "srv" / "models" / "m"  # not there yet: its nearest parent's filesystem counts
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize

    failed, fits = run_module(monkeypatch, capsys, state="room", path=str(target), document=document,
                              margin_min_bytes=0)
    assert not failed and fits["need_bytes"] == document["total_bytes"] + 2502  # 5 % of 50,024, rounded up
    assert fits["free_bytes"] == pytest.approx(free, rel=0.01)

    failed, refused = run_module(monkeypatch, capsys, state="room", path=str(target), document=document,
                                 margin_min_bytes=free + 1)
    assert failed and not refused["fits"] and refused["free_bytes"] < refused["need_bytes"]
    assert refused["msg"].startswith(f"host {NODE}: {target} needs ") and "before any download" in refused["msg"]

    # A complete copy needs no room, however small the disk.
    failed, complete = run_module(monkeypatch, capsys, state="room", path=str(model), document=document,
                                  margin_min_bytes=free + 1)
    assert not failed and complete["remaining_bytes"] == 0 and "nothing to fetch" in complete["msg"]


def test_room_from_a_hub_listing_counts_the_files_already_complete_and_refuses_a_bad_size(model, tmp_path,
                                                                                          monkeypatch, capsys):
    sizes = {"config.json": 24, "model.safetensors": 50_000, "model-2.safetensors": 70_000}
    failed, fits = run_module(monkeypatch, capsys, state="room", path=str(model), sizes=sizes, margin_min_bytes=0)
    # config.json and model.safetensors are there at their listed sizes: only model-2 is still to fetch.
    assert not failed and fits["remaining_bytes"] == 70_000 and fits["need_bytes"] == 70_000 + 6002
    failed, refused = run_module(monkeypatch, capsys, state="room", path=str(model),
                                 sizes={**sizes, "model.safetensors": 60_000}, margin_min_bytes=10 ** 15)
    assert failed and refused["remaining_bytes"] == 130_000 and "before any download" in refused["msg"]
    failed, bad = run_module(monkeypatch, capsys, state="room", path=str(model), sizes={"config.json": -1})
    assert failed and bad["msg"] == f"host {NODE}: the manifest: the size of config.json must be a whole number " \
                                    "of bytes of at least 0, not -1"


def test_room_reads_a_manifest_file_and_refuses_without_one(model, tmp_path, monkeypatch, capsys):
    manifest = tmp_path / "m.json"
    run_module(monkeypatch, capsys, state="built", path=str(model), manifest=str(manifest))
    failed, fits = run_module(monkeypatch, capsys, state="room", path=str(tmp_path / "new"), manifest=str(manifest),
                              margin_min_bytes=0)
    assert not failed and fits["remaining_bytes"] == 50_024
    failed, missing = run_module(monkeypatch, capsys, state="room", path=str(tmp_path / "new"),
                                 manifest=str(tmp_path / "absent.json"))
    assert failed and missing["msg"] == f"host {NODE}: no manifest at {tmp_path / 'absent.json'}"
