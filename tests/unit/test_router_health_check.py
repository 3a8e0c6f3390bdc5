"""The router health check of the runbooks and docs/router.md is one line, the same everywhere.

vllm-router 0.1.17's `/list_workers` keeps a worker whose vLLM died (tests/fixtures/router/doctor/killed/): it is
membership, not health. The runbooks read `/workers` instead: every worker's `is_healthy`, and their count.
tests/lab/test_router.py runs that line on the lab's router host, with a replica killed and after it is back.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The check as the docs print it, before its one placeholder, <servers> (how many workers the router must have).
CHECK = r"""curl -sf --max-time 5 http://127.0.0.1:8080/workers | python3 -c 'import json,sys; w=json.load(sys.stdin)["workers"]; n=int(sys.argv[1]); [print(x["url"], "healthy" if x["is_healthy"] else "UNHEALTHY") for x in w]; ok=sum(bool(x["is_healthy"]) for x in w); print(f"{ok} of {len(w)} workers healthy, {n} expected"); sys.exit(not len(w) == ok == n)'"""


def test_every_doc_prints_the_same_check():
    found = [(path.relative_to(REPO), line.strip()) for path in sorted((REPO / "docs").rglob("*.md"))
             for line in path.read_text().splitlines() if "/workers | python3" in line]
    assert {str(path) for path, _ in found} == {"docs/router.md", "docs/runbooks/rolling-upgrade.md",
                                                "docs/runbooks/add-replica.md", "docs/runbooks/drain-node.md"}
    assert all(line == f"{CHECK} <servers>" for _, line in found), found
