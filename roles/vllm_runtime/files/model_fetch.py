"""Fetch one pinned revision of a hub model into a directory, resumably, printing progress.

    HF_ENDPOINT=http://mirror:8090 python3 model_fetch.py REPO_ID COMMIT DEST [--token-file F] [--interval 30]

Python's standard library only: it runs with a node's own Python, before any runtime is installed. It
speaks the hub's HTTP API (the hub itself, or a mirror that serves it: HF_ENDPOINT, required), as huggingface_hub
does: the revision's file list from /api/models/<repo>/revision/<commit>, each file from
/<repo>/resolve/<commit>/<path>.

- The revision must be a commit id (40 hex digits): a branch or a tag moves, and the nodes would then hold
  different bytes. The hub must answer for that very commit.
- The token, when the repository needs one, is read from a root-only file, never from argv, and is sent only
  to the endpoint's own host (not along a redirect to a CDN).
- Resumable: a file already in DEST at its listed size is not fetched again; a file cut short stays in
  DEST/.fetch/<path>.part and the next run asks for the rest (an HTTP Range request); a server that ignores
  Range sends the whole file, which then replaces the part.
- Every --interval seconds one line `progress {json}`: bytes present, total, rate, ETA. The last line is
  `result {json}` (the commit, each file's size and the hub's LFS sha256 where it gives one) or `error {json}`;
  with --status-file the last of them is also that file, as JSON.
- --list only lists: each file's size, the total, and the bytes DEST already holds complete (what a room check
  before any download needs).

Exit 0 on success, 2 on a refused argument, 1 on a failed fetch. The bytes are checked afterwards against the
model's manifest (module model_manifest), not here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

COMMIT = re.compile(r"^[0-9a-f]{40}$")
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
PARTS = ".fetch"
CHUNK = 4 * 1024 * 1024
TIMEOUT_S = 60
WORKERS = 4


class FetchError(Exception):
    pass


def inside(name) -> str:
    """A file name the hub lists, refused unless it is a relative path inside the model directory (a mirror
    must not make the fetch write elsewhere)."""
    parts = name.split("/") if isinstance(name, str) else []
    if not parts or name.startswith("/") or any(part in ("", ".", "..", PARTS) for part in parts) or "\\" in name:
        raise FetchError(f"the hub lists a file outside the model directory: {name!r}")
    return name


STATUS: list[Path] = []  # --status-file: where the last line also goes, as JSON (a play polls it)


def emit(kind: str, document: dict) -> None:
    print(f"{kind} {json.dumps(document, sort_keys=True)}", flush=True)
    for path in STATUS:
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(json.dumps({"kind": kind, **document}, sort_keys=True) + "\n")
        os.replace(temporary, path)


class Hub:
    def __init__(self, endpoint: str, token: str | None):
        self.endpoint = endpoint.rstrip("/")
        self.token = token

    def request(self, path: str, method: str = "GET", headers: dict | None = None) -> urllib.request.Request:
        request = urllib.request.Request(self.endpoint + path, method=method, headers=headers or {})
        if self.token:
            # Not carried along a redirect (urllib drops unredirected headers): the token stays with the endpoint.
            request.add_unredirected_header("Authorization", f"Bearer {self.token}")
        return request

    def files(self, repo_id: str, commit: str) -> dict[str, dict]:
        """{path: {size, sha256}} of the commit; sizes the API does not give are read with HEAD."""
        path = f"/api/models/{repo_id}/revision/{commit}?blobs=true"
        try:
            with urllib.request.urlopen(self.request(path), timeout=TIMEOUT_S) as response:
                info = json.loads(response.read())
        except urllib.error.HTTPError as error:
            raise FetchError(f"{self.endpoint}{path.split('?')[0]}: HTTP {error.code} {error.reason}") from error
        if info.get("sha") != commit:
            raise FetchError(f"{self.endpoint} answered for commit {info.get('sha')!r}, not {commit}")
        listed = {}
        for sibling in info.get("siblings") or []:
            lfs = sibling.get("lfs") or {}
            listed[inside(sibling.get("rfilename"))] = {"size": sibling.get("size", lfs.get("size")),
                                                        "sha256": lfs.get("sha256")}
        for name, entry in listed.items():
            if entry["size"] is None:
                entry["size"] = self.head_size(repo_id, commit, name)
        return listed

    def resolve(self, repo_id: str, commit: str, name: str) -> str:
        return f"/{repo_id}/resolve/{commit}/{urllib.parse.quote(name)}"

    def head_size(self, repo_id: str, commit: str, name: str) -> int:
        request = self.request(self.resolve(repo_id, commit, name), method="HEAD")
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            size = response.headers.get("X-Linked-Size") or response.headers.get("Content-Length")
        if size is None:
            raise FetchError(f"{name}: the hub gives no size")
        return int(size)

    def fetch(self, repo_id: str, commit: str, name: str, size: int, dest: Path) -> None:
        """dest/name at its size: kept when there already, else resumed from dest/.fetch/name.part."""
        target = dest / name
        if complete(dest, name, size):
            return
        part = dest / PARTS / f"{name}.part"
        part.parent.mkdir(parents=True, exist_ok=True)
        have = part.stat().st_size if part.exists() else 0
        if have > size:
            part.unlink()
            have = 0
        if have < size:
            headers = {"Range": f"bytes={have}-"} if have else {}
            request = self.request(self.resolve(repo_id, commit, name), headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                    # 206: the rest of the file; 200: the server ignored Range and sends it whole.
                    mode = "ab" if have and response.status == 206 else "wb"
                    with open(part, mode) as handle:
                        shutil.copyfileobj(response, handle, CHUNK)
            except urllib.error.HTTPError as error:
                raise FetchError(f"{name}: HTTP {error.code} {error.reason}") from error
        got = part.stat().st_size
        if got != size:
            raise FetchError(f"{name}: {got} bytes arrived, the hub lists {size} (run again to resume)")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(part, target)


def complete(dest: Path, name: str, size: int) -> bool:
    """DEST holds the file at its listed size (fetched before: kept, never fetched again)."""
    target = dest / name
    return target.is_file() and target.stat().st_size == size


def bytes_present(dest: Path, files: dict[str, dict]) -> int:
    total = 0
    for name, entry in files.items():
        for path in (dest / name, dest / PARTS / f"{name}.part"):
            try:
                total += min(path.stat().st_size, entry["size"])
                break
            except FileNotFoundError:
                continue
    return total


def report_progress(dest: Path, files: dict, interval: float, stop: threading.Event) -> None:
    total = sum(entry["size"] for entry in files.values())
    started, first = time.monotonic(), bytes_present(dest, files)
    while not stop.wait(interval):
        done = bytes_present(dest, files)
        elapsed = time.monotonic() - started
        rate = (done - first) / elapsed if elapsed > 0 else 0.0
        eta = round((total - done) / rate) if rate > 0 and total > done else None
        emit("progress", {"bytes": done, "total": total, "rate_bytes_s": round(rate), "eta_s": eta})


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo_id")
    parser.add_argument("revision")
    parser.add_argument("dest", type=Path)
    parser.add_argument("--token-file", type=Path)
    parser.add_argument("--interval", type=float, default=30.0)
    parser.add_argument("--status-file", type=Path, help="the last progress, result or error line, as JSON")
    parser.add_argument("--list", action="store_true",
                        help="only list: each file's size, the total, and the bytes of it DEST already holds")
    args = parser.parse_args(argv)
    STATUS[:] = [args.status_file] if args.status_file else []
    if not REPO_ID.match(args.repo_id):
        emit("error", {"msg": f"{args.repo_id!r} is not a hub repository id (<org>/<name>)"})
        return 2
    if not COMMIT.match(args.revision):
        emit("error", {"msg": f"revision {args.revision!r} is not a commit id (40 hex digits): pin the model's "
                              "commit, so that every node fetches the same bytes"})
        return 2
    try:
        token = args.token_file.read_text().strip() if args.token_file else None
    except OSError as error:
        emit("error", {"msg": f"cannot read the token file {args.token_file}: {error.strerror}"})
        return 2
    endpoint = os.environ.get("HF_ENDPOINT", "")
    if not endpoint.startswith(("http://", "https://")):
        emit("error", {"msg": f"HF_ENDPOINT={endpoint!r}: expected the hub's or the mirror's URL (http:// or https://)"})
        return 2
    hub = Hub(endpoint, token)
    where = f"{args.repo_id}@{args.revision} from {hub.endpoint}"
    try:
        files = hub.files(args.repo_id, args.revision)
    except (FetchError, urllib.error.URLError, OSError, ValueError) as error:
        emit("error", {"msg": f"{where}: {error}"})
        return 1
    total = sum(entry["size"] for entry in files.values())
    if args.list:
        held = sum(entry["size"] for name, entry in files.items() if complete(args.dest, name, entry["size"]))
        emit("result", {"repo_id": args.repo_id, "commit": args.revision, "files": files, "bytes": total,
                        "complete_bytes": held})
        return 0
    args.dest.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    reporter = threading.Thread(target=report_progress, args=(args.dest, files, args.interval, stop), daemon=True)
    reporter.start()
    try:
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            for done in [pool.submit(hub.fetch, args.repo_id, args.revision, name, entry["size"], args.dest)
                         for name, entry in sorted(files.items(), key=lambda item: -item[1]["size"])]:
                done.result()
    except (FetchError, urllib.error.URLError, OSError) as error:
        emit("error", {"msg": f"{where}: {error}"})
        return 1
    finally:
        stop.set()
        reporter.join(timeout=5)
    shutil.rmtree(args.dest / PARTS, ignore_errors=True)
    emit("result", {"repo_id": args.repo_id, "commit": args.revision, "files": files, "bytes": total,
                    "complete_bytes": total})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
