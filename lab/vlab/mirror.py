"""The lab's Hugging Face-compatible mirror: olah (PyPI), serving model repositories from local git repositories.

    commit = publish(model_dir, mirrors, "lab/tiny-llama")      # a git repository olah serves, one commit
    with Mirror(mirrors, "127.0.0.1", 18090, "t1") as mirror:    # olah, a child process of the test
        os.environ["HF_ENDPOINT"] = mirror.endpoint               # huggingface_hub now talks to it

olah reads `<mirrors>/models/<org>/<name>` as a git repository and answers the hub's API (`/api/models/...`,
`/<repo>/resolve/<revision>/<file>`) for its commits, offline: it never reaches another hub. A commit is
made with a fixed author and date, so the same files give the same commit id on every run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OLAH = REPO / ".venv-mirror" / "bin" / "olah-cli"  # scripts/bootstrap builds .venv-mirror (requirements/mirror.lock)
GIT_IDENTITY = {"GIT_AUTHOR_NAME": "vllm-cluster lab", "GIT_AUTHOR_EMAIL": "lab@vllm-cluster.invalid",
                "GIT_COMMITTER_NAME": "vllm-cluster lab", "GIT_COMMITTER_EMAIL": "lab@vllm-cluster.invalid",
                "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}


def repository_path(mirrors: Path, repo_id: str) -> Path:
    org, _, name = repo_id.partition("/")
    if not org or not name or "/" in name:
        raise ValueError(f"a hub repository id is <org>/<name>, not {repo_id!r}")
    return Path(mirrors) / "models" / org / name


def git(path: Path, *args: str) -> str:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(path), **GIT_IDENTITY}
    return subprocess.run(["git", "-C", str(path), *args], env=env, capture_output=True, text=True, timeout=600,
                          check=True).stdout.strip()


def publish(model_dir: Path, mirrors: Path, repo_id: str) -> str:
    """Copy model_dir's files into the mirror as repo_id's repository, commit them; returns the commit id."""
    target = repository_path(mirrors, repo_id)
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(model_dir, target, ignore=shutil.ignore_patterns(".git", ".cache"))
    git(target, "init", "-q", "-b", "main")
    git(target, "add", "-A")
    git(target, "commit", "-q", "-m", f"{repo_id}: the lab's model")
    return git(target, "rev-parse", "HEAD")


class Mirror:
    """olah on host:port over `mirrors`, a child process in its own session (the controller may have no systemd:
    a container); its log in <state>/olah.log; stopped, with everything it started, on exit."""

    def __init__(self, mirrors: Path, host: str, port: int, name: str, state: Path | None = None):
        self.mirrors, self.host, self.port = Path(mirrors), host, port
        self.state = Path(state) if state else self.mirrors.parent / f"mirror-{name}"
        self.endpoint = f"http://{host}:{port}"
        self.process: subprocess.Popen | None = None

    def config(self) -> str:
        """olah's TOML: offline (no upstream hub), the local repositories only."""
        def quoted(value):
            return json.dumps(str(value))
        return "\n".join([
            "[basic]", f"host = {quoted(self.host)}", f"port = {self.port}",
            f"repos-path = {quoted(self.state / 'cache')}", f"mirrors-path = [{quoted(self.mirrors)}]",
            'mirror-scheme = "http"', f"mirror-netloc = {quoted(f'{self.host}:{self.port}')}",
            f"mirror-lfs-netloc = {quoted(f'{self.host}:{self.port}')}",
            "", "[accessibility]", "offline = true", ""])

    def start(self, timeout: float = 60) -> Mirror:
        if not OLAH.exists():
            raise RuntimeError(f"{OLAH} is missing: run scripts/bootstrap (it builds .venv-mirror)")
        self.state.mkdir(parents=True, exist_ok=True)
        (self.state / "olah.toml").write_text(self.config())
        with open(self.state / "olah.log", "ab") as log:
            self.process = subprocess.Popen([str(OLAH), "-c", str(self.state / "olah.toml")], cwd=self.state,
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                with urllib.request.urlopen(f"{self.endpoint}/api/models/none/none", timeout=2):
                    return self
            except urllib.error.HTTPError:
                return self  # it answers (404/401 for a repository it does not hold)
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"olah did not answer on {self.endpoint} within {timeout:.0f} s:\n{self.log()[-3000:]}")

    def log(self) -> str:
        path = self.state / "olah.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.process.pid, sig)
                self.process.wait(timeout=grace)
                return
            except ProcessLookupError:
                return
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> Mirror:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
