"""Stage stamps: deploy.yml's record of a stage that completed on a node, and the check that it still holds.

A stage (preflight, network, firewall, runtime, ray, vllm, verify) that ends
without error on a node writes a stamp there: the run's input digest (the plan,
the project's variables and vllm-cluster's own code) and the evidence the
stage leaves behind (fingerprints of its files, its units' state and
invocation, the output of its probes). The next deploy.yml reads every stamp
first; a stage whose stamp holds on every node, and every stage before it, is
skipped. Anything else (no stamp, other inputs, a changed file, a unit that
stopped or restarted, a probe that answers differently) runs that stage and
every later one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import stat
from pathlib import Path

from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy.stages import ALL_NAMES as STAGES
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.systemd import parse_systemctl_show

STAMP_DIR = "/etc/vllm-cluster/stages"
FORMAT = 1
# Files up to this size are hashed; larger ones (model weights) are fingerprinted by size and mtime.
HASH_LIMIT = 4 * 1024 * 1024
# What the code digest covers: the same files in a checkout and in the collection built from it (a
# checkout's deploy.yml only imports playbooks/deploy.yml and does not ship).
CODE_PARTS = ("playbooks", "roles", "plugins")


class StampError(Exception):
    pass


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def owner_fingerprint(info) -> str:
    """mode:uid:gid of an os.stat result ('750:998:998')."""
    return f"{stat.S_IMODE(info.st_mode):o}:{info.st_uid}:{info.st_gid}"


def file_fingerprint(path: str) -> str:
    """Owner, mode and content of one file (size and mtime above HASH_LIMIT)."""
    info = os.stat(path)
    head = owner_fingerprint(info)
    if info.st_size > HASH_LIMIT:
        return f"{head}:size={info.st_size}:mtime={info.st_mtime_ns}"
    return f"{head}:sha256={_sha256(Path(path).read_bytes())}"


def path_fingerprint(path: str):
    """A file's fingerprint, 'absent', or a directory's own mode:uid:gid and {name: fingerprint} of what it holds,
    child directories included (a model's `original/` shards); a hidden child directory (`.cache`, `.fetch`: a
    cache, a transfer's parts) counts by its mode:uid:gid only, not its content."""
    if not os.path.lexists(path):
        return "absent"
    if os.path.isdir(path):
        entries = {}
        for name in sorted(os.listdir(path)):
            child = os.path.join(path, name)
            if os.path.islink(child):
                entries[name] = "link:" + os.readlink(child)
            elif os.path.isdir(child) and name.startswith("."):
                entries[name] = "dir:" + owner_fingerprint(os.stat(child))
            elif os.path.isdir(child):
                entries[name] = path_fingerprint(child)
            else:
                entries[name] = file_fingerprint(child)
        return {"dir": entries, "owner": owner_fingerprint(os.stat(path))}
    return file_fingerprint(path)


def dir_fingerprint(path: str) -> str:
    """Only a directory's own mode:uid:gid (its content may change: a cache, a home), or 'absent'/'not a directory'."""
    if not os.path.lexists(path):
        return "absent"
    if os.path.islink(path) or not os.path.isdir(path):
        return "not a directory"
    return owner_fingerprint(os.stat(path))


def unit_evidence(show_output: str) -> dict:
    """ActiveState, SubState and InvocationID from `systemctl show -p ...` output."""
    values = parse_systemctl_show(show_output)
    return {
        "active_state": values.get("ActiveState", "unknown"),
        "sub_state": values.get("SubState", "unknown"),
        "invocation": values.get("InvocationID", ""),
    }


def probe_evidence(rc: int, stdout: str) -> str:
    return f"rc={rc}:sha256={_sha256(stdout.encode())}"


def collect_evidence(paths, units, probes, run, dirs=()) -> dict:
    """Evidence of a stage on this node. run(argv) -> (rc, stdout, stderr); dirs: directories whose own owner and
    mode count, not their content."""
    evidence = {"paths": {path: path_fingerprint(path) for path in paths},
                "dirs": {path: dir_fingerprint(path) for path in dirs}, "units": {}, "probes": {}}
    for unit in units:
        rc, out, err = run(["systemctl", "show", "-p", "ActiveState,SubState,InvocationID", "--", unit])
        if rc != 0:
            raise StampError(f"systemctl show {unit} exited {rc}: {err.strip()}")
        evidence["units"][unit] = unit_evidence(out)
    for argv in probes:
        rc, out, _ = run(list(argv))
        evidence["probes"][shlex.join(argv)] = probe_evidence(rc, out)
    return evidence


def evidence_request(stamp: dict) -> tuple[list, list, list]:
    """The paths, units and probes a stamp recorded, to collect them again."""
    evidence = stamp.get("evidence", {})
    return (list(evidence.get("paths", {})), list(evidence.get("units", {})),
            [shlex.split(probe) for probe in evidence.get("probes", {})])


def collect_again(stamp: dict, run) -> dict:
    """The evidence a stamp recorded, collected again now."""
    return collect_evidence(*evidence_request(stamp), run, dirs=list(stamp.get("evidence", {}).get("dirs", {})))


def stamp_document(stage: str, digest: str, evidence: dict, recorded_at: str) -> dict:
    if stage not in STAGES:
        raise StampError(f"unknown stage {stage!r}; the stages are {', '.join(STAGES)}")
    return {"format": FORMAT, "stage": stage, "digest": digest, "evidence": evidence, "recorded_at": recorded_at}


def same_record(old: dict | None, new: dict) -> bool:
    """Whether writing new would change nothing but the time (so a converged re-run stays changed=0)."""
    if not old:
        return False
    keys = ("format", "stage", "digest", "evidence")
    return all(old.get(key) == new.get(key) for key in keys)


def _describe_path(path: str, was, now) -> str:
    if now == "absent":
        return f"{path} is gone"
    if was == "absent":
        return f"{path} appeared"
    if isinstance(was, dict) and isinstance(now, dict):
        if was.get("owner") != now.get("owner"):
            return f"{path}: mode:uid:gid {was.get('owner')} -> {now.get('owner')}"
        names = sorted(set(was["dir"]) | set(now["dir"]))
        moved = [name for name in names if was["dir"].get(name) != now["dir"].get(name)]
        return f"{path}: {', '.join(moved[:5])}{' ...' if len(moved) > 5 else ''} changed"
    return f"{path} changed"


def _describe_dir(path: str, was: str, now: str) -> str:
    if was == "absent":
        return f"{path} appeared"
    if now in ("absent", "not a directory"):
        return f"{path} is {'gone' if now == 'absent' else now} (was a directory, mode:uid:gid {was})"
    return f"{path}: mode:uid:gid {was} -> {now}"


def differences(stamp: dict | None, digest: str, current: dict | None) -> list[str]:
    """Why a stage is not converged on this node; [] when its stamp still holds."""
    if not stamp:
        return ["no record of a completed run"]
    if stamp.get("format") != FORMAT:
        return [f"stamp format {stamp.get('format')} (this vllm-cluster writes {FORMAT})"]
    if stamp.get("digest") != digest:
        return ["the inputs changed (plan, inventory variables or vllm-cluster's code)"]
    recorded = stamp.get("evidence", {})
    current = current or {}
    reasons = []
    for path, was in recorded.get("paths", {}).items():
        now = current.get("paths", {}).get(path, "absent")
        if now != was:
            reasons.append(_describe_path(path, was, now))
    for path, was in recorded.get("dirs", {}).items():
        now = current.get("dirs", {}).get(path, "absent")
        if now != was:
            reasons.append(_describe_dir(path, was, now))
    for unit, was in recorded.get("units", {}).items():
        now = current.get("units", {}).get(unit, {})
        if now.get("active_state") != was.get("active_state"):
            reasons.append(f"{unit} is {now.get('active_state', 'unknown')} (was {was.get('active_state')})")
        elif now.get("invocation") != was.get("invocation"):
            reasons.append(f"{unit} restarted since (invocation {was.get('invocation', '')[:8]} -> "
                           f"{now.get('invocation', '')[:8]})")
    for probe, was in recorded.get("probes", {}).items():
        if current.get("probes", {}).get(probe) != was:
            reasons.append(f"`{probe}` answers differently")
    return reasons


def stages_to_run(checks: dict, stages=STAGES, force: bool = False, tags=None, unhealthy=()) -> dict:
    """Across nodes: {'skip': [...], 'run': [...], 'reasons': {stage: ['host: why', ...]}, 'unhealthy': [...]}.

    checks: {host: {stage: [reason, ...]}} ([] = converged there). A stage is
    skipped only when it and every stage before it are converged on every node:
    a later stage may depend on anything an earlier one changes, and only when
    the deployment is healthy (unhealthy: the findings "host: what" of
    module_utils/deploy/health.py; any one runs every stage). With force,
    nothing is skipped; 'run' is then what a tag selection of stage names
    selects (tags), or every stage.
    """
    reasons = {stage: [f"{host}: {why}" for host in sorted(checks) for why in checks[host].get(stage, ["not checked"])]
               for stage in stages}
    skip = []
    if not force and not unhealthy and checks:
        for stage in stages:
            if reasons[stage]:
                break
            skip.append(stage)
    run = [stage for stage in stages if stage not in skip]
    selected = set(tags or []) - {"plan", "always"}
    if force and selected and selected <= set(stages):
        run = [stage for stage in stages if stage in selected]
    return {"skip": skip, "run": run, "reasons": {stage: why for stage, why in reasons.items() if why},
            "unhealthy": list(unhealthy)}


def summary(decision: dict, forced_by: str = "", verified_at: dict | None = None, limit: int = 6) -> list[str]:
    """What deploy.yml prints before its stages: what it skips, what it runs and why."""
    lines = [f"no stage skipped: {forced_by}"] if forced_by else []
    unhealthy = decision.get("unhealthy") or []
    if unhealthy and not forced_by:
        lines.append("no stage skipped: the deployment is not healthy")
        lines += [f"  {finding}" for finding in unhealthy[:limit]]
        if len(unhealthy) > limit:
            lines.append(f"  ... and {len(unhealthy) - limit} more")
    if decision["skip"]:
        lines.append("converged on every node, skipped: " + ", ".join(decision["skip"]))
    if not decision["run"]:
        lines.append("nothing to do: every stage holds on every node")
        if verified_at:
            lines.append("vLLM runs the processes verified at " +
                         ", ".join(f"{when} ({host})" for host, when in sorted(verified_at.items())))
        return lines
    lines.append("runs: " + ", ".join(decision["run"]))
    if not forced_by and not unhealthy:
        first = decision["run"][0]
        why = decision["reasons"].get(first, [])
        lines += [f"  {first} because {reason}" for reason in why[:limit]]
        if len(why) > limit:
            lines.append(f"  ... and {len(why) - limit} more")
    return lines


def code_digest(root: str | Path) -> str:
    """sha256 over vllm-cluster's playbooks, roles and plugins (so an upgrade re-runs every stage)."""
    root = Path(root)
    digest = hashlib.sha256()
    for part in CODE_PARTS:
        base = root / part
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
        for path in files:
            if "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def inputs_digest(plan, variables: dict, code: str) -> str:
    """One digest of what a deploy.yml run was asked to do on a node."""
    document = json.dumps({"plan": plan, "vars": variables, "code": code}, sort_keys=True, default=str)
    return _sha256(document.encode())
