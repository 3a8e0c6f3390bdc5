"""Where a failure was raised: the root exception of a journal and the subsystem that raised it.

Every vLLM failure carries its root exception (the first traceback of the
failure: a worker's, quoted inside Ray's ``RayTaskError`` or chained before the
API server's "See root cause above") and the frames it was raised through.
``raise_site(lines, table)`` reads them (``parsers/traceback.py``) and decides
the subsystem from the table ``roles/doctor/files/subsystems.yml``
(``load_subsystems`` checks it): a decisive exception type, else the deepest
vLLM frame inside a mapped prefix, else the deepest library frame, else the
module that defines the exception's type or its name, else its errno, else the
subsystem its message names first. Without a traceback, the journal's error
lines (NCCL's ``NCCL WARN``, c10d's ``[E... socket.cpp]``, Ray's C++ errors, an
exception or errno line on its own, a command's "error:", a logged ERROR) stand
for it. ``layout_problems`` checks the table against an installed vLLM.

``fallback_findings`` turns it into the doctor's ``raised_in_<subsystem>``
signatures, which rank below every signature of the catalog and above
``unit_failed`` (``diagnosis.diagnose``).

Pure Python 3.11, no Ansible import (PyYAML only in ``load_subsystems_file``).
"""

from __future__ import annotations

import re

from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import VLLM_UNIT, make_hit
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.observations_node import (
    _stopped_on_request,
    _unit_line,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers import traceback as tb

SUBSYSTEMS_VERSION = 1
SUBSYSTEM_IDS = ("distributed", "model_loading", "memory", "configuration", "tokenizer", "compilation", "ray",
                 "cuda", "api_server")
FINDING_PREFIX = "raised_in_"
MAX_QUOTED = 300
_ERRNO = re.compile(r"\[Errno (?P<errno>-?\d+)\]")
_SITE_PACKAGES = re.compile(r"^.*/(?:site|dist)-packages/")
_STDLIB = re.compile(r"^.*/lib/python3\.\d+/")


class SubsystemsError(ValueError):
    """The subsystem table is malformed; the message names the subsystem and the field."""


def _require(condition, where, message):
    if not condition:
        raise SubsystemsError(f"{where}: {message}")


def _strings(value, where, key, required=False):
    _require(isinstance(value, list) and all(isinstance(item, str) and item.strip() for item in value)
             and (value or not required), where, f"'{key}' must be a list of strings, got {value!r}")
    return [item.strip() for item in value]


def _patterns(value, where, key):
    compiled = []
    for pattern in _strings(value, where, key):
        try:
            compiled.append(re.compile(pattern))
        except re.error as error:
            raise SubsystemsError(f"{where}: '{key}' {pattern!r} is not a valid regular expression: {error}") from None
    return compiled


def load_subsystems(data):
    """Validate the table (as YAML loads it): {version, priority, verify, passes_on, subsystems, unmapped, prefixes}.

    ``prefixes`` is every prefix of the table, longest first, as (prefix, function or None, subsystem id or None).
    """
    _require(isinstance(data, dict), "subsystems", f"must be a mapping, got {type(data).__name__}")
    _require(data.get("subsystems_version") == SUBSYSTEMS_VERSION, "subsystems",
             f"subsystems_version must be {SUBSYSTEMS_VERSION}, got {data.get('subsystems_version')!r}")
    priority = data.get("priority")
    _require(isinstance(priority, int) and not isinstance(priority, bool) and 1 <= priority <= 100, "subsystems",
             f"'priority' must be an integer 1-100, got {priority!r}")
    verify = data.get("verify")
    _require(isinstance(verify, str) and verify.strip(), "subsystems", "'verify' must be a non-empty string")
    entries = data.get("subsystems")
    _require(isinstance(entries, list) and entries, "subsystems", "'subsystems' must be a non-empty list")
    unmapped = data.get("unmapped") or {}
    reasons_given = isinstance(unmapped, dict) and all(
        isinstance(reason, str) and reason.strip() for reason in unmapped.values())
    _require(reasons_given,
             "unmapped", "must map each prefix to the reason it is left unmapped")
    table = {"priority": priority, "verify": verify.strip(), "subsystems": [], "unmapped": dict(unmapped),
             "passes_on": _patterns(data.get("passes_on") or [], "subsystems", "passes_on")}
    seen, prefixes, former = set(), {}, set()
    for index, entry in enumerate(entries):
        where = f"subsystem #{index + 1}"
        _require(isinstance(entry, dict), where, f"must be a mapping, got {entry!r}")
        name = entry.get("id")
        _require(name in SUBSYSTEM_IDS, where, f"'id' must be one of {list(SUBSYSTEM_IDS)}, got {name!r}")
        where = f"subsystem {name}"
        _require(name not in seen, where, "the id is used twice")
        seen.add(name)
        unknown = set(entry) - {"id", "title", "prefixes", "former_prefixes", "decisive_exceptions",
                                "decisive_messages", "exceptions", "errno", "messages", "checks", "cause", "fix", "verify"}
        _require(not unknown, where, f"unknown keys {sorted(unknown)}")
        for key in ("title", "cause", "fix"):
            _require(isinstance(entry.get(key), str) and entry[key].strip(), where, f"'{key}' must be a non-empty string")
        errno = entry.get("errno", [])
        _require(isinstance(errno, list) and all(isinstance(n, int) and not isinstance(n, bool) for n in errno),
                 where, f"'errno' must be a list of integers, got {errno!r}")
        subsystem = {
            "id": name,
            "title": entry["title"].strip(),
            "prefixes": (_strings(entry.get("prefixes"), where, "prefixes", required=True)
                         + _strings(entry.get("former_prefixes", []), where, "former_prefixes")),
            "decisive_exceptions": _strings(entry.get("decisive_exceptions", []), where, "decisive_exceptions"),
            "decisive_messages": _patterns(entry.get("decisive_messages", []), where, "decisive_messages"),
            "exceptions": _strings(entry.get("exceptions", []), where, "exceptions"),
            "errno": list(errno),
            "messages": _patterns(entry.get("messages", []), where, "messages"),
            "checks": _strings(entry.get("checks"), where, "checks", required=True),
            "cause": " ".join(entry["cause"].split()),
            "fix": " ".join(entry["fix"].split()),
            "verify": " ".join((entry.get("verify") or verify).split()),
        }
        table["subsystems"].append(subsystem)
        for prefix in subsystem["prefixes"]:
            _require(prefix not in prefixes, where, f"the prefix {prefix!r} is already given to {prefixes.get(prefix)}")
            prefixes[prefix] = name
        former.update(_strings(entry.get("former_prefixes", []), where, "former_prefixes"))
    for prefix in unmapped:
        _require(prefix not in prefixes, "unmapped", f"{prefix!r} is mapped to {prefixes.get(prefix)} too")
        prefixes[prefix] = None
    table["former_prefixes"] = sorted(former)
    table["prefixes"] = sorted(((*_split_prefix(p), name) for p, name in prefixes.items()),
                               key=lambda item: (-len(item[0]), item[1] is None))
    return table


def _split_prefix(prefix):
    path, _, function = prefix.partition(":")
    return path, function or None


def load_subsystems_file(path):
    import yaml  # the controller has PyYAML (Ansible needs it); only this loader uses it

    with open(path, encoding="utf-8") as handle:
        return load_subsystems(yaml.safe_load(handle))


def module_path(file):
    """A frame's file as a module path: "vllm/distributed/parallel_state.py", "torch/cuda/__init__.py".

    Below site-packages (or dist-packages) when installed; a source checkout of vLLM from its last "vllm/"
    directory; the standard library from its python3.X directory; else the path as printed.
    """
    text = str(file or "").replace("\\", "/")
    if _SITE_PACKAGES.match(text):
        return _SITE_PACKAGES.sub("", text)
    if "/vllm/" in text:
        return "vllm/" + text.rsplit("/vllm/", 1)[1]
    if _STDLIB.match(text):
        return _STDLIB.sub("", text)
    return text.lstrip("/")


def frame_subsystem(frame, table):
    """(subsystem id or None, the prefix that decided or None) of one frame: the longest prefix that holds it."""
    path = module_path(frame.get("file"))
    for prefix, function, name in table["prefixes"]:
        if path.startswith(prefix) and (function is None or frame.get("function") == function):
            return name, prefix
    return None, None


def _type_matches(exception_type, names):
    bare = re.sub(r"\(.*\)$", "", exception_type or "")
    last = bare.rsplit(".", 1)[-1]
    return any(name == bare or ("." not in name and name == last) for name in names)


def _by_type(record, table, key, exclude=()):
    for subsystem in table["subsystems"]:
        if subsystem["id"] not in exclude and _type_matches(record.get("type"), subsystem[key]):
            return subsystem["id"]
    return None


def _by_errno(text, table, exclude=()):
    match = _ERRNO.search(text or "")
    if not match:
        return None
    number = int(match.group("errno"))
    for subsystem in table["subsystems"]:
        if subsystem["id"] not in exclude and abs(number) in subsystem["errno"]:
            return subsystem["id"]
    return None


def _by_message(text, table, exclude=(), key="messages"):
    """The subsystem whose pattern matches first in the message (the first thing it names); table order on a tie."""
    found = []
    for order, subsystem in enumerate(table["subsystems"]):
        if subsystem["id"] in exclude:
            continue
        starts = [match.start() for pattern in subsystem[key] for match in [pattern.search(text or "")] if match]
        if starts:
            found.append((min(starts), order, subsystem["id"]))
    return min(found)[2] if found else None


def _by_type_module(exception_type, table, exclude=()):
    """The subsystem of the module that defines the exception type ("huggingface_hub.errors.X": huggingface_hub/)."""
    parts = re.sub(r"\(.*\)$", "", exception_type or "").split(".")[:-1]
    if not parts:
        return None
    name, _ = frame_subsystem({"file": "/".join(parts) + "/", "function": None}, table)
    return None if name in exclude else name


def _by_frames(frames, table):
    """(subsystem, frame) of the deepest vLLM frame inside a mapped prefix, else of the deepest library frame."""
    for want_vllm in (True, False):
        for frame in reversed(frames):
            if module_path(frame.get("file")).startswith("vllm/") != want_vllm:
                continue
            name, _ = frame_subsystem(frame, table)
            if name:
                return name, frame
    return None, None


def passes_on(text, table):
    """Whether an exception line only reports a failure raised elsewhere ("See root cause above", RayTaskError)."""
    return any(pattern.search(text or "") for pattern in table["passes_on"])


def classify(record, table, exclude=()):
    """(subsystem id or None, how it was decided, the frame that decided or the raising frame) of one exception.

    exclude: subsystems that cannot have raised it where it was logged (the API server in a unit that runs
    none); frames decide whatever it holds.
    """
    frames = record.get("frames") or []
    raising = frames[-1] if frames else None
    exception = f"{record.get('type')}: {record.get('full_message') or record.get('message') or ''}"
    name = _by_type(record, table, "decisive_exceptions")
    if name:
        return name, "exception type", raising
    name = _by_message(exception, table, key="decisive_messages")
    if name:
        return name, "message", raising
    name, frame = _by_frames(frames, table)
    if name:
        return name, "frame", frame
    name = _by_type_module(record.get("type"), table, exclude) or _by_type(record, table, "exceptions", exclude)
    if name:
        return name, "exception type", raising
    name = _by_errno(exception, table, exclude)
    if name:
        return name, "errno", raising
    name = _by_message(exception, table, exclude)
    return name, ("message" if name else None), raising


def _clip(text):
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_QUOTED else text[: MAX_QUOTED - 3] + "..."


def _frame_text(frame):
    if not frame:
        return "an unknown place (no frame printed)"
    return f"{module_path(frame['file'])}:{frame['line']}"


def raise_site(lines, table, exclude=()):
    """The root error of the last failure in journal lines and the subsystem that raised it; None without one.

    Returns {subsystem (id or None), how ("frame", "exception type", "errno", "message" or None), exception (type and
    message, the message joined over its lines), type, message, frame ({file, line, function} of the raising
    frame or None), decided_by (the frame that decided, when a frame did), process, quotes: [(index, text)] of
    the original lines quoted, traceback (True when a traceback was read), strong (a traceback or an error
    line that names its error, not only an ERROR header)}.
    """
    lines = list(lines or [])
    records = tb.parse_tracebacks(lines)
    errors = tb.error_lines(lines)
    if records:
        last = records[-1]
        failure = [record for record in records if record["failure"] == last["failure"]]
        root = failure[0]
        # A root that only reports a failure elsewhere: an error line before it, or another traceback, decides.
        candidates = [record for record in failure if not passes_on(record["exception"], table)] or [root]
        chosen = candidates[0]
        name, how, frame = classify(chosen, table, exclude)
        if passes_on(chosen["exception"], table):
            name = how = frame = None  # its frames are those of the process that reported it, not of the failure
        if name is None:
            for record in failure:
                if record is not chosen and not passes_on(record["exception"], table):
                    name, how, _ = classify(record, table, exclude)
                    if name:
                        break
        if passes_on(chosen["exception"], table) or name is None:
            before = [item for item in errors if item["line"] < chosen["start"] and not item["in_traceback"]
                      and item["strong"]]
            for item in before:
                guess = _error_line_subsystem(item, table, exclude)
                if guess[0]:
                    return _site_from_error_line(item, guess, lines)
        quotes = [(chosen["line"], lines[chosen["line"]].strip())]
        quotes += [(index, lines[index].strip()) for index in range(chosen["line"] + 1, chosen["end"] + 1)]
        raising = chosen["frames"][-1] if chosen["frames"] else None
        return {
            "subsystem": name,
            "how": how,
            "exception": _clip(f"{chosen['type']}: {chosen['full_message']}" if chosen["full_message"]
                               else chosen["type"]),
            "type": chosen["type"],
            "message": chosen["full_message"],
            "frame": raising,
            "decided_by": frame if how == "frame" else None,
            "process": chosen["process"],
            "quotes": quotes,
            "traceback": True,
            "strong": True,
        }
    # Lines that name their error first; else ERROR lines, then Python warnings (a library's last word).
    pool = [item for item in errors if item["strong"]] or sorted(errors, key=lambda item: item["kind"] != "logged error")
    if not pool:
        return None
    for item in pool:
        guess = _error_line_subsystem(item, table, exclude)
        if guess[0]:
            return _site_from_error_line(item, guess, lines)
    return _site_from_error_line(pool[0], (None, None), lines)


def _error_line_subsystem(item, table, exclude=()):
    """(subsystem or None, how) of an error line: an exception line by its type, else its errno, else its message."""
    if item.get("type"):
        message = item["text"].split(": ", 1)[1] if ": " in item["text"] else item["text"]
        record = {"type": item["type"], "full_message": message, "frames": item.get("frames") or []}
        name, how, _ = classify(record, table, exclude)
        return name, how
    name = _by_message(item["text"], table, key="decisive_messages") or _by_errno(item["text"], table, exclude)
    if name:
        return name, ("message" if _by_message(item["text"], table, key="decisive_messages") else "errno")
    name = _by_message(item["text"], table, exclude)
    return name, ("message" if name else None)


def _line_label(item):
    """What an error line is, in words: its exception type, else "NCCL WARN", "c10d error", "[Errno 13] error"."""
    if item["kind"] == "Python warning":
        return item["type"]
    if item.get("type"):
        return item["type"]
    if item["kind"] == "errno":
        return _ERRNO.search(item["text"]).group(0) + " error"
    return {"c10d": "c10d error", "logged error": "ERROR line"}.get(item["kind"], item["kind"])


def _site_from_error_line(item, decided, lines):
    return {
        "subsystem": decided[0],
        "how": decided[1],
        "exception": _clip(item["text"]),
        "type": _line_label(item),
        "message": item["text"],
        "frame": (item.get("frames") or [None])[0],
        "decided_by": (item.get("frames") or [None])[0] if decided[1] == "frame" else None,
        "process": item["process"],
        "quotes": [(index, lines[index].strip()) for index in range(item["line"], item["end"] + 1)],
        "traceback": False,
        "strong": item["strong"],
        "exception_line": item["kind"] == "exception",
    }


def finding_values(site, unit):
    """The placeholders a raised_in finding fills from its raise site."""
    frame = site.get("frame") or {}
    errno = _ERRNO.search(site.get("exception") or "")
    return {
        "unit": unit,
        "exception": site["exception"],
        "type": site["type"],
        "message": _clip(site.get("message") or ""),
        "frame": _frame_text(frame) if frame else "a line with no traceback",
        "function": frame.get("function") or "no function (no traceback)",
        "module": module_path(frame.get("file")) if frame else "unknown",
        "errno": errno.group("errno") if errno else "none",
        "subsystem": site.get("subsystem") or "unknown",
        "raised": f"{site['type']} raised" if site.get("traceback") or site.get("exception_line") else
                  f"{site['type']} logged",
    }


def evidence_line(site):
    """The raise site as one line of evidence: root exception, raised at file:line in function."""
    text = f"{site['process']} " if site.get("process") else ""
    text += f"root error: {site['exception']}"
    if site.get("frame"):
        frame = site["frame"]
        text += f"; raised at {_frame_text(frame)} in {frame.get('function') or '?'}"
    if site.get("decided_by") and site["decided_by"] is not site.get("frame"):
        decided = site["decided_by"]
        text += f"; inside {_frame_text(decided)} in {decided.get('function') or '?'}"
    return text


def signature(subsystem, table):
    """The catalog-shaped signature of raised_in_<subsystem>, as diagnosis.diagnose ranks and renders it."""
    return {
        "id": FINDING_PREFIX + subsystem["id"],
        "family": "startup",
        "seed_branch": "startup fails",
        "severity": "fault",
        "priority": table["priority"],
        "title": f"{{raised}} in {subsystem['title']} on {{nodes}}",
        "symptom": ("The unit fails (or its journal holds an error) with an exception no signature of the catalog "
                    "names; it was raised in " + subsystem["title"] + "."),
        "checks": list(subsystem["checks"]),
        "cause": subsystem["cause"],
        "fix": subsystem["fix"],
        "verify": subsystem["verify"],
        "rules": [],
        # unit_failed's place: a reason a unit fails (causality's head_down), and what it explains.
        "explains": ["unit_failed", "router_worker_unhealthy"],
        "references": [],
        "defaults": {},
    }


def _unit_state(node, unit):
    """"failing" (failed or restarting, not stopped on request), "running" (active) or "other"."""
    info = node.unit(unit)
    state = info.get("ActiveState")
    if (state == "failed" and not _stopped_on_request(node, unit)) or (
            state == "activating" and info.get("SubState") == "auto-restart"):
        return "failing"
    return "running" if state in ("active", "reloading") else "other"


def _units_read(cluster, node):
    units = list(cluster.expected_units(node))
    units += [unit for unit in (node.gather.get("journal") or {}) if unit not in units]
    return units


# Evidence that a unit fails says nothing of why: a signature resting on it alone (ray_not_running on a failed Ray
# unit) names no cause the raise site could not name better.
UNIT_STATE_KINDS = ("unit_failed",)


def _specific_fault_nodes(matched, unit_failed_id, priority):
    """Nodes where a signature of the catalog more specific than the fallback found a fault (not only a unit's state)."""
    nodes = set()
    for _, sig, hits, _ in matched:
        if sig["id"] != unit_failed_id and sig["severity"] == "fault" and sig["priority"] > priority:
            nodes.update(hit["node"] for hit in hits if hit["node"] and hit.get("kind") not in UNIT_STATE_KINDS)
    return nodes


def _unit_state_signatures(matched, unit_failed_id):
    """Matched signatures that rest on a unit's failure alone: the raise site explains them."""
    return [sig["id"] for _, sig, hits, _ in matched
            if sig["id"] != unit_failed_id and hits and all(hit.get("kind") in UNIT_STATE_KINDS for hit in hits)]


def _runs_api_server(cluster, node, unit):
    return unit == VLLM_UNIT and node is cluster.head and "--headless" not in (node.plan.get("argv") or [])


def fallback_matches(cluster, matched, table, unit_failed_id="unit_failed"):
    """The matched signatures with raised_in_<subsystem> added where no specific signature found the fault.

    ``matched`` is diagnosis.diagnose's list of (order, signature, hits, kinds). On a node where no signature
    of the catalog ranked above the fallback found a fault, every unit that fails, or whose journal holds a
    traceback or a strong error line (NCCL WARN, c10d, an exception or errno line), is read for its raise
    site; when its subsystem is known, raised_in_<subsystem> quotes it (a fault when the unit is not running,
    else a warning) and the unit's unit_failed hits give way to it.
    """
    if not table:
        return matched
    specific = _specific_fault_nodes(matched, unit_failed_id, table["priority"])
    by_subsystem, replaced = {}, set()
    for node in cluster.reachable_nodes():
        if node.name in specific:
            continue
        for unit in _units_read(cluster, node):
            state = _unit_state(node, unit) if node.installed(unit) else "other"
            exclude = () if _runs_api_server(cluster, node, unit) else ("api_server",)
            site = raise_site(node.journal(unit), table, exclude)
            if site is None or site["subsystem"] is None:
                continue
            if state == "running" and not (site["traceback"] or site["strong"]):
                continue  # a running unit's ERROR line (a request that failed) is no failure of the unit
            values = finding_values(site, unit)
            hits = [make_hit(node, f"journal {unit}", evidence_line(site), **values),
                    make_hit(node, f"journal {unit}", " | ".join(_clip(text) for _, text in site["quotes"]), **values)]
            if node.installed(unit):
                hits.append(make_hit(node, "systemctl", _unit_line(node, unit), **values))
            entry = by_subsystem.setdefault(site["subsystem"], {"hits": [], "fault": False})
            entry["hits"].extend({**hit, "kind": "log"} for hit in hits)
            entry["fault"] = entry["fault"] or state != "running"
            replaced.add((node.name, unit))
    if not by_subsystem:
        return matched
    kept = []
    for order, sig, hits, kinds in matched:
        if sig["id"] == unit_failed_id:
            hits = [hit for hit in hits if (hit["node"], hit["values"].get("unit")) not in replaced]
            if not hits:
                continue
        kept.append((order, sig, hits, kinds))
    start = max((order for order, *_ in matched), default=0) + 1
    state_only = _unit_state_signatures(kept, unit_failed_id)
    for offset, subsystem in enumerate(table["subsystems"]):
        entry = by_subsystem.get(subsystem["id"])
        if entry:
            sig = signature(subsystem, table)
            sig["explains"] = sig["explains"] + state_only
            sig["severity"] = "fault" if entry["fault"] else "warning"
            kept.append((start + offset, sig, entry["hits"], {"log"}))
    return kept


def _entries(directory):
    """A package's modules and sub-packages, as names ending in ".py" or "/" (no caches, data or extensions)."""
    import os

    names = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if name.startswith(("__pycache__", ".")):
            continue
        if os.path.isdir(path) and any(entry.endswith(".py") or os.path.isdir(os.path.join(path, entry))
                                       for entry in os.listdir(path) if entry != "__pycache__"):
            names.append(name + "/")
        elif name.endswith(".py"):
            names.append(name)
    return names


def _exists(path):
    """A prefix exists: the package ("x/"), the module ("x.py"), or a name that starts so ("x/tokenization_")."""
    import os

    if path.endswith("/"):
        return os.path.isdir(path)
    if path.endswith(".py"):
        return os.path.isfile(path)
    parent, start = os.path.split(path)
    return os.path.isdir(parent) and any(name.startswith(start) for name in os.listdir(parent))


def layout_problems(table, vllm_dir, site_packages=None):
    """What the table no longer says right about an installed vLLM: [problem], [] when it is current.

    Every vLLM prefix of the table (mapped or unmapped) must exist under ``vllm_dir``; every module and
    package of vLLM must be held by a prefix, or be a package whose every entry is (one the table splits:
    ``vllm/v1/``), an ``__init__.py`` of such a package being left out. Library prefixes are checked against
    ``site_packages`` where that library is installed.
    """
    import os

    problems = []
    vllm_dir = os.path.abspath(vllm_dir)
    paths = [prefix for prefix, _, _ in table["prefixes"]]
    for prefix, function, name in table["prefixes"]:
        label = f"{prefix}:{function}" if function else prefix
        if prefix in table.get("former_prefixes", ()):
            continue  # a path of an earlier vLLM, kept for the logs users still paste
        if prefix.startswith("vllm/"):
            where = os.path.join(os.path.dirname(vllm_dir), prefix)
            if not _exists(where):
                problems.append(f"{label} ({name or 'unmapped'}): nothing of that path in the installed vLLM")
            elif function and f"def {function}(" not in open(where, encoding="utf-8").read():
                problems.append(f"{label} ({name}): {prefix} defines no function {function}")
        elif site_packages:
            top = prefix.split("/", 1)[0]
            if os.path.exists(os.path.join(site_packages, top)) and not _exists(os.path.join(site_packages, prefix)):
                problems.append(f"{label} ({name}): nothing of that path in the installed {top}")

    def check(relative):
        for entry in _entries(os.path.join(os.path.dirname(vllm_dir), relative)):
            path = relative + entry
            if any(path.startswith(prefix) for prefix in paths):
                continue
            below = [prefix for prefix in paths if prefix.startswith(path) and prefix != path]
            if entry.endswith("/") and below:
                check(path)
            elif entry == "__init__.py" and relative != "vllm/":
                continue
            else:
                problems.append(f"{path}: neither mapped to a subsystem nor listed as unmapped in subsystems.yml")

    check("vllm/")
    return problems
