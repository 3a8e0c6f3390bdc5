"""Observations of each node on its own: reachability, units, what holds its ports and GPUs, its software.

The deployment's units (failed, stopped, missing), processes outside them that
hold a plan port or a GPU, the runtime venv's versions across nodes, the model
directory, the env files and the unit's command line against the plan,
``/dev/shm``, the GPU facts (driver, fabric manager, GPU count) and env flags.
Each ``obs_*`` function is named in ``observations.OBSERVATIONS``.

Pure Python 3.11, no Ansible import.
"""

from __future__ import annotations

import re

from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import (
    RAY_UNITS,
    VLLM_UNIT,
    make_hit,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.observations_network import (
    reference_value,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.observations_ray import ray_ran
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.systemd import parse_exec_start
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.traceback import (
    error_lines,
    last_exception,
    split_line,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import history as plan_history


def _ray_ran_or_raised(node, unit):
    """Whether a Ray unit's journal shows that Ray ran, or that a process under it raised."""
    return bool(ray_ran(node.journal(unit)) or _last_error(node.journal(unit), unit)[0])


def _units_param(params, default):
    units = params.get("units", default)
    return [units] if isinstance(units, str) else list(units)


def obs_node_unreachable(cluster, params):
    return [
        make_hit(node, "ansible", f"{node.name}: {node.error or 'unreachable over SSH'}")
        for node in cluster.nodes
        if not node.reachable
    ]


def obs_port_held_by_foreign_process(cluster, params):
    hits = []
    for node in cluster.reachable_nodes():
        ports = cluster.ports_for(node)
        by_port = {}
        for sock in node.gather.get("listening") or []:
            by_port.setdefault(sock["port"], []).append(sock)
        for name, port in sorted(ports.items(), key=lambda item: item[1]):
            for sock in by_port.get(port, []):
                owners = [proc for proc in sock.get("processes", []) if proc.get("pid") not in node.deployment_pids]
                ours = [proc for proc in sock.get("processes", []) if proc.get("pid") in node.deployment_pids]
                if owners and not ours:
                    proc = owners[0]
                    hits.append(
                        make_hit(
                            node,
                            "ss -ltnp",
                            f"{sock['line']}  <- port {port} ({name}) held by {proc['name']} pid {proc['pid']}, "
                            "outside the deployment's units",
                            port=port, port_name=name, process=proc["name"], pid=proc["pid"],
                        )
                    )
    return hits


def obs_gpu_held_by_foreign_process(cluster, params):
    hits = []
    for node in cluster.reachable_nodes():
        for proc in node.gpu.get("processes") or []:
            pid = proc.get("pid")
            if pid is None or pid in node.deployment_pids:
                continue
            memory = proc.get("used_memory_mib")
            hits.append(
                make_hit(
                    node,
                    "nvidia-smi",
                    f"GPU{proc.get('gpu')}: pid {pid} ({proc.get('name')}) uses "
                    f"{memory if memory is not None else '?'} MiB and belongs to no deployment unit",
                    gpu=proc.get("gpu"), pid=pid, process=proc.get("name"), memory_mib=memory,
                )
            )
    return hits


def _unit_line(node, unit):
    info = node.unit(unit)
    state = f"{info.get('ActiveState', '?')} ({info.get('SubState', '?')})"
    extra = []
    if info.get("Result") not in (None, "", "success"):
        extra.append(f"result {info.get('Result')}")
    if info.get("ExecMainStatus") not in (None, "", "0"):
        extra.append(f"exit status {info.get('ExecMainStatus')}")
    if info.get("NRestarts") not in (None, "", "0"):
        extra.append(f"{info.get('NRestarts')} restarts")
    if info.get("UnitFileState"):
        extra.append(info["UnitFileState"])
    return f"systemctl: {unit} {state}" + (f", {', '.join(extra)}" if extra else "")


# The longest exception line quoted in a finding (vLLM's KV cache errors run to 400 characters).
MAX_QUOTED = 300


def _clip(text):
    return text if len(text) <= MAX_QUOTED else text[: MAX_QUOTED - 3] + "..."


def _last_error(lines, unit=None):
    """(the error as the finding quotes it, the traceback it comes from or None).

    With a traceback in the journal: the root exception of the last failure
    (the first traceback of it, parsers/traceback.py), its type and whole
    message, then the last exception when it says something else: "ROOT
    (reported last as: LAST)". Without one: the first error line that names its error (an
    exception or errno line, NCCL WARN, c10d's E lines), else the first
    ERROR line, else the last line that says Error, Exception or failed; never
    a frame or a code line.
    """
    found = last_exception(lines)
    if found:
        if found["root"]:
            return f"{_clip(found['root_full'])} (reported last as: {_clip(found['full'])})", found
        return _clip(found["full"]), found
    errors = [item for item in error_lines(lines) if not item["in_traceback"]]
    chosen = next((item for item in errors if item["strong"]), errors[0] if errors else None)
    if chosen:
        return _clip(chosen["text"]), None
    for line in reversed(lines):
        body = split_line(str(line))[3]
        text = body.strip()
        if (re.search(r"(Error|Exception|error:|FAILED|failed)", text) and not body[:1].isspace()
                and not text.startswith(("File ", "Traceback"))):
            return text, None
    return None, None


def _last_error_line(lines, unit=None):
    return _last_error(lines, unit)[0]


def _context_line(process, context):
    """A traceback's lines around its exception line, as one line of evidence: "code | exception | message"."""
    return (f"{process} " if process else "") + " | ".join(_clip(text) for text in context)


def _stopped_on_request(node, unit):
    """systemd logged a stop job for this invocation: someone (or something) stopped the unit.

    Ray's `ray start --block` exits 1 on SIGTERM, so a stopped Ray unit ends "failed";
    the stop job in its journal tells it from a crash.
    """
    return any(line.startswith(f"Stopping {unit}") for line in node.journal(unit))


def obs_unit_failed(cluster, params):
    wanted = _units_param(params, [VLLM_UNIT, *RAY_UNITS])
    hits = []
    for node in cluster.reachable_nodes():
        for unit in cluster.expected_units(node):
            if unit not in wanted or not node.installed(unit):
                continue
            info = node.unit(unit)
            failing = (info.get("ActiveState") == "failed" and not _stopped_on_request(node, unit)) or (
                info.get("ActiveState") == "activating" and info.get("SubState") == "auto-restart"
            )
            if failing and params.get("never_ran") and _ray_ran_or_raised(node, unit):
                # a Ray that ran and failed, or a process under it that raised: named by its failure, not as absent
                continue
            if failing:
                last, found = _last_error(node.journal(unit), unit)
                line = _unit_line(node, unit) + (f"; last error: {last}" if last else "")
                values = {"unit": unit, "last_error": last or "none logged"}
                hits.append(make_hit(node, "systemctl", line, **values))
                if found:
                    # The lines around the exception lines quoted: the root's first, then the last's.
                    if found["root"]:
                        hits.append(make_hit(node, f"journal {unit}",
                                             _context_line(found["root_process"], found["root_context"]), **values))
                    hits.append(make_hit(node, f"journal {unit}", _context_line(found["process"], found["context"]),
                                         **values))
    return hits


def obs_unit_stopped(cluster, params):
    wanted = _units_param(params, [VLLM_UNIT, *RAY_UNITS])
    hits = []
    for node in cluster.reachable_nodes():
        for unit in cluster.expected_units(node):
            if unit not in wanted or not node.installed(unit):
                continue
            info = node.unit(unit)
            stopped = info.get("ActiveState") in ("inactive", "deactivating") and info.get("Result", "success") == "success"
            if stopped or (info.get("ActiveState") == "failed" and _stopped_on_request(node, unit)):
                line = _unit_line(node, unit)
                stop = next((x for x in node.journal(unit) if x.startswith(f"Stopping {unit}")), None)
                hits.append(make_hit(node, "systemctl", line + (f"; journal: {stop}" if stop else ""), unit=unit))
    return hits


def obs_unit_missing(cluster, params):
    wanted = _units_param(params, [VLLM_UNIT, *RAY_UNITS])
    hits = []
    for node in cluster.reachable_nodes():
        for unit in cluster.expected_units(node):
            # Only systemd's own "not-found" counts: a node where systemctl cannot answer proves nothing.
            if unit in wanted and node.unit(unit).get("LoadState") == "not-found":
                hits.append(make_hit(node, "systemctl", f"systemctl: {unit} is not installed (LoadState=not-found)",
                                     unit=unit))
    return hits


def obs_version_mismatch(cluster, params):
    """A package (or Python) of the runtime venv differs between nodes."""
    package = params.get("package", "ray")
    versions = {}
    for node in cluster.reachable_nodes():
        venv = node.gather.get("venv") or {}
        if not venv.get("exists"):
            continue
        value = venv.get("python_version") if package == "python" else (venv.get("packages") or {}).get(package)
        if value:
            versions[node.name] = value
    if len(set(versions.values())) < 2:
        return []
    counts = {}
    for value in versions.values():
        counts[value] = counts.get(value, 0) + 1
    majority = max(counts, key=lambda value: (counts[value], value))
    summary = ", ".join(f"{name}={value}" for name, value in versions.items())
    label = "Python" if package == "python" else package
    return [
        make_hit(
            name,
            "runtime venv",
            f"{name}: {label} {value} in the runtime venv; the other nodes have {majority} ({summary})",
            package=label, version=value, expected=majority, versions=summary,
        )
        for name, value in versions.items()
        if value != majority
    ]


def obs_model_missing(cluster, params):
    path = (cluster.plan.get("model") or {}).get("path")
    hits = []
    for node in cluster.reachable_nodes():
        model = node.gather.get("model") or {}
        node_path = model.get("path") or path
        if not node_path or not str(node_path).startswith("/") or not node.runs_vllm:
            continue
        if not model:
            continue
        if not model.get("exists"):
            hits.append(make_hit(node, "filesystem", f"{node_path}: no such file or directory on {node.name}",
                                 path=node_path))
        elif not model.get("config_json"):
            hits.append(make_hit(node, "filesystem", f"{node_path} exists on {node.name} but has no config.json",
                                 path=node_path))
    return hits


def obs_shm_small(cluster, params):
    minimum = float(params.get("min_gib", 1.0)) * 1024**3
    hits = []
    for node in cluster.reachable_nodes():
        shm = node.gather.get("shm") or {}
        total = shm.get("total_bytes")
        if total is None:
            if shm.get("error"):
                hits.append(make_hit(node, "/dev/shm", f"/dev/shm: {shm['error']}", size_gib=0))
            continue
        if total < minimum:
            hits.append(
                make_hit(node, "statvfs /dev/shm",
                         f"/dev/shm is {total / 1024**3:.2f} GiB on {node.name}; at least {minimum / 1024**3:g} GiB expected",
                         size_gib=round(total / 1024**3, 2))
            )
    return hits


def obs_driver_mismatch(cluster, params):
    versions = {
        node.name: node.gpu.get("driver_version")
        for node in cluster.reachable_nodes()
        if node.gpu.get("present") and node.gpu.get("driver_version")
    }
    head = cluster.head.name if cluster.head is not None else None
    expected = reference_value(versions, head)
    if expected is None:
        return []
    # The odd nodes out: those whose driver differs from the most common one (a tie goes to the head's).
    summary = ", ".join(f"{name}={value}" for name, value in versions.items())
    return [make_hit(name, "nvidia-smi", f"{name}: driver {value}, the others {expected} ({summary})", driver=value,
                     versions=summary, expected=expected)
            for name, value in versions.items() if value != expected]


def obs_fabric_manager_not_ready(cluster, params):
    hits = []
    for node in cluster.reachable_nodes():
        if not node.gpu.get("nvswitch"):
            continue
        state = node.gpu.get("fabric_state")
        unit = node.unit("nvidia-fabricmanager.service")
        if state not in (None, "Completed", "N/A"):
            hits.append(make_hit(node, "nvidia-smi -q", f"GPU fabric state {state} (NVSwitch system; expected Completed)",
                                 state=state))
        elif unit and unit.get("LoadState") == "loaded" and unit.get("ActiveState") != "active":
            hits.append(make_hit(node, "systemctl", _unit_line(node, "nvidia-fabricmanager.service"),
                                 state=unit.get("ActiveState")))
    return hits


def obs_env_differs(cluster, params):
    """The node's env files against the plan's env for that node (a hand edit, a stale file)."""
    watched_extra = params.get("extra", ["NCCL_IB_HCA", "NCCL_P2P_DISABLE", "NCCL_NET", "NCCL_SOCKET_IFNAME",
                                         "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "VLLM_HOST_IP"])
    hits = []
    for node in cluster.reachable_nodes():
        planned = cluster.plan_env(node)
        if not planned or not node.runs_vllm:
            continue
        env = node.env
        differences = []
        lines = []
        for key in sorted(set(planned) | {k for k in watched_extra if k in env}):
            want = planned.get(key)
            have = env.get(key, (None,))[0]
            if want is not None and have is None:
                differences.append(f"{key} missing (plan: {want})")
            elif have != want and have != "<redacted>":
                differences.append(f"{key}={have} (plan: {want if want is not None else 'not set'})")
                lines.append(f"{env[key][1]}:{env[key][2][0]}: {env[key][2][1].strip()}")
        if differences:
            hits.append(
                make_hit(node, "env files", f"{node.name}: {'; '.join(differences)}"
                         + (f" [{'; '.join(lines)}]" if lines else ""),
                         differences="; ".join(differences))
            )
    return hits


def _plan_argv_tail(node):
    argv = node.plan.get("argv") or []
    return argv[1:] if argv and argv[0] == "vllm" else argv


def obs_unit_argv_differs(cluster, params):
    hits = []
    for node in cluster.reachable_nodes():
        if not node.runs_vllm or not node.installed(VLLM_UNIT) or not node.plan.get("argv"):
            continue
        running = parse_exec_start(node.unit(VLLM_UNIT).get("ExecStart"))
        if not running:
            continue
        planned = _plan_argv_tail(node)
        tail = running[1:]
        if tail == planned:
            continue
        differences = _argv_differences(planned, tail)
        dropins = node.unit(VLLM_UNIT).get("DropInPaths") or ""
        where = f" (drop-ins: {dropins})" if dropins else ""
        hits.append(
            make_hit(node, "systemctl show -p ExecStart",
                     f"{VLLM_UNIT} runs {' '.join(running[1:])}; differs from the plan: {differences}{where}",
                     differences=differences, dropins=dropins or "none")
        )
    return hits


def _argv_differences(planned, running):
    want, want_pos = plan_history.argv_flags(planned)
    have, have_pos = plan_history.argv_flags(running)
    parts = []
    if want_pos != have_pos:
        parts.append(f"arguments {' '.join(have_pos)} (plan: {' '.join(want_pos)})")
    for key in sorted(set(want) | set(have)):
        if want.get(key) != have.get(key):
            have_text, want_text = plan_history.flag_text(have.get(key)), plan_history.flag_text(want.get(key))
            parts.append(f"{key} {have_text} (plan: {want_text})")
    return "; ".join(parts) or "order of arguments"


def obs_env_flag(cluster, params):
    """An env variable set to a value on a node: params name, value."""
    name, wanted = params.get("name"), str(params.get("value", "1"))
    hits = []
    for node in cluster.reachable_nodes():
        entry = node.env.get(name)
        if entry and entry[0] == wanted:
            value, path, (number, text) = entry
            hits.append(make_hit(node, f"{path}:{number}", text.strip(), name=name, value=value))
    return hits


def obs_gpu_facts_failed(cluster, params):
    """nvidia-smi failed on a node of a CUDA deployment (gpu_facts recorded its error)."""
    if (cluster.plan.get("cluster") or {}).get("device", "cuda") != "cuda":
        return []
    return [
        make_hit(node, "gpu_facts", node.gpu["error"], error=node.gpu["error"])
        for node in cluster.reachable_nodes()
        if node.gpu.get("error") and node.gpu["error"] not in ("skipped", "no result")
    ]


def obs_gpu_count_below_plan(cluster, params):
    if (cluster.plan.get("cluster") or {}).get("device") != "cuda":
        return []
    hits = []
    for node in cluster.reachable_nodes():
        needed = len(node.plan.get("local_gpus") or [])
        count = node.gpu.get("count")
        if node.gpu and count is not None and needed and count < needed:
            hits.append(make_hit(node, "nvidia-smi", f"{node.name} shows {count} GPU(s); the plan places {needed} ranks there",
                                 count=count, needed=needed, visible=count))
    return hits
