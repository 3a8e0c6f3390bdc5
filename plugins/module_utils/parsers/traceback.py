"""Python tracebacks in a unit's journal: the exception line of the last one, and of the first (root) one.

A vLLM or Ray unit that fails prints one traceback or several before it exits:
the worker that failed, then the engine that lost it, then the API server that
gave up ("Engine core initialization failed. See root cause above"). What went
wrong is in a traceback's exception line (``ValueError: The model's max seq len
...``), never in its frame lines (``File "...", line N, in f``), the code lines
under them or the carets (``^^^^``) under those.

``last_exception(lines)`` returns the exception line of the last traceback in
the lines, with its context (the code line of its last frame, or the frame when
the code is not shown, then the exception line and up to two lines that
continue its message), and the root: the exception line of the first traceback
of the same failure (``None`` when it says the same). Tracebacks belong to one
failure when they are chained ("The above exception was the direct cause of
the following exception:", "During handling of the above exception, another
exception occurred:"), when one is quoted inside another's message (Ray's
``RayTaskError(...)`` carries the worker's traceback, which comes first), or
when the later one starts at most ``BURST_GAP`` lines after the earlier one
ended, without a new start of the unit (systemd's ``Starting x.service``)
between them: so the API server's "Engine core initialization failed" has the
engine core's ``ValueError`` as its root, and a traceback from hours before
(a request that failed) does not. ``parse_tracebacks(lines)`` returns every
traceback found, in that order.

Each line may carry prefixes, removed before it is read (``split_line``): a
journal timestamp (``Nov 30 03:04:05 node1 vllm[123]: ``, ``journalctl -o
short-iso``'s ``2026-11-30T03:04:05+0000 node1 vllm[123]: ``, a bracketed
``[2026-01-28T23:59:42Z] ``), the process prefixes of vLLM and Ray
(``(EngineCore_DP0 pid=1234)``, ``(VllmWorker rank=1 pid=1234)``,
``(RayWorkerWrapper pid=1234, ip=10.0.0.2)``), torch's ``[rank0]:`` (and
torchrun's ``[default0]:``), then one log header (vLLM's ``ERROR 12-02
10:00:00 [core.py:12]``, Ray's ``2026-11-30 04:27:24,104 ERROR worker.py:12
--``, torch's ``E1202 10:00:00.123 4567 run.py:12]``, uvicorn's ``ERROR:``),
and Ray's ``[repeated 2x across cluster]`` at the end. Lines are read per
process (their process and rank prefixes), so the tracebacks of two processes
whose lines are interleaved are read apart; inside one traceback, lines of
another log record of the same process (another header) are skipped.

Not read: exception groups (``+ Exception Group Traceback``), and lines that
two processes wrote into each other mid-line.

Pure Python 3.11, no Ansible import.
"""

from __future__ import annotations

import re

from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.text import strip_ansi

# A later traceback belongs to the same failure when it starts at most this many lines (outside tracebacks)
# after the earlier one ended: vLLM's shutdown between a worker's traceback and the API server's.
BURST_GAP = 50
# Lines of an exception's message kept after its exception line in the context.
MAX_CONTINUATION = 2
# Lines read as one message (an exception's, or a log record's written over several lines).
MAX_MESSAGE_LINES = 12

_JOURNAL_PREFIXES = (
    # journalctl -o short: "Nov 30 03:04:05 node1 vllm[123]: "
    re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)? \S+ [^\s:\[]+(?:\[\d+\])?: ?"),
    # journalctl -o short-iso / short-iso-precise: "YYYY-MM-DDT03:04:05+0000 node1 vllm[123]: "
    re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)? \S+ [^\s:\[]+(?:\[\d+\])?: ?"),
    # a collector's bracketed time: "[YYYY-MM-DDT23:59:42Z] "
    re.compile(r"^\[\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\] ?"),
    # docker compose logs: the service's name, padded, and a bar: "vllm-qwen-1  | "
    re.compile(r"^[A-Za-z0-9][\w.-]*\s+\| "),
)
# "(EngineCore_DP0 pid=1234) ", "(VllmWorker rank=1 pid=1234) ", "(RayWorkerWrapper pid=1234, ip=10.0.0.2) "
_PROCESS = re.compile(
    r"^\((?P<name>[A-Za-z_][\w.-]*)(?: rank=\d+)? pid=(?P<pid>\d+)(?:, ip=(?P<ip>[0-9A-Fa-f.:]+))?\) ?"
)
# torch's excepthook "[rank0]: ", torchrun --tee's "[default0]:"
_RANK = re.compile(r"^\[(?P<rank>(?:rank|default)\d+)\]: ?")
_HEADERS = (
    # vLLM: "ERROR 12-02 10:03:49 [core.py:1510] " (0.4-era: no "[" before the file)
    re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)? \[?[\w./-]+:\d+\] ?"),
    # Ray: "YYYY-MM-DD 04:27:24,104\tINFO scripts.py:1088 -- "
    re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+(?:DEBUG|INFO|WARNING|ERROR|CRITICAL|SUCC)\s+[\w./-]+:\d+ -- ?"),
    # torch (glog style): "E1202 09:56:48.357000 19491 torch/distributed/elastic/multiprocessing/api.py:1002] "
    re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [\w./-]+:\d+\] ?"),
    # uvicorn: "ERROR:    "
    re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):\s+"),
)
_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")

_TRACEBACK = re.compile(r"^\s*Traceback \(most recent call last\):\s*$")
_FRAME = re.compile(r'^\s*File "[^"]*", line \d+')
_FRAME_PARTS = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+)(?:, in (?P<function>\S.*?))?\s*$')
_CARETS = re.compile(r"^\s*[\^~]+\s*$")
# "ValueError: ...", "torch.OutOfMemoryError: ...", "ray.exceptions.RayTaskError(ValueError): ...", "KeyboardInterrupt"
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:\([\w., ]*\))?)(?::(?P<message>(?:\s.*)?))?$")
_CHAIN = {
    "The above exception was the direct cause of the following exception:": "cause",
    "During handling of the above exception, another exception occurred:": "context",
}
# Lines that end an exception's message when they follow it (another writer, not the message).
_NOT_MESSAGE = (
    re.compile(r"^\S+\.py:\d+: \w+: "),  # a Python warning: "/usr/lib/python3.11/x.py:254: UserWarning: ..."
    re.compile(r"^Process [\w.-]+:$"),  # multiprocessing's banner before a child's traceback
    re.compile(r"^[\w@:.-]+\.(?:service|scope|socket|target): "),  # systemd about the unit
    re.compile(r"^(?:Starting|Started|Stopping|Stopped|Finished) [\w@:.-]+\.(?:service|scope)\b"),
)
_RULE = re.compile(r"^[=\-*#_~]{3,}$")
# systemd starting the unit again: tracebacks before it belong to an earlier attempt.
_UNIT_START = re.compile(r"^(?:Starting|Started) [\w@:.-]+\.(?:service|scope)\b")


def split_line(line):
    """One journal line -> (process, key, header, body).

    process: the process and rank prefixes as printed (``"(EngineCore_DP0 pid=1)"``, ``""`` without);
    key: the same reduced to pids, ips and ranks (vLLM renames a worker, ``Worker`` to ``Worker_TP0``,
    under one pid); header: the log header, or None; body: the rest, its indentation kept.
    """
    text = strip_ansi(line).rstrip("\r\n")
    shown, key = [], []
    changed = True
    while changed:
        changed = False
        for pattern in _JOURNAL_PREFIXES:
            match = pattern.match(text)
            if match:
                text, changed = text[match.end():], True
        match = _PROCESS.match(text)
        if match:
            shown.append(match.group(0).strip())
            key.append(f"pid={match.group('pid')}" + (f"@{match.group('ip')}" if match.group("ip") else ""))
            text, changed = text[match.end():], True
        match = _RANK.match(text)
        if match:
            shown.append(match.group(0).strip())
            key.append(match.group("rank"))
            text, changed = text[match.end():], True
    header = None
    for pattern in _HEADERS:
        match = pattern.match(text)
        if match:
            header, text = match.group(0).strip(), text[match.end():]
            break
    return " ".join(shown), " ".join(key), header, _REPEATED.sub("", text)


def _streams(lines):
    """{key: [(index, process, header, body), ...]} in the order of the lines."""
    streams = {}
    for index, line in enumerate(lines or []):
        process, key, header, body = split_line(str(line))
        streams.setdefault(key, []).append((index, process, header, body))
    return streams


def _read(items, pos):
    """The traceback that starts at items[pos] (its Traceback line or its first frame) -> (record or None, next pos).

    None when it is cut short: no frame, or no exception line after the frames; the next pos is then
    the first line it skipped as another record's, so that a traceback there is still read.
    """
    start = items[pos][0]
    if _TRACEBACK.match(items[pos][3]):
        pos += 1
    header = frame = code = skipped = None
    framed = False
    frames = []
    while pos < len(items):
        _, _, line_header, body = items[pos]
        if framed and line_header != header:
            skipped = pos if skipped is None else skipped
            pos += 1  # another log record of the same process, written in between
            continue
        if _FRAME.match(body):
            if not framed:
                header, framed = line_header, True
            frame, code = body.strip(), None
            parts = _FRAME_PARTS.match(body)
            if parts:
                frames.append({"file": parts.group("file"), "line": int(parts.group("line")),
                               "function": parts.group("function") or "?"})
            pos += 1
            continue
        if framed and body[:1].isspace() and body.strip():
            # the frame's code line, the carets under it, "[Previous line repeated N more times]"
            if code is None and not _CARETS.match(body) and not body.strip().startswith("[Previous line"):
                code = body.strip()
            pos += 1
            continue
        break
    index, process, _, body = items[pos] if pos < len(items) else (None, None, None, "")
    match = _EXCEPTION.match(body.rstrip())
    if not framed or not match:
        return None, pos if skipped is None else skipped
    record = {
        "exception": body.strip(),
        "type": match.group("type"),
        "message": (match.group("message") or "").strip(),
        "process": process,
        "line": index,
        "start": start,
        "end": index,
        "context": [code or frame, body.strip()],
        "frames": frames,
        "nested": False,
        "chained": None,
    }
    pos += 1
    continued = []  # (index, text) of the lines that go on with the message
    while pos + len(continued) < len(items) and len(continued) < MAX_MESSAGE_LINES:
        index, _, line_header, body = items[pos + len(continued)]
        if not _continues_message(line_header, header, body):
            break
        continued.append((index, body.strip()))
    kept = consumed = 0
    for index, text in continued:
        if kept == MAX_CONTINUATION:
            break
        if not _RULE.match(text):
            record["context"].append(text)
            kept += 1
        record["end"] = index
        consumed += 1
    record["full_message"] = " ".join(
        [record["message"], *(text for _, text in continued if not _RULE.match(text))]).strip()
    pos += consumed
    return record, pos


def _continues_message(line_header, header, body):
    """Whether a line after an exception line goes on with its message (same log record, not a new start)."""
    text = body.strip()
    return not (line_header != header or not text or text == '"""' or text in _CHAIN or _TRACEBACK.match(body)
                or _FRAME.match(body) or any(pattern.match(text) for pattern in _NOT_MESSAGE))


def _stream_tracebacks(items):
    """The tracebacks of one process, in order; a traceback quoted in the message before it is marked nested."""
    records = []
    last = None
    adjacent = quoted = False  # nothing since the last record ended but (quoted) a line of three double quotes
    chain = None
    pos = 0
    while pos < len(items):
        body = items[pos][3]
        starts = _TRACEBACK.match(body) or _FRAME.match(body)
        if starts:
            nested = last is not None and adjacent and (
                (_FRAME.match(body) and not quoted) or (_TRACEBACK.match(body) and quoted))
            record, pos = _read(items, pos)
            if record is not None:
                if nested:
                    record["nested"] = True
                    record["wrapper"] = last
                elif chain and last is not None:
                    record["chained"] = chain
                records.append(record)
                last, adjacent, quoted, chain = record, True, False, None
            else:
                adjacent = quoted = False
                chain = None
            continue
        text = body.strip()
        if last is not None:
            if text == '"""' and adjacent and not quoted:
                quoted = True
            elif text in _CHAIN:
                chain, adjacent = _CHAIN[text], False
            elif text:
                adjacent, chain = False, None
            else:
                adjacent = False
        pos += 1
    return records


def _outermost(record):
    depth = 0
    while record.get("wrapper") is not None:
        record, depth = record["wrapper"], depth + 1
    return record, depth


def _unit_starts(lines):
    starts = set()
    for index, line in enumerate(lines):
        process, _, header, body = split_line(str(line))
        if not process and header is None and _UNIT_START.match(body.strip()):
            starts.add(index)
    return starts


def _same_failure(earlier, later, covered, starts):
    """Whether the traceback after ``earlier`` (in the order of the failure) belongs to the same failure."""
    if earlier["nested"] or later["chained"]:
        return True  # quoted in the one after it; chained by Python
    begin = _outermost(later)[0]["start"]
    if begin <= earlier["end"]:
        return True  # interleaved with it
    between = range(earlier["end"] + 1, begin)
    if any(index in starts for index in between):
        return False
    return sum(1 for index in between if index not in covered) <= BURST_GAP


def parse_tracebacks(lines):
    """Every complete traceback in journal lines, as dicts, in the order of the failure.

    That order is the order of their exception lines, except that a traceback
    quoted in another's message (Ray's RayTaskError) comes just before it.
    Each: exception (the line, prefixes removed), type, message, process (its
    prefixes, "" without), line (index of the exception line), start and end
    (indexes of its first line and of the last line of its message read),
    context (the code line of the last frame, or the frame, then the exception
    line and up to MAX_CONTINUATION lines of the message), nested (quoted in the
    message of the traceback after it), chained ("cause" or "context" when
    Python chained it to the one before, else None), failure (a number shared
    by the tracebacks of one failure, see the module's docstring).
    """
    lines = list(lines or [])
    records = []
    for items in _streams(lines).values():
        records.extend(_stream_tracebacks(items))

    def order(record):
        outer, depth = _outermost(record)
        return outer["line"], -depth

    records.sort(key=order)
    covered = {index for record in records for index in range(record["start"], record["end"] + 1)}
    starts = _unit_starts(lines)
    failure = 0
    for number, record in enumerate(records):
        if number and not _same_failure(records[number - 1], record, covered, starts):
            failure += 1
        record["failure"] = failure
    for record in records:
        record.pop("wrapper", None)
    return records


def last_exception(lines):
    """The exception line of the last traceback in the lines and the root of its failure; None without one.

    Returns {exception, process, context, root, root_process, root_context, full, root_full}:
    root is the exception line of the first traceback of the same failure, None
    when that is the last one or says the same; full and root_full: the type and
    the whole message of each (a message wrapped over several lines, joined).
    """
    records = parse_tracebacks(lines)
    if not records:
        return None
    last = records[-1]
    root = next(record for record in records if record["failure"] == last["failure"])
    differs = root is not last and root["exception"] != last["exception"]
    return {
        "exception": last["exception"],
        "process": last["process"],
        "context": last["context"],
        "root": root["exception"] if differs else None,
        "root_process": root["process"] if differs else None,
        "root_context": root["context"] if differs else None,
        "full": _full(last),
        "root_full": _full(root) if differs else None,
    }


def _full(record):
    return f"{record['type']}: {record['full_message']}" if record["full_message"] else record["type"]


# An exception line on its own (logged without its traceback, or the traceback cut off), after an unknown
# log prefix ending "] " if any: a name ending Error/Exception/..., or a dotted module path and a class name.
_EXCEPTION_LINE = re.compile(
    r"^(?:[^\s\]]*(?: [^\s\]]+){0,6}\] )?[`>|\s]*(?P<type>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Failure|Exit)"
    r"|(?:[a-z_]\w*\.)+[A-Z]\w*)(?:\([\w., ]*\))?: (?P<message>\S.*)$")
# Error lines of programs that print no Python traceback: NCCL, c10d (torch's C++ log), errno lines.
_NCCL_WARN = re.compile(r"\bNCCL WARN\b")
# "[E616 02:08:15.931416442 socket.cpp:1023]", "[E ProcessGroupNCCL.cpp:563]"
_C10D = re.compile(r"\[[EF](?:\d{3,4} \d\d:\d\d:\d\d(?:\.\d+)?(?: \d+)?)? ?[\w./-]+\.(?:cpp|cc|cu|h):\d+\]")
_C10D_ANY_LEVEL = re.compile(r"\[[IWEF](?:\d{3,4} \d\d:\d\d:\d\d(?:\.\d+)?(?: \d+)?)? ?[\w./-]+\.(?:cpp|cc|cu|h):\d+\]")
_GLOG_ERROR = re.compile(r"^[EF]\d{4} ")
_ERRNO_LINE = re.compile(r"\[Errno -?\d+\]")
# Ray's C++ core at level E, F or C (its fatal): "[YYYY-MM-DD 01:49:41,730 E 1 1] gcs_rpc_client.h:179: ..."
_RAY_CPP = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [EFC] \d+ \d+\] ")
# A CUDA runtime error printed by a C++ extension: "Cuda error: out of memory at csrc/cumem_allocator.cpp: 62"
_CUDA_ERROR = re.compile(r"(?i)\bcuda error\b:? \S")
# An exception named by its module path inside a line of prose or another log's prefix:
# "... 报错信息是：torch.cuda.OutOfMemoryError: CUDA out of memory"
_INLINE_EXCEPTION = re.compile(r"(?<![\w.])(?P<type>(?:[a-z_]\w*\.)+[A-Z]\w*(?:Error|Exception)): (?P<message>\S.*)$")
# A command's own error: argparse's "api_server.py: error: unrecognized arguments", "nvidia-container-cli:
# requirement error: ...", "docker: Error response from daemon: ..."
# A Python warning: "/usr/lib/python3.12/site-packages/huggingface_hub/file_download.py:798: UserWarning: ..."
# (not a deprecation: that one says nothing about the failure)
_PY_WARNING = re.compile(
    r"^(?P<file>\S+\.py):(?P<line>\d+): (?P<type>(?!Future|Deprecation|PendingDeprecation)\w*Warning): \S")
_TOOL_ERROR = re.compile(r"^[\w./@-]+: (?:[\w-]+ )?[Ee]rror\b|^[\w./@-]+(?: [\w.-]+){1,2}: error: ")
_LOGGED_ERROR = re.compile(r"^(?:ERROR|CRITICAL)\b|\s(?:ERROR|CRITICAL)\s")


def _error_kind(header, body):
    """(kind, strong, exception type) of a line that reports an error, or None."""
    text = body.strip()
    match = _EXCEPTION_LINE.match(text)
    if match:
        return "exception", True, match.group("type")
    if _NCCL_WARN.search(text):
        return "NCCL WARN", True, None
    if _C10D.search(text):
        return "c10d", True, None
    if header and _GLOG_ERROR.match(header):
        return "c10d", True, None
    if _ERRNO_LINE.search(text):
        return "errno", True, None
    if _RAY_CPP.match(text):
        return "Ray error", True, None
    if not header and _TOOL_ERROR.match(text):
        return "command error", True, None
    inline = _INLINE_EXCEPTION.search(text)
    if inline:
        return "exception", True, inline.group("type")
    if _CUDA_ERROR.search(text):
        return "CUDA error", True, None
    if _PY_WARNING.match(text):
        return "Python warning", False, _PY_WARNING.match(text).group("type")
    if header and _LOGGED_ERROR.search(header) and text and not (
            _TRACEBACK.match(body) or _FRAME.match(body) or body[:1].isspace() or _CARETS.match(body)):
        return "logged error", False, None
    return None


def _continues(first, item):
    """Whether a line goes on with the message of the line ``first`` (both of one process): a log record's
    later lines carry its header again (vLLM's formatter) or, for a line without one, no header."""
    _, _, header, body = item
    text = body.strip()
    if (not text or text in _CHAIN or _TRACEBACK.match(body) or _FRAME.match(body) or _EXCEPTION_LINE.match(text)
            or _NCCL_WARN.search(text) or _C10D_ANY_LEVEL.search(text) or _RAY_CPP.match(text) or any(p.match(text) for p in _NOT_MESSAGE)):
        return False
    if header != first[2]:
        return False
    if header is None:
        # Without a header only an exception's message goes on over several lines.
        return bool(_EXCEPTION_LINE.match(first[3].strip()))
    return True


def wrapped_messages(lines):
    """Messages written over several lines, joined: [{start, end, lines, text, body}].

    start, end, lines: the indexes of the first, the last and every line of the message (another process's
    lines may stand between them); text: the first line as written, then the rest of each later line; body:
    the same without the first line's prefixes.

    A log record whose message holds newlines (vLLM repeats its header on each line) or an exception line
    whose message goes on below it. Lines inside a traceback's frames are never joined.
    """
    lines = list(lines or [])
    found = []
    for items in _streams(lines).values():
        pos = 0
        while pos < len(items):
            first = items[pos]
            body = first[3]
            if not body.strip() or _TRACEBACK.match(body) or _FRAME.match(body) or body[:1].isspace():
                pos += 1
                continue
            end = pos
            while end + 1 < len(items) and end - pos < MAX_MESSAGE_LINES and _continues(first, items[end + 1]):
                end += 1
            if end > pos:
                rest = [items[k][3].strip() for k in range(pos + 1, end + 1)]
                found.append({"start": first[0], "end": items[end][0], "lines": [items[k][0] for k in range(pos, end + 1)],
                              "text": " ".join([lines[first[0]].strip(), *rest]),
                              "body": " ".join([body.strip(), *rest])})
            pos = end + 1
    return sorted(found, key=lambda item: item["start"])


def error_lines(lines):
    """Every line that reports an error, in order: [{line, end, text, process, kind, type, strong, in_traceback}].

    kind: "exception" (an exception line), "NCCL WARN", "c10d" (torch's C++ log at level E or F), "errno"
    (an ``[Errno N]``), "Ray error" (Ray's C++ log at level E, F or C), "CUDA error", "command error"
    (``prog: error: ...``),
    "logged error" (a log record at ERROR or CRITICAL), "Python warning" (``file.py:N: XWarning: ...``);
    strong: every kind but the last two; type: the exception's (or warning's) type; text: the message without
    its prefixes, joined over the lines it was wrapped on (end: its last line); frames: the warning's file and
    line as a frame, else []; in_traceback: the line belongs to a parsed traceback.
    """
    lines = list(lines or [])
    covered = set()
    for record in parse_tracebacks(lines):
        covered.update(range(record["start"], record["end"] + 1))
    wrapped = {item["start"]: item for item in wrapped_messages(lines)}
    found = []
    for index, line in enumerate(lines):
        process, _, header, body = split_line(str(line))
        kind = _error_kind(header, body)
        if kind is None:
            continue
        text, end = body.strip(), index
        if index in wrapped:
            end, text = wrapped[index]["end"], wrapped[index]["body"]
        if kind[0] == "exception":
            whole = _EXCEPTION_LINE.match(text)
            text = text[whole.start("type"):] if whole else text[_INLINE_EXCEPTION.search(text).start("type"):]
        warning = _PY_WARNING.match(body.strip()) if kind[0] == "Python warning" else None
        frames = ([{"file": warning.group("file"), "line": int(warning.group("line")), "function": "warnings.warn"}]
                  if warning else [])
        found.append({"line": index, "end": end, "text": text, "process": process, "kind": kind[0],
                      "strong": kind[1], "type": kind[2], "frames": frames, "in_traceback": index in covered})
    return found


def last_failure(lines):
    """The tracebacks of the last failure in the lines, root (innermost) first; [] without one."""
    records = parse_tracebacks(lines)
    if not records:
        return []
    return [record for record in records if record["failure"] == records[-1]["failure"]]
