"""Observations of the compared facts: what a node shows against the plan or the other nodes.

The units' drop-ins and ``Environment=`` against what the deployment writes,
their limits (and those of their running main process) against the templates',
the state of every process of the units (stopped, zombie, uninterruptible),
owner and mode of the model directory and of where vLLM writes, read as the
service user, the free space there, and the API key file against the
inventory's key (by SHA-256, compared on the node; no key in the evidence).
Each ``obs_*`` function is named in ``observations.OBSERVATIONS``; the fabric's
MTU, link state and routes are in ``observations_network.py``.

Pure Python 3.11, no Ansible import.
"""

from __future__ import annotations

import math
import re

from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy.unit_dropins import (
    foreign_dropins,
    unit_dropin_dir,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import (
    RAY_UNITS,
    VLLM_UNIT,
    make_hit,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.observations_network import (
    _ib_declared,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.observations_node import (
    obs_unit_argv_differs,
)

# The state letters of /proc/<pid>/stat, as a finding names them.
STATE_NAMES = {"T": "stopped", "t": "stopped by a debugger (tracing stop)", "Z": "a zombie",
               "D": "in uninterruptible sleep (D)"}
# States a single reading does not prove: the gatherer reads them again (samples) and all readings must agree.
SAMPLED_STATES = ("D", "Z")
# The Environment= variables the vLLM unit's template sets (roles/vllm_service/templates/vllm.service.j2).
TEMPLATE_ENVIRONMENT = {VLLM_UNIT: ["HOME", "TMPDIR",  # and, with the plan's API guard, its three
                                    "PYTHONPATH", "API_GUARD_OPEN_PATHS", "API_GUARD_METRICS_FROM",
                                    # on Ray, Ray's authentication (the plan's ray_auth)
                                    "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH"]}
_SIZE = re.compile(r"^(\d+)([KMGTPE]?)$")


def _units(cluster, node, params):
    wanted = params.get("units", [VLLM_UNIT, *RAY_UNITS])
    units = [unit for unit in cluster.expected_units(node) if unit in wanted]
    units += [unit for unit in wanted if unit not in units and node.installed(unit)]
    return [unit for unit in units if node.installed(unit)]


# --- drop-ins and Environment= --------------------------------------------------------------------------------


def _foreign_dropins(node, unit, unit_id, paths):
    """The unit's own drop-ins vllm-cluster did not write and the inventory does not want: the deploy's rule
    (deploy/unit_dropins.py), with the wanted lists the doctor role passed (expected.dropins_wanted)."""
    wanted = ((node.expected.get("dropins_wanted") or {}).get(unit)) or ()
    return foreign_dropins(paths, unit_id, wanted)


def obs_unit_overridden(cluster, params):
    """A deployment unit carries a foreign drop-in of its own (deploy/unit_dropins.py: one the deploy removes), or
    one the other nodes do not have (machine-wide), or Environment= variables its template does not write.

    params environment: {unit: [names its template sets]} (TEMPLATE_ENVIRONMENT); a unit not listed is not judged
    on its Environment=.
    A node whose vLLM command line differs from the plan is left to unit_argv_differs (it names the drop-ins).
    """
    template_env = params.get("environment", TEMPLATE_ENVIRONMENT)
    argv_drift = {hit["node"] for hit in obs_unit_argv_differs(cluster, {})}
    hits = []
    nodes = cluster.reachable_nodes()
    for node in nodes:
        for unit in _units(cluster, node, params):
            info = node.unit(unit)
            unit_id = info.get("Id") or unit
            paths = (info.get("DropInPaths") or "").split()
            others = [other for other in nodes if other is not node and other.installed(unit)]
            # A drop-in of the unit's own, or a machine-wide one the other nodes do not have.
            own = set(_foreign_dropins(node, unit, unit_id, paths))
            odd = [path for path in paths if path in own or (
                not unit_dropin_dir(path, unit_id)
                and others and any(path not in (other.unit(unit).get("DropInPaths") or "").split() for other in others))]
            if unit == VLLM_UNIT and node.name in argv_drift:
                odd = []
            # Environment= only where the template's variables are known: the Ray units take ray_cluster_environment,
            # which an inventory may set per host on purpose.
            env = node.unit_environment.get(unit) or {}
            extra = {key: value for key, value in env.items() if key not in template_env.get(unit, env)}
            if not odd and not extra:
                continue
            parts = []
            for path in odd:
                content = (node.dropins.get(unit) or {}).get(path) or {}
                lines = content.get("lines")
                settings = "; ".join(line for line in lines if not line.startswith("[")) if lines else ""
                if settings:
                    parts.append(f"{path} [{settings}]")
                elif content.get("error"):
                    parts.append(f"{path} ({content['error']})")
                else:
                    parts.append(f"{path}")
            if extra:
                parts.append("Environment= " + " ".join(f"{k}={v}" for k, v in sorted(extra.items()))
                             + f" (beyond the template's {', '.join(template_env[unit])})")
            hits.append(make_hit(node, "systemctl show -p DropInPaths -p Environment",
                                 f"{node.name}: {unit} carries " + "; ".join(parts),
                                 unit=unit, dropins=", ".join(odd) or "none",
                                 overrides="; ".join(parts)))
    return hits


# --- limits --------------------------------------------------------------------------------------------------------


def limit_value(text):
    """A limit as systemd and /proc print it (bytes or a count; K, M, G... in 1024s; infinity) -> a number."""
    value = str(text).strip()
    if value in ("infinity", "unlimited"):
        return math.inf
    match = _SIZE.match(value)
    if not match:
        return None
    return int(match.group(1)) * 1024 ** " KMGTPE".index(match.group(2) or " ")


def obs_unit_limits_differ(cluster, params):
    """A unit's limits (LimitNOFILE, LimitMEMLOCK, MemoryMax, MemoryHigh), or its running process's, are lower than
    the deployment's (the doctor role's expected_limits), or, without those, than another node's.

    LimitMEMLOCK on a node that declares InfiniBand is memlock_limited's.
    """
    hits = []
    nodes = cluster.reachable_nodes()
    for node in nodes:
        ib, _ = _ib_declared(node)
        for unit in _units(cluster, node, params):
            info = node.unit(unit)
            expected = (node.expected.get("limits") or {}).get(unit) or {}
            names = list(expected) or ["LimitNOFILE", "LimitMEMLOCK"]
            for name in names:
                if name == "LimitMEMLOCK" and ib:
                    continue
                have = info.get(name)
                if have in (None, ""):
                    continue
                if expected:
                    want, whence = str(expected[name]), "the deployment sets"
                else:
                    values = [other.unit(unit).get(name) for other in nodes if other.installed(unit)]
                    values = [value for value in values if limit_value(value or "") is not None]
                    want, whence = max(values, key=limit_value), "the other nodes have"
                have_n, want_n = limit_value(have), limit_value(want)
                if have_n is None or want_n is None or have_n >= want_n:
                    continue
                hits.append(make_hit(node, f"systemctl show -p {name}",
                                     f"{node.name}: {unit} {name}={have} ({whence} {want})",
                                     unit=unit, limit=name, value=have, expected=want))
            running = node.process_limits.get(unit) or {}
            for name, key in (("LimitNOFILE", "open_files"), ("LimitMEMLOCK", "locked_memory")):
                if name not in expected or not running.get(key) or (name == "LimitMEMLOCK" and ib):
                    continue
                soft = running[key][0]
                # A machine (or container) whose ceiling is below the unit's limit caps every node alike (the lab:
                # 20000 open files): only a process that runs with less than the same unit's elsewhere is odd.
                peers = [limit_value(((other.process_limits.get(unit) or {}).get(key) or [""])[0])
                         for other in nodes if other is not node]
                if not any(value is not None and value > (limit_value(soft) or 0) for value in peers):
                    continue
                if limit_value(soft) is not None and limit_value(soft) < limit_value(str(expected[name])):
                    hits.append(make_hit(
                        node, f"/proc/{running.get('pid')}/limits",
                        f"{node.name}: the main process of {unit} (pid {running.get('pid')}) runs with {key.replace('_', ' ')} "
                        f"{running[key][0]}/{running[key][1]} (soft/hard); the deployment sets {name}={expected[name]}"
                        + (f" and the unit says {info.get(name)}: it started before the change" if
                           limit_value(info.get(name) or "") == limit_value(str(expected[name])) else ""),
                        unit=unit, limit=name, value=soft, expected=str(expected[name])))
    return hits


# --- process states ------------------------------------------------------------------------------------------------


def obs_process_state(cluster, params):
    """A process of a deployment unit in one of params states (T, t, Z, D); D and Z only when every reading shows it."""
    wanted = set(params.get("states", ["T", "t"]))
    hits = []
    for node in cluster.reachable_nodes():
        for unit in _units(cluster, node, params):
            for proc in node.processes.get(unit) or []:
                state = proc.get("state")
                samples = proc.get("samples") or state or ""
                if state not in wanted or (state in SAMPLED_STATES and set(samples) != {state}):
                    continue
                wchan = proc.get("wchan")
                readings = f", {len(samples)} readings" if len(samples) > 1 else ""
                hits.append(make_hit(
                    node, f"/proc/{proc.get('pid')}/stat",
                    f"{node.name}: pid {proc.get('pid')} ({proc.get('comm')}) of {unit} is "
                    f"{STATE_NAMES.get(state, state)} (state {state}{readings}), parent pid {proc.get('ppid')}"
                    + (f", wchan {wchan}" if wchan else ""),
                    unit=unit, pid=proc.get("pid"), comm=proc.get("comm"), state=state,
                    ppid=proc.get("ppid"), wchan=wchan or "unknown"))
    return hits


# --- access as the service user, free space ---------------------------------------------------------------------------


def obs_service_user_access(cluster, params):
    """The vLLM unit's User= cannot read the model directory (or files in it) or write where vLLM writes."""
    hits = []
    for node in cluster.reachable_nodes():
        access = node.access
        user = access.get("user")
        if not user or not node.runs_vllm:
            continue
        for item in access.get("paths") or []:
            path, need = item.get("path"), "read" if item.get("need") == "r" else "write"
            where = "the model directory" if item.get("purpose") == "model" else f"{item.get('purpose')} of {VLLM_UNIT}"
            if item.get("ok") is False:
                denied = item.get("denied") or "denied"
                target = denied.split(" (")[0]
                if item.get("need") == "r":
                    remedy = (f"chmod a+x {target}" if target != path else f"chmod -R a+rX {path}")
                    check = f"runuser -u {user} -- find {path} ! -readable"
                else:
                    remedy = f"chown -R {user}: {item.get('created_in') or path}" if target == (
                        item.get("created_in") or path) else f"chmod a+x {target}"
                    check = f"runuser -u {user} -- test -w {item.get('created_in') or path} && echo writable"
                hits.append(make_hit(node, f"stat as {user}",
                                     f"{node.name}: {user} (User= of {VLLM_UNIT}) cannot {need} {path} ({where}): {denied}",
                                     user=user, path=path, need=need, denied=denied, remedy=remedy, check=check))
            elif item.get("ok") and item.get("unreadable"):
                files = "; ".join(item.get("denied_files") or [])
                hits.append(make_hit(node, f"stat as {user}",
                                     f"{node.name}: {user} (User= of {VLLM_UNIT}) cannot read {item['unreadable']} of "
                                     f"the {item.get('checked')} entries under {path}: {files}",
                                     user=user, path=path, need="read", denied=files,
                                     remedy=f"chmod -R a+rX {path}", check=f"runuser -u {user} -- find {path} ! -readable"))
    return hits


def obs_disk_low(cluster, params):
    """The filesystem where vLLM writes (home, TMPDIR, caches) has less free space or inodes than params say."""
    min_bytes = float(params.get("min_free_gib", 1.0)) * 1024**3
    min_inodes = int(params.get("min_free_inodes", 1000))
    hits = []
    for node in cluster.reachable_nodes():
        if not node.runs_vllm:
            continue
        for item in node.disk:
            if item.get("purpose") == "model" or item.get("free_bytes") is None:
                continue
            free, total = item["free_bytes"], item.get("total_bytes") or 0
            inodes = item.get("free_inodes")
            short = free < min_bytes
            no_inodes = bool(item.get("total_inodes")) and inodes is not None and inodes < min_inodes
            if not short and not no_inodes:
                continue
            share = f" ({100 * free / total:.0f}%)" if total else ""
            line = (f"{node.name}: {free / 1024**3:.2f} GiB free{share}, {inodes} inodes free on the filesystem of "
                    f"{item['path']} ({item.get('purpose')} of {VLLM_UNIT})")
            hits.append(make_hit(node, f"statvfs {item['path']}", line, path=item["path"],
                                 free_gib=round(free / 1024**3, 2), free_inodes=inodes,
                                 min_free_gib=float(params.get("min_free_gib", 1.0))))
    return hits


# --- the API key ---------------------------------------------------------------------------------------------------


def obs_api_key_differs(cluster, params):
    """The API server's key file does not hold the inventory's key (compared by SHA-256 on the node), or is missing."""
    hits = []
    for node in cluster.reachable_nodes():
        key = node.api_key
        serves_api = node.runs_vllm and not node.plan.get("headless", not node.plan)
        if not key.get("compared") or not serves_api or key.get("matches") is True:
            continue
        if key.get("matches") is None and (key.get("exists") or not key.get("inventory_has_key")):
            continue  # the file could not be read (errors says why), or neither side has a key
        path = key.get("path") or "the key file"
        if not key.get("exists"):
            problem = "does not exist: vLLM serves without the inventory's key"
        elif not key.get("inventory_has_key"):
            problem = "sets VLLM_API_KEY while the inventory has no key (vllm_cluster_api_key is empty)"
        elif not key.get("has_key"):
            problem = "sets no VLLM_API_KEY while the inventory has a key"
        else:
            problem = "holds another key than the inventory's vllm_cluster_api_key (their SHA-256 differ)"
        hits.append(make_hit(node, "sha256 of the key file", f"{node.name}: {path} {problem}", path=path,
                             problem=problem))
    return hits
