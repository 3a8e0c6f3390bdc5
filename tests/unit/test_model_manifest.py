"""A model revision's manifest: built from the bytes, checked on a node, refused where the hub disagrees."""

import hashlib
import json
import os

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.model import manifest as mf

HOST = "node-b"


def make_model(root, files=None):
    """A small model directory: two shards (one over a hashing chunk in the tests that pass a small chunk),
    a config, a nested tokenizer file and huggingface_hub's download state, which is not the model."""
    files = files or {
        "config.json": b'{"model_type": "llama"}\n',
        "model-00001-of-00002.safetensors": os.urandom(300_000),
        "model-00002-of-00002.safetensors": os.urandom(70_001),
        "tokenizer/tokenizer.json": b'{"version": "1.0"}',
    }
    for relative, data in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (root / ".cache" / "huggingface" / "download").mkdir(parents=True)
    (root / ".cache" / "huggingface" / "download" / "config.json.metadata").write_text("abc\n1700000000.1\n")
    return {relative: hashlib.sha256(data).hexdigest() for relative, data in files.items()}


def flip_one_byte(path, offset):
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0x01]))


@pytest.fixture
def model(tmp_path):
    root = tmp_path / "model"
    digests = make_model(root)
    return root, digests


def test_file_sha256_is_hashlib_sha256_whatever_the_chunk(tmp_path):
    path = tmp_path / "blob"
    data = os.urandom(100_003)
    path.write_bytes(data)
    for chunk in (1, 4096, 65_536, 100_003, mf.CHUNK_BYTES):
        assert mf.file_sha256(str(path), chunk) == hashlib.sha256(data).hexdigest()
    (tmp_path / "empty").write_bytes(b"")
    assert mf.file_sha256(str(tmp_path / "empty")) == hashlib.sha256(b"").hexdigest()


def test_the_manifest_lists_every_file_sorted_with_size_and_sha256(model):
    root, digests = model
    built = mf.build_manifest(str(root), HOST, chunk_bytes=65_536)
    assert [entry["path"] for entry in built["files"]] == sorted(digests)  # .cache/ is not the model
    assert {entry["path"]: entry["sha256"] for entry in built["files"]} == digests
    assert {entry["path"]: entry["size"] for entry in built["files"]} == {
        path: (root / path).stat().st_size for path in digests}
    assert built["total_bytes"] == sum((root / path).stat().st_size for path in digests)
    assert not any(entry["hub"] for entry in built["files"])
    assert mf.load_manifest(json.dumps(built)) == built


def test_the_digest_is_stable_and_sees_any_change(model, tmp_path):
    root, _ = model
    serial = mf.build_manifest(str(root), HOST, workers=1)
    parallel = mf.build_manifest(str(root), "node-c", workers=4, chunk_bytes=4096)
    assert serial["digest"] == parallel["digest"] and serial == parallel
    # The same bytes elsewhere, hub-checked or not: the same digest.
    copy = tmp_path / "copy"
    for entry in serial["files"]:
        (copy / entry["path"]).parent.mkdir(parents=True, exist_ok=True)
        (copy / entry["path"]).write_bytes((root / entry["path"]).read_bytes())
    hub = {"model-00001-of-00002.safetensors": serial["files"][1]["sha256"].upper()}
    assert mf.build_manifest(str(copy), HOST, hub_sha256=hub)["digest"] == serial["digest"]
    flip_one_byte(copy / "config.json", 3)
    assert mf.build_manifest(str(copy), HOST)["digest"] != serial["digest"]
    # A file renamed: same bytes, another manifest.
    (root / "config.json").rename(root / "config2.json")
    assert mf.build_manifest(str(root), HOST)["digest"] != serial["digest"]


def test_a_healthy_copy_has_no_problem(model):
    root, _ = model
    built = mf.build_manifest(str(root), HOST)
    assert mf.size_problems(str(root), built, HOST) == []
    result = mf.verify_directory(str(root), built, HOST)
    assert result == {"problems": [], "extras": [], "checked_bytes": built["total_bytes"]}


def test_a_corrupted_byte_is_found_naming_node_file_and_both_digests(model):
    root, _ = model
    built = mf.build_manifest(str(root), HOST)
    shard = "model-00001-of-00002.safetensors"
    flip_one_byte(root / shard, 299_999)  # the last byte: past the first chunk
    assert mf.size_problems(str(root), built, HOST) == []  # the size check cannot see it
    problems = mf.verify_directory(str(root), built, HOST, chunk_bytes=65_536)["problems"]
    found = hashlib.sha256((root / shard).read_bytes()).hexdigest()
    expected = next(entry["sha256"] for entry in built["files"] if entry["path"] == shard)
    assert [(p["kind"], p["path"], p["found_sha256"], p["expected_sha256"]) for p in problems] == [
        ("corrupt", shard, found, expected)]
    message = problems[0]["message"]
    assert message.startswith(f"host {HOST}: {shard}: corrupt:")
    assert found in message and expected in message and "300000 bytes" in message


def test_a_truncated_file_and_a_missing_one_are_found(model):
    root, _ = model
    built = mf.build_manifest(str(root), HOST)
    shard = root / "model-00001-of-00002.safetensors"
    with open(shard, "r+b") as handle:
        handle.truncate(123_456)
    (root / "tokenizer" / "tokenizer.json").unlink()
    (root / "config.json").write_bytes((root / "config.json").read_bytes() + b" ")
    expected_kinds = [("long", "config.json", 25), ("short", shard.name, 123_456),
                      ("missing", "tokenizer/tokenizer.json", None)]
    cheap = mf.size_problems(str(root), built, HOST)
    assert [(p["kind"], p["path"], p["found_size"]) for p in cheap] == expected_kinds
    assert all(p["found_sha256"] is None for p in cheap)
    full = mf.verify_directory(str(root), built, HOST)["problems"]
    assert [(p["kind"], p["path"], p["found_size"]) for p in full] == expected_kinds
    short = full[1]
    assert short["found_sha256"] == hashlib.sha256(shard.read_bytes()).hexdigest()
    assert "expected 300000 bytes" in short["message"] and "found 123456 bytes" in short["message"]
    assert short["found_sha256"] in short["message"] and short["expected_sha256"] in short["message"]
    assert full[2]["message"] == (f"host {HOST}: tokenizer/tokenizer.json: missing: expected 18 bytes, sha256 "
                                  f"{full[2]['expected_sha256']}; found nothing")
    assert mf.complete_bytes(str(root), built) == (root / "model-00002-of-00002.safetensors").stat().st_size


def test_extra_files_are_reported_apart_and_are_problems_only_when_asked(model):
    root, _ = model
    built = mf.build_manifest(str(root), HOST)
    (root / "notes.txt").write_text("left here by hand\n")
    result = mf.verify_directory(str(root), built, HOST)
    assert result["problems"] == []
    assert [(e["kind"], e["path"], e["found_size"]) for e in result["extras"]] == [("extra", "notes.txt", 18)]
    strict = mf.verify_directory(str(root), built, HOST, extras_are_problems=True)
    assert [p["path"] for p in strict["problems"]] == ["notes.txt"]
    assert strict["problems"][0]["message"].startswith(f"host {HOST}: notes.txt: extra:")


def test_a_missing_directory_lists_every_file_missing(model, tmp_path):
    root, digests = model
    built = mf.build_manifest(str(root), HOST)
    result = mf.verify_directory(str(tmp_path / "absent"), built, HOST)
    assert [p["kind"] for p in result["problems"]] == ["missing"] * len(digests)
    assert mf.complete_bytes(str(tmp_path / "absent"), built) == 0


def test_the_hub_digest_is_recorded_and_bytes_that_disagree_are_refused(model):
    root, digests = model
    shard = "model-00002-of-00002.safetensors"
    built = mf.build_manifest(str(root), HOST, hub_sha256={shard: digests[shard]})
    assert [entry["path"] for entry in built["files"] if entry["hub"]] == [shard]
    wrong = "0" * 64
    with pytest.raises(mf.ManifestError) as refused:
        mf.build_manifest(str(root), HOST, hub_sha256={shard: wrong})
    assert str(refused.value) == (f"host {HOST}: {shard}: sha256 {digests[shard]} (70001 bytes) "
                                  f"where the hub's is {wrong}")
    with pytest.raises(mf.ManifestError, match=rf"host {HOST}: model-00003-of-00003.safetensors: the hub lists it"):
        mf.build_manifest(str(root), HOST, hub_sha256={"model-00003-of-00003.safetensors": wrong})
    for bad in ({shard: "abc"}, {"../etc/passwd": wrong}, {"/abs": wrong}):
        with pytest.raises(mf.ManifestError):
            mf.build_manifest(str(root), HOST, hub_sha256=bad)


def test_what_cannot_be_a_manifest_is_refused(model, tmp_path):
    root, _ = model
    with pytest.raises(mf.ManifestError, match=f"host {HOST}: .* is not a directory"):
        mf.build_manifest(str(tmp_path / "absent"), HOST)
    (tmp_path / "empty").mkdir()
    with pytest.raises(mf.ManifestError, match=f"host {HOST}: .* holds no file"):
        mf.build_manifest(str(tmp_path / "empty"), HOST)
    os.symlink(tmp_path / "nowhere", root / "dangling.safetensors")
    with pytest.raises(mf.ManifestError, match=f"host {HOST}: dangling.safetensors: a link to nothing"):
        mf.build_manifest(str(root), HOST)
    (root / "dangling.safetensors").unlink()
    built = mf.build_manifest(str(root), HOST)
    edited = json.loads(json.dumps(built))
    edited["files"][0]["size"] += 1
    with pytest.raises(mf.ManifestError, match="edited or truncated"):
        mf.load_manifest(edited)
    twice = dict(built, files=built["files"] + built["files"][:1])
    twice["digest"] = mf.manifest_digest(twice["files"])
    with pytest.raises(mf.ManifestError, match="listed twice"):
        mf.load_manifest(twice)
    escaping = dict(built, files=[dict(built["files"][0], path="../outside")])
    escaping["digest"] = mf.manifest_digest(escaping["files"])
    with pytest.raises(mf.ManifestError, match="not a path inside"):
        mf.load_manifest(escaping)
    for text in ("{", "[]", json.dumps(dict(built, format=2)), json.dumps(dict(built, files=[]))):
        with pytest.raises(mf.ManifestError):
            mf.load_manifest(text)


def test_a_linked_file_counts_as_its_target_and_excluded_paths_are_left_out(model, tmp_path):
    """huggingface_hub's cache holds a snapshot as links into blobs/: the manifest is of the bytes."""
    root, digests = model
    blob = tmp_path / "blob"
    blob.write_bytes(b"generation config")
    os.symlink(blob, root / "generation_config.json")
    (root / "manifest.json").write_text("{}")
    built = mf.build_manifest(str(root), HOST, exclude=("manifest.json",))
    entries = {entry["path"]: entry for entry in built["files"]}
    assert "manifest.json" not in entries and set(entries) == set(digests) | {"generation_config.json"}
    assert entries["generation_config.json"]["sha256"] == hashlib.sha256(b"generation config").hexdigest()
