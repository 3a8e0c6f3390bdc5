"""A model revision's manifest: every file under the model directory (relative path, size, sha256), sorted.

Built once where the bytes arrive first, then checked on every node before vLLM starts. The
manifest's own digest covers only paths, sizes and sha256s, so the same bytes give the same
digest wherever and however the manifest was built; a runtime stamp can include it and see a
changed shard on the next run. Where the hub publishes an LFS sha256 for a file, the manifest
is built against it and refused when the bytes disagree.

Pure Python, no Ansible import.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from concurrent.futures import ThreadPoolExecutor

FORMAT = 1
# 8 MiB reads: few syscalls, and hashlib releases the GIL while it hashes a buffer this size.
CHUNK_BYTES = 8 * 1024 * 1024
# Threads hashing files at once (disk-bound beyond a few; hashing itself runs outside the GIL).
DEFAULT_WORKERS = 4
# Top-level directories that are not the model: huggingface_hub's download state (locks, .incomplete
# files, metadata with timestamps), a git checkout's own, and model_fetch.py's parts of files cut short.
IGNORED_DIRS = (".cache", ".git", ".fetch")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class ManifestError(Exception):
    """A manifest that cannot be built or read: the message names the node and the file."""


def file_sha256(path: str, chunk_bytes: int = CHUNK_BYTES) -> str:
    """sha256 of one file, read in chunk_bytes into one reused buffer (what hashlib.file_digest does, with a
    buffer of our size, and on Python 3.10 nodes too)."""
    hasher = hashlib.sha256()
    buffer = bytearray(chunk_bytes)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while size := handle.readinto(buffer):
            hasher.update(view[:size])
    return hasher.hexdigest()


def check_relative(path: str) -> str:
    """A manifest path: relative, '/'-separated, no '.' or '..' part (never outside the model directory)."""
    parts = path.split("/")
    if not path or path.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise ManifestError(f"not a path inside the model directory: {path!r}")
    return path


def list_files(root: str, exclude: tuple[str, ...] = ()) -> dict[str, int]:
    """{relative path: size} of every regular file under root (links followed to their file), sorted; the
    IGNORED_DIRS at the top and the relative paths in exclude left out. A link to nothing, or to something
    that is not a file, is an error: vLLM would fail on it."""
    found = {}
    for directory, subdirs, names in os.walk(root):
        relative_dir = os.path.relpath(directory, root)
        if relative_dir == ".":
            subdirs[:] = [name for name in subdirs if name not in IGNORED_DIRS]
        subdirs.sort()
        for name in names:
            relative = name if relative_dir == "." else f"{relative_dir.replace(os.sep, '/')}/{name}"
            if relative in exclude:
                continue
            try:
                info = os.stat(os.path.join(directory, name))
            except FileNotFoundError as error:
                raise ManifestError(f"{relative}: a link to nothing ({error.filename})") from error
            if not stat.S_ISREG(info.st_mode):
                raise ManifestError(f"{relative}: not a regular file")
            found[relative] = info.st_size
    return dict(sorted(found.items()))


def manifest_digest(files: list[dict]) -> str:
    """sha256 of the manifest's format and its (path, size, sha256) entries, in path order: stable across
    hosts, builds and JSON formatting."""
    entries = sorted((entry["path"], entry["size"], entry["sha256"]) for entry in files)
    canonical = json.dumps({"format": FORMAT, "files": entries}, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _hash_all(root: str, paths: list[str], workers: int, chunk_bytes: int) -> dict[str, str]:
    def one(relative):
        return relative, file_sha256(os.path.join(root, relative), chunk_bytes)

    if workers <= 1 or len(paths) <= 1:
        return dict(map(one, paths))
    with ThreadPoolExecutor(max_workers=min(workers, len(paths))) as pool:
        return dict(pool.map(one, paths))


def normalise_hub_digests(hub_sha256: dict | None) -> dict[str, str]:
    """The hub's {path: LFS sha256}, checked: paths inside the model, digests 64 hex digits (lower case)."""
    hub = {}
    for path, digest in (hub_sha256 or {}).items():
        value = str(digest).strip().lower()
        if not _SHA256.match(value):
            raise ManifestError(f"{path}: the hub's sha256 {digest!r} is not 64 hex digits")
        hub[check_relative(path)] = value
    return hub


def build_manifest(root: str, host: str, hub_sha256: dict | None = None, exclude: tuple[str, ...] = (),
                   workers: int = DEFAULT_WORKERS, chunk_bytes: int = CHUNK_BYTES) -> dict:
    """The manifest of the directory root on host: {format, digest, total_bytes, files: [{path, size, sha256,
    hub}]}; `hub` is true where the hub's LFS sha256 was given and matched. Refused (ManifestError, every
    problem on its own line) for an empty or unreadable directory, a file the hub lists and the directory
    lacks, or bytes whose sha256 is not the hub's."""
    if not os.path.isdir(root):
        raise ManifestError(f"host {host}: {root} is not a directory")
    hub = normalise_hub_digests(hub_sha256)
    try:
        sizes = list_files(root, exclude)
        if not sizes:
            raise ManifestError(f"{root} holds no file")
        digests = _hash_all(root, list(sizes), workers, chunk_bytes)
    except ManifestError as error:
        raise ManifestError(f"host {host}: {error}") from error
    except OSError as error:
        raise ManifestError(f"host {host}: cannot read {error.filename}: {error.strerror}") from error
    problems = [f"host {host}: {path}: the hub lists it (sha256 {digest}), {root} lacks it"
                for path, digest in hub.items() if path not in sizes]
    problems += [f"host {host}: {path}: sha256 {digests[path]} ({sizes[path]} bytes) where the hub's is {hub[path]}"
                 for path in sizes if path in hub and hub[path] != digests[path]]
    if problems:
        raise ManifestError("\n".join(problems))
    files = [{"path": path, "size": size, "sha256": digests[path], "hub": path in hub} for path, size in sizes.items()]
    return {"format": FORMAT, "digest": manifest_digest(files), "total_bytes": sum(sizes.values()), "files": files}


def load_manifest(document) -> dict:
    """A manifest read back (a dict, or its JSON text), checked: the format, every entry, no path twice, and the
    digest it carries is the digest of its entries (an edited manifest is refused)."""
    if isinstance(document, (str, bytes)):
        try:
            document = json.loads(document)
        except ValueError as error:
            raise ManifestError(f"not a manifest: {error}") from error
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ManifestError(f"not a manifest of format {FORMAT}")
    files = document.get("files")
    if not isinstance(files, list) or not files:
        raise ManifestError("the manifest lists no file")
    seen = set()
    for entry in files:
        if not (isinstance(entry, dict) and isinstance(entry.get("path"), str) and type(entry.get("size")) is int
                and entry["size"] >= 0 and isinstance(entry.get("sha256"), str) and _SHA256.match(entry["sha256"])):
            raise ManifestError(f"a manifest entry without path, size and sha256: {entry!r}")
        check_relative(entry["path"])
        if entry["path"] in seen:
            raise ManifestError(f"{entry['path']}: listed twice in the manifest")
        seen.add(entry["path"])
    if document.get("digest") != manifest_digest(files):
        raise ManifestError(f"the manifest's digest {document.get('digest')} is not that of its entries "
                            f"({manifest_digest(files)}): it was edited or truncated")
    return document


def _problem(host: str, kind: str, entry: dict, found_size: int | None, found_sha256: str | None) -> dict:
    found = "nothing" if found_size is None else f"{found_size} bytes, sha256 {found_sha256 or 'not read'}"
    return {"kind": kind, "path": entry["path"], "expected_size": entry["size"], "found_size": found_size,
            "expected_sha256": entry["sha256"], "found_sha256": found_sha256,
            "message": f"host {host}: {entry['path']}: {kind}: expected {entry['size']} bytes, sha256 "
                       f"{entry['sha256']}; found {found}"}


def size_problems(root: str, manifest: dict, host: str) -> list[dict]:
    """The cheap precheck (one stat per file, nothing read): files missing, short or long. Each problem names
    the file, both sizes and the manifest's sha256 (the found one is not read: null)."""
    problems = []
    for entry in manifest["files"]:
        try:
            size = os.stat(os.path.join(root, entry["path"])).st_size
        except FileNotFoundError:
            problems.append(_problem(host, "missing", entry, None, None))
            continue
        if size != entry["size"]:
            problems.append(_problem(host, "short" if size < entry["size"] else "long", entry, size, None))
    return problems


def complete_bytes(root: str, manifest: dict) -> int:
    """Bytes of the manifest's files already present at their full size (what a resumed transfer need not
    fetch again, and what the free-space check counts as present)."""
    total = 0
    for entry in manifest["files"]:
        try:
            if os.stat(os.path.join(root, entry["path"])).st_size == entry["size"]:
                total += entry["size"]
        except FileNotFoundError:
            pass
    return total


def verify_directory(root: str, manifest: dict, host: str, workers: int = DEFAULT_WORKERS,
                     extras_are_problems: bool = False, chunk_bytes: int = CHUNK_BYTES) -> dict:
    """The directory against the manifest: {problems, extras, checked_bytes}. problems - the manifest's files
    missing, short, long or corrupt (every file present is hashed, a short one too, so each message carries
    both digests); extras - files the manifest does not list (problems too when extras_are_problems)."""
    listed = {entry["path"]: entry for entry in manifest["files"]}
    try:
        present = list_files(root) if os.path.isdir(root) else {}
        to_hash = [path for path in listed if path in present]
        digests = _hash_all(root, to_hash, workers, chunk_bytes)
    except ManifestError as error:
        raise ManifestError(f"host {host}: {error}") from error
    except OSError as error:
        raise ManifestError(f"host {host}: cannot read {error.filename}: {error.strerror}") from error
    problems = []
    for path, entry in listed.items():
        if path not in present:
            problems.append(_problem(host, "missing", entry, None, None))
        elif present[path] != entry["size"]:
            kind = "short" if present[path] < entry["size"] else "long"
            problems.append(_problem(host, kind, entry, present[path], digests[path]))
        elif digests[path] != entry["sha256"]:
            problems.append(_problem(host, "corrupt", entry, present[path], digests[path]))
    extras = [{"kind": "extra", "path": path, "expected_size": None, "found_size": size, "expected_sha256": None,
               "found_sha256": None, "message": f"host {host}: {path}: extra: not in the manifest ({size} bytes)"}
              for path, size in present.items() if path not in listed]
    return {"problems": problems + (extras if extras_are_problems else []), "extras": extras,
            "checked_bytes": sum(present[path] for path in to_hash)}
