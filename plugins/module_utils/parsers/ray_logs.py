"""Ray's own logs: which files of a session to read, their bounded tails, and the start-up failures they name.

A Ray node writes its session's logs under ``<temp-dir>/session_latest/logs`` (``raylet.out``,
``gcs_server.out``, ``worker-*.out`` ...); ``ray start`` prints its own errors to the unit's journal.
``select_files`` and ``tail_lines`` bound what ``doctor_gather`` reads; ``failures`` reads lines (a
file's, a journal's or a pasted log's) and returns Ray's start-up failures with the values the log
quotes: the port a component could not bind, the GCS address a node could not reach, the versions
of a mismatch, the node IP no raylet matches.

Pure Python 3.11, no Ansible import.
"""

from __future__ import annotations

import re

# The session files the doctor reads, the daemons' first, then the newest worker logs.
DAEMON_FILES = (
    "raylet.out", "raylet.err", "gcs_server.out", "gcs_server.err",
    "dashboard.log", "dashboard.err", "monitor.log", "monitor.err",
)
# A failing Ray unit's logs are read from this long before its current attempt: the attempts before it (the
# restart back-off of ray_cluster's units reaches 60 s; ray start gives up on a raylet after about 30 s).
FAILING_LOOKBACK_S = 300
_INDEXED = re.compile(r"^(?P<stem>[a-z_]+)(?:\.\d+)?(?P<ext>\.(?:out|err|log))$")
WORKER_FILE = re.compile(r"^(?:worker-.*\.(?:out|err)|python-core-worker-.*\.log)$")

# Terminal colours Ray prints into its journal ("\x1b[37mLocal node IP\x1b[39m"); a journal may keep them
# without the escape byte.
_COLOUR = re.compile(r"\x1b?\[(?:\d{1,3};)*\d{1,3}m")
# Lines worth keeping from before a file's tail: Ray's error and fatal lines ("[... E 123 123]", "C"), C++ check
# failures, Python exceptions.
_SEVERE = re.compile(r"^\[[^\]]* [EFC] \d+ \d+\]|^E\d{4} |Check failed|Error|error:|Exception|already in use")


def _daemon_file(name):
    """The daemon file ``name`` is one of (``raylet.out``), or None. A daemon started again in the same session
    (a worker node's Ray restarted while the head runs) writes ``raylet.1.out``, ``raylet.2.out``, ...
    (Ray's ``Node._make_inc_temp``)."""
    match = _INDEXED.match(name)
    if not match:
        return None
    base = f"{match.group('stem')}{match.group('ext')}"
    return base if base in DAEMON_FILES else None


def select_files(entries, since=None, workers=8):
    """The names to read among ``entries`` [(name, mtime, size)]: each daemon file's newest copy, then the
    ``workers`` newest worker logs; a file last written before ``since`` (the Ray unit's last start, epoch
    seconds) is left out."""
    fresh = [(name, mtime) for name, mtime, _size in entries if since is None or mtime is None or mtime >= since]
    newest = {}
    for name, mtime in fresh:
        base = _daemon_file(name)
        if base and (base not in newest or (mtime or 0, name) > (newest[base][1] or 0, newest[base][0])):
            newest[base] = (name, mtime)
    chosen = [newest[base][0] for base in DAEMON_FILES if base in newest]
    worker_logs = sorted((entry for entry in fresh if WORKER_FILE.match(entry[0])), key=lambda e: (-(e[1] or 0), e[0]))
    chosen.extend(name for name, _ in worker_logs[:workers])
    return chosen


def clean(line):
    """A log line without Ray's colour codes and trailing space."""
    return _COLOUR.sub("", line).rstrip()


def tail_lines(data, lines=200, cut_head=False, earlier=50):
    """The last ``lines`` non-blank lines of ``data`` (bytes or text) and, before them, up to ``earlier`` of the
    error lines that precede them (a failure at start-up stays when a daemon kept logging after it).
    ``cut_head``: ``data`` starts inside a line (the file was read from an offset); that piece is dropped."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    rows = text.splitlines()
    if cut_head and rows:
        rows = rows[1:]
    rows = [clean(row) for row in rows if row.strip()]
    tail = rows[-lines:] if lines > 0 else []
    head = [row for row in rows[: len(rows) - len(tail)] if _SEVERE.search(row)][-earlier:] if earlier else []
    return head + tail


_COMPONENT = r"\((?P<component>raylet|gcs_server|dashboard[\w]*|[a-z_]+)\)"
# (pattern, the component when neither the line nor the file names it)
_PORT_PATTERNS = (
    # raylet / gcs_server (C++): "Check failed: server_ Failed to start the grpc server. The specified port is 6380."
    (re.compile(rf"(?:{_COMPONENT} .*)?Failed to start the grpc server\. The specified port is (?P<port>\d+)"),
     "raylet or GCS"),
    # gRPC's own bind error in the daemon's .err file
    (re.compile(r"No address added out of total \d+ resolved for '(?P<bind>[^']*):(?P<port>\d+)'.*"
                r"[Aa]ddress already in use"), "raylet or GCS"),
    # ray start's check of the dashboard port
    (re.compile(r"Failed to bind to (?P<bind>\S+?):(?P<port>\d+) because it's already occupied"), "dashboard"),
    # two of Ray's components given one port
    (re.compile(r"Ray component (?P<component>\w+) is trying to use a port number (?P<port>\d+) "
                r"that is used by other components"), "ray"),
    # uvicorn (the dashboard, Serve): "error while attempting to bind on address ('0.0.0.0', 8265): address already in use"
    (re.compile(r"error while attempting to bind on address \('(?P<bind>[^']*)', (?P<port>\d+)\): .*"
                r"[Aa]ddress already in use"), "dashboard"),
)
# (pattern, what failed: connect to the GCS, or register the node with it)
_GCS_PATTERNS = (
    (re.compile(r"Failed to connect to GCS at address (?P<address>[^\s:]+|\[[^\]]+\]):(?P<port>\d+) "
                r"within (?P<seconds>\d+) seconds"), "connect"),
    (re.compile(r"Unable to connect to GCS (?:\(ray head\) )?at (?P<address>[^\s:]+|\[[^\]]+\]):(?P<port>\d+)"), "connect"),
    (re.compile(r"Failed to get cluster ID from GCS server"), "connect"),
    (re.compile(r"The current node timed out during startup"), "register"),
    (re.compile(r"GCS cannot find the node with node ID \w+\. The node registration may not be complete"), "register"),
    (re.compile(r"Failed to register (?:the )?(?:node|raylet|worker)\b"), "register"),
)
_VERSION_START = re.compile(r"Version mismatch: The cluster was started with")
_VERSION_PARTS = re.compile(
    r"The cluster was started with:?\s*(?:\|\s*)?Ray: (?P<cluster_ray>\S+)\s*(?:\|\s*)?Python: (?P<cluster_python>[\d.]+)"
    r".*?This process on node (?P<address>\S+) was started with:?\s*(?:\|\s*)?Ray: (?P<node_ray>\S+)\s*(?:\|\s*)?"
    r"Python: (?P<node_python>[\d.]+)")
_NODE_IP_PATTERNS = (
    re.compile(r"This node has an IP address of (?P<address>[0-9A-Fa-f:.]+[0-9A-Fa-f]), while we can not find the "
               r"matched Raylet address"),
    re.compile(r"found raylets at (?P<raylets>.+?) but none of these match this node's IP (?P<address>[0-9A-Fa-f:.]+[0-9A-Fa-f])"),
)
_LOCAL_IP = re.compile(r"Local node IP[^:]*: (?P<address>[0-9A-Fa-f:.]+[0-9A-Fa-f])")

# Which component a session file belongs to, for a line that does not say it.
_FILE_COMPONENT = (("raylet", "raylet"), ("gcs_server", "gcs_server"), ("dashboard", "dashboard"))


def _component(source):
    for prefix, component in _FILE_COMPONENT:
        if (source or "").startswith(prefix):
            return component
    return None


def _values(match):
    return {key: value for key, value in match.groupdict().items() if value is not None}


def failures(lines, source=None):
    """Ray's start-up failures in ``lines``: [{kind, line, values}], in the order of the log.

    kind ``port_in_use`` (values port, component, bind), ``gcs_unreachable`` (what: connect or register;
    address, port, seconds where the line names them), ``version_mismatch`` (cluster_ray, cluster_python, node_ray,
    node_python, address), ``node_ip_unmatched`` (address, raylets) and ``local_ip`` (address: the node IP Ray
    took, not a failure by itself). ``source`` names the file the lines come from (raylet.err names the raylet).
    A failure printed again (the same kind and values) is returned once, with its first line.
    """
    rows = [clean(line) for line in lines or []]
    found = []
    seen = set()

    def add(kind, line, values):
        key = (kind, tuple(sorted(values.items())))
        if key in seen:
            return
        seen.add(key)
        found.append({"kind": kind, "line": line.strip()[:300], "values": values})

    for index, row in enumerate(rows):
        for pattern, component in _PORT_PATTERNS:
            match = pattern.search(row)
            if match:
                values = _values(match)
                values.setdefault("component", _component(source) or component)
                add("port_in_use", row, values)
                break
        for pattern, what in _GCS_PATTERNS:
            match = pattern.search(row)
            if match:
                add("gcs_unreachable", row, {**_values(match), "what": what})
                break
        if _VERSION_START.search(row):
            # Ray prints the versions on the five lines that follow
            window = " | ".join(text.strip() for text in rows[index: index + 6] if text.strip())
            match = _VERSION_PARTS.search(window)
            add("version_mismatch", window, _values(match) if match else {})
        for pattern in _NODE_IP_PATTERNS:
            match = pattern.search(row)
            if match:
                add("node_ip_unmatched", row, _values(match))
                break
        match = _LOCAL_IP.search(row)
        if match:
            add("local_ip", row, _values(match))
    return found
