"""vLLM's start-up phases, read from its log: where each process and rank got to, and since when.

vLLM starts in a known order, and says so in its log: it reads its arguments,
starts the engine core, initializes torch.distributed (NCCL/Gloo) across every
rank, loads the weights, compiles the model (torch.compile), profiles memory,
sizes the KV cache, captures CUDA graphs, reports the engine ready and starts
the API server. ``PHASES`` lists them in that order, each with the lines that
show it (vLLM 0.32's own wording, with the older releases' where it differs:
V0's "Loading model weights took", "Memory profiling takes", "# GPU blocks",
uvicorn's "Application startup complete"), the lines that show it finished,
the checks an operator runs when a start hangs there, and how long it may take
(``PROFILES``: ``gpu`` for real GPU nodes, ``lab`` for the CPU lab with a tiny
model).

``read_phases(lines, times=None)`` reads a unit's journal (or any log) per
process and rank, with the prefix splitting of ``traceback.split_line`` (journal
timestamps, ``(EngineCore_DP0 pid=..)``, ``(VllmWorker rank=1 pid=..)``,
``(RayWorkerWrapper pid=.., ip=..)``, ``[rank0]:``, vLLM's ``INFO 12-02 10:00:00
[file.py:12]`` header). For each process: the last phase reached, whether it
finished it, the line that showed it and its time (from ``times``, the journal's
own timestamp of each line in seconds since the epoch, else a timestamp the line
carries); the phase it is in now (the next one once a phase finished); and, over
the log, the furthest and the least advanced process, and whether the start-up
completed. ``stall(report, now, profile)`` says whether the start-up has stayed
in its current phase longer than that phase's bound.

Pure Python 3.11, no Ansible import.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.traceback import split_line

# Each phase: id, title, the lines that show it (searched in a line's text, prefixes removed), the lines that
# show it finished, and the checks for a start that hangs there. In the order vLLM goes through them.
PHASES = (
    {
        "id": "starting",
        "title": "reading its arguments and the model's config",
        "enter": (
            r"non-default args: ", r"vLLM API server version ", r"Launching vLLM \(v[^)]*\) headless",
            r"Launching \d+ data parallel engine\(s\) in headless mode", r"Defaulting api_server_count",
            r"Inferred data_parallel_rank \d+ from node_rank", r"Automatically detected platform ",
            r"Resolved architecture: ",
        ),
        "done": (),
        "checks": (
            "the model's config is readable: a local path holding config.json, or the hub reachable "
            "(HF_HUB_OFFLINE=1 with a local copy when the node has no Internet)",
            "the runtime venv imports vLLM as the service user (`python -c 'import vllm'`); "
            "`py-spy dump --pid <pid>` shows where a hung import waits",
        ),
    },
    {
        "id": "engine_init",
        "title": "engine init",
        "enter": (
            r"Initializing an? (?:V1 |V0 )?LLM engine", r"Waiting for init message from front-end",
            r"DP group leader: ", r"Started DP Coordinator process", r"Waiting for \d+ local, \d+ remote core engine",
            r"Waiting for READY message from DP Coordinator", r"Waiting for creating a placement group",
            r"Connecting to existing Ray cluster", r"Started a local Ray instance",
        ),
        "done": (),
        "checks": (
            "the engine core and its workers are alive (`systemd-cgls -u vllm.service`)",
            "with Ray: `ray status` shows the GPUs the placement group asks for, on the nodes it needs",
            "headless nodes: their vLLM started and reaches the head's --data-parallel-rpc-port",
        ),
    },
    {
        "id": "distributed_init",
        "title": "distributed init",
        "enter": (
            r"world_size=\d+ rank=\d+ local_rank=\d+ distributed_init_method=", r"vLLM is using nccl==",
            r"Found nccl from library", r"\bNCCL (?:INFO|WARN)\b", r"\[Gloo\] Rank \d+ is connected to",
            r"store_based_barrier_key", r"\[c10d\] ", r"rank \d+ in world size \d+ is assigned as",
        ),
        "done": (r"rank \d+ in world size \d+ is assigned as",),
        "checks": (
            "GPU peer-to-peer: `nvidia-smi topo -m`, PCIe ACS off on the switches (`lspci -vvv | grep -i acsctl`); "
            "NCCL_P2P_DISABLE=1 once to test",
            "NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME name an interface that exists on every node and routes to "
            "the others (`ip -br addr`, `ip route get <peer>`)",
            "the rendezvous port (--master-port, the Ray GCS) reachable from every node",
            "set NCCL_DEBUG=INFO (and NCCL_DEBUG_SUBSYS=INIT,NET) in the unit's env file and restart: the last NCCL "
            "INFO line says where the ranks wait",
        ),
    },
    {
        "id": "weights",
        "title": "weights loading",
        "enter": (
            r"Starting to load model", r"Loading (?:safetensors|pt) checkpoint shards", r"Loading weights took",
            r"Model loading took", r"Loading model weights took", r"Initializing model took",
            r"Filesystem type for checkpoints", r"Using model weights format",
        ),
        "done": (r"Loading weights took", r"Model loading took", r"Loading model weights took"),
        "checks": (
            "the storage throughput of the model's path (`dd if=<one shard> of=/dev/null bs=16M`); a network "
            "filesystem or a download from the hub is the usual slow path",
            "the path is the local copy, complete (every shard, no Git LFS pointers), on every node",
            "host memory while loading (`free -g`): a node that swaps loads for hours",
        ),
    },
    {
        "id": "compile",
        "title": "torch.compile",
        "enter": (
            r"Starting torch\.compile", r"Dynamo bytecode transform time", r"Compiling a graph for",
            r"torch\.compile takes", r"Directly load the compiled graph", r"Cache the graph of",
            r"saved AOT compiled function", r"Directly load AOT compilation", r"for vLLM's torch\.compile",
            r"Initial profiling/warmup run took",
        ),
        "done": (r"torch\.compile takes .* in total", r"Initial profiling/warmup run took"),
        "checks": (
            "torch.compile's cache (VLLM_CACHE_ROOT, ~/.cache/vllm of the service user) is local and writable",
            "CPU cores free for the compiler (`top`)",
            "start once with --enforce-eager (or -O0): if it then comes up, compilation is what hangs",
        ),
    },
    {
        "id": "memory_profiling",
        "title": "memory profiling",
        "enter": (
            r"Memory profiling takes", r"Available KV cache memory", r"CUDA graph memory profiling is",
            r"(?:Explicitly|Auto) set \([\d.]+/[\d.]+\) GiB for KV cache",
        ),
        "done": (
            r"Memory profiling takes", r"Available KV cache memory",
            r"(?:Explicitly|Auto) set \([\d.]+/[\d.]+\) GiB for KV cache",
        ),
        "checks": (
            "GPU memory held by other processes (`nvidia-smi`)",
            "--gpu-memory-utilization against the memory that is free on every GPU",
        ),
    },
    {
        "id": "kv_cache",
        "title": "KV cache sizing and allocation",
        "enter": (
            r"\b[A-Z]+(?: \+ host)? KV cache size: [\d,]+ tokens", r"Maximum concurrency for [\d,]+ tokens per request",
            r"# (?:GPU|CPU|gpu|cpu) blocks: \d+",
        ),
        "done": (
            r"\b[A-Z]+(?: \+ host)? KV cache size: [\d,]+ tokens", r"Maximum concurrency for [\d,]+ tokens per request",
            r"# (?:GPU|CPU|gpu|cpu) blocks: \d+",
        ),
        "checks": (
            "GPU memory free for the KV cache's allocation (`nvidia-smi`)",
            "a lower --gpu-memory-utilization or --max-num-seqs",
        ),
    },
    {
        "id": "graph_capture",
        "title": "CUDA graph capture and warm-up",
        "enter": (
            r"Capturing CUDA graphs", r"Capturing cudagraphs", r"Capturing the model for CUDA graphs",
            r"CUDA graphs can take", r"Graph capturing finished", r"CUDA graph pool memory",
            r"Warming up model for the compilation", r"Warming up done",
        ),
        "done": (r"Graph capturing finished", r"Warming up done"),
        "checks": (
            "GPU memory during the capture (`nvidia-smi`): a lower --gpu-memory-utilization or --max-num-seqs "
            "captures fewer, smaller graphs",
            "start once with --enforce-eager: no capture; if it then comes up, the capture is what hangs",
            "the custom all-reduce over P2P: --disable-custom-all-reduce once to test",
        ),
    },
    {
        "id": "engine_ready",
        "title": "engine ready, API server starting",
        "enter": (r"init engine \(profile, create kv cache, warmup model\) took",),
        "done": (r"init engine \(profile, create kv cache, warmup model\) took",),
        "checks": (
            "the API server process (APIServer) is alive and its port is free (`ss -ltnp`)",
        ),
    },
    {
        "id": "api_up",
        "title": "API server up",
        "enter": (
            r"Starting vLLM (?:API )?server(?: \d+)? on ", r"Uvicorn running on ", r"Application startup complete",
            r"Started server process \[\d+\]", r"Available routes are",
        ),
        "done": (),
        "checks": (),
    },
)
PHASE_IDS = tuple(phase["id"] for phase in PHASES)
FINAL = "api_up"
_BY_ID = {phase["id"]: phase for phase in PHASES}
_MIN = 60
# How long a start may stay in each phase (seconds) before the doctor calls it stalled. gpu: real GPU nodes and
# large models (weights: a 400 GB checkpoint over a fast local disk); lab: the CPU lab's tiny model on two cores.
PROFILES = {
    "gpu": {
        "starting": 10 * _MIN, "engine_init": 10 * _MIN, "distributed_init": 10 * _MIN, "weights": 30 * _MIN,
        "compile": 20 * _MIN, "memory_profiling": 10 * _MIN, "kv_cache": 10 * _MIN, "graph_capture": 15 * _MIN,
        "engine_ready": 5 * _MIN,
    },
    "lab": {
        "starting": 5 * _MIN, "engine_init": 5 * _MIN, "distributed_init": 3 * _MIN, "weights": 5 * _MIN,
        "compile": 10 * _MIN, "memory_profiling": 5 * _MIN, "kv_cache": 5 * _MIN, "graph_capture": 5 * _MIN,
        "engine_ready": 3 * _MIN,
    },
}
DEFAULT_PROFILE = "gpu"
MAX_LINE = 300

_ENTER = [(index, re.compile("|".join(f"(?:{p})" for p in phase["enter"]))) for index, phase in enumerate(PHASES)]
_DONE = [re.compile("|".join(f"(?:{p})" for p in phase["done"])) if phase["done"] else None for phase in PHASES]
_HEADLESS = re.compile(r"headless (?:multiproc executor|mode)")
# vLLM started eager (--enforce-eager): it neither compiles nor captures graphs, so those phases are skipped.
_EAGER = re.compile(r"Enforce eager set|'enforce_eager': True|enforce_eager=True")
EAGER_SKIPS = ("compile", "graph_capture")
_WORLD_RANK = re.compile(r"world_size=\d+ rank=(?P<rank>\d+) local_rank=\d+ distributed_init_method=")
_ASSIGNED_RANK = re.compile(r"\brank (?P<rank>\d+) in world size \d+ is assigned as")
_PREFIX_RANK = re.compile(r"(?:\(\S+ rank=(?P<prefixed>\d+) pid=|\[rank(?P<torch>\d+)\]:)")
_WORKER_NAME = re.compile(r"\((?:\w*Worker\w*|RayWorkerWrapper)[\s)]")
_IP = re.compile(r"ip=(?P<ip>[0-9A-Fa-f.:]+)\)")

# Timestamps a line may carry, first match wins: a journal or collector prefix, then a log header.
_LINE_TIMES = (
    # journalctl -o short-iso[-precise]: "YYYY-MM-DDT03:04:05+0000 node1 vllm[1]: ", "[YYYY-MM-DDT23:59:42Z] "
    re.compile(r"^\[?(?P<iso>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?P<zone>Z|[+-]\d\d:?\d\d)?)\]?\s"),
    # journalctl -o short: "Nov 30 03:04:05 node1 vllm[1]: "
    re.compile(r"^(?P<shown>[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d)\s"),
    # a collector's or Ray's "YYYY-MM-DD 12:25:53"
    re.compile(r"^(?P<shown>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)"),
)
# vLLM's header "INFO 11-29 20:49:46 [file.py:1]", torch's "I1202 10:00:00.123 ...": month-day and time, no year.
_HEADER_TIMES = (
    re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<shown>\d\d-\d\d \d\d:\d\d:\d\d)"),
    re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"),
    re.compile(r"^[IWEF](?P<month>\d\d)(?P<day>\d\d) (?P<clock>\d\d:\d\d:\d\d)"),
)


def phase(phase_id):
    """The phase's entry of ``PHASES`` (id, title, enter, done, checks)."""
    return _BY_ID[phase_id]


def bounds(profile=DEFAULT_PROFILE, overrides=None):
    """{phase id: seconds} of a profile, with overrides (phase id -> seconds) on top; unknown profiles refused."""
    if profile not in PROFILES:
        raise ValueError(f"unknown start-up profile {profile!r}; known: {sorted(PROFILES)}")
    result = dict(PROFILES[profile])
    for key, value in (overrides or {}).items():
        if key not in result:
            raise ValueError(f"unknown start-up phase {key!r} in the bounds; phases: {list(result)}")
        result[key] = int(value)
    return result


def match_phase(text):
    """(phase index, finished) the text shows, the furthest phase when it matches several; None when none."""
    for index, pattern in reversed(_ENTER):
        if pattern.search(text):
            done = _DONE[index]
            return index, bool(done and done.search(text))
    return None


def iso_utc(epoch):
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(iso):
    text = iso.replace(",", ".")
    text = re.sub(r"Z$", "+00:00", text)
    text = re.sub(r"([+-]\d\d)(\d\d)$", r"\1:\2", text)
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def line_time(raw, header=None, epoch=None):
    """(the time as shown, seconds since the epoch or None) of one line.

    ``epoch`` (the journal's own timestamp) wins; else a journal or collector prefix, then the log header.
    Only a timestamp with a time zone gives an epoch: vLLM's header has neither year nor zone.
    """
    if epoch is not None:
        return iso_utc(epoch), float(epoch)
    text = str(raw).lstrip()
    for pattern in _LINE_TIMES:
        match = pattern.match(text)
        if match:
            if "iso" in match.groupdict():
                iso = match.group("iso")
                return iso, _epoch(iso) if match.group("zone") else None
            return match.group("shown"), None
    for pattern in _HEADER_TIMES:
        match = pattern.match(header or "")
        if match:
            groups = match.groupdict()
            if "clock" in groups:
                return f"{groups['month']}-{groups['day']} {groups['clock']}", None
            return groups.get("shown") or match.group(0), None
    return None, None


def _clip(text):
    return text if len(text) <= MAX_LINE else text[: MAX_LINE - 3] + "..."


def _current(index, finished, skipped=()):
    """The phase a process is in now: the one it reached, or the next (not skipped) once it finished that one."""
    if not finished:
        return index
    following = index + 1
    while following < len(PHASES) - 1 and PHASES[following]["id"] in skipped:
        following += 1
    return following if following < len(PHASES) else index


def _entry(state, skipped=()):
    index = state["index"]
    current = _current(index, state["finished"], skipped)
    return {
        "process": state["process"],
        "key": state["key"],
        "rank": state["rank"],
        "is_rank": state["rank"] is not None or state["worker"],
        "ip": state["ip"],
        "phase": PHASES[index]["id"],
        "title": PHASES[index]["title"],
        "finished": state["finished"],
        "current": PHASES[current]["id"],
        "line": state["line"],
        "line_index": state["line_index"],
        "time": state["time"],
        "epoch": state["epoch"],
        "order": [index, 1 if state["finished"] else 0],
    }


def read_phases(lines, times=None):
    """The start-up phases a log shows, per process, and over the log.

    lines: the log's lines; times: each line's journal timestamp (seconds since the epoch) or None.
    Returns {processes, furthest, least, current, complete, headless, eager}:
    processes, one per process that printed a phase line, in the order they first did:
    {process (its prefixes as printed, "" without), key, rank (torch's rank when the process printed it, else
    None), is_rank (a rank or a worker process), ip, phase (the last phase reached), title, finished (its end
    was logged), current (the phase it is in now: the next one once it finished; an eager start, eager, has no
    torch.compile and no graph capture), line (the line that showed
    it: the first line of the phase, or the line that finished it), line_index, time (as shown), epoch (seconds,
    when known)}. furthest and least: the most and the least advanced process, over the ranks when any
    printed its rank (the API server and the engine core wait for them), else over every process; current: where
    the start-up is now, the least advanced rank, or, before any rank, the furthest process. complete: the API
    server came up (a headless node: its engine reported ready, or every rank got past memory profiling).
    """
    times = list(times or [])
    states = {}
    headless = eager = False
    for index, raw in enumerate(lines or []):
        process, key, header, body = split_line(str(raw))
        text = body.strip()
        if not text:
            continue
        if _HEADLESS.search(text):
            headless = True
        if _EAGER.search(text):
            eager = True
        found = match_phase(text)
        state = states.get(key)
        rank = _rank(process, text)
        if state is not None:
            if rank is not None and state["rank"] is None:
                state["rank"] = rank
            if process:
                state["process"] = process  # vLLM renames a worker under its pid: Worker -> Worker_TP0
        if found is None:
            continue
        phase_index, finished = found
        epoch = times[index] if index < len(times) else None
        shown, seconds = line_time(raw, header, epoch)
        if state is None:
            ip = _IP.search(process or "")
            state = states[key] = {
                "process": process, "key": key, "rank": rank, "worker": bool(_WORKER_NAME.search(process or "")),
                "ip": ip.group("ip") if ip else None, "index": -1, "finished": False,
            }
        if (phase_index, finished) <= (state["index"], state["finished"]):
            continue
        state.update(index=phase_index, finished=finished, line=_clip(str(raw).strip()), line_index=index,
                     time=shown, epoch=seconds)
    processes = [_entry(state, EAGER_SKIPS if eager else ()) for state in states.values()]
    report = summarize(processes, headless)
    report["eager"] = eager
    return report


def _rank(process, text):
    for pattern, group in ((_WORLD_RANK, "rank"), (_ASSIGNED_RANK, "rank")):
        match = pattern.search(text)
        if match:
            return int(match.group(group))
    match = _PREFIX_RANK.search(process or "")
    if match:
        return int(match.group("prefixed") or match.group("torch"))
    return None


def summarize(processes, headless=False):
    """furthest, least, current and complete over process entries (of one log, or of every node's)."""
    processes = list(processes)
    ranks = [entry for entry in processes if entry["is_rank"]] or processes
    furthest = max(processes, key=lambda entry: entry["order"], default=None)
    least = min(ranks, key=lambda entry: entry["order"], default=None)
    has_ranks = any(entry["is_rank"] for entry in processes)
    current = least if has_ranks else furthest
    reached = {entry["phase"] for entry in processes}
    complete = FINAL in reached
    if headless and not complete and processes:
        engine_ready = "engine_ready" in reached
        past_profiling = has_ranks and all(
            entry["order"] >= [PHASE_IDS.index("memory_profiling"), 1] for entry in processes if entry["is_rank"])
        complete = engine_ready or past_profiling
    return {"processes": processes, "furthest": furthest, "least": least, "current": current,
            "complete": complete, "headless": headless}


def describe(entry):
    """One process's place in the start-up, in words: "rank 1 (Worker_TP1 pid=9): in weights loading since T"."""
    who = f"rank {entry['rank']} " if entry["rank"] is not None else ""
    who += entry["process"] or "(no process prefix)"
    reached = phase(entry["phase"])["title"]
    since = f" since {entry['time']}" if entry.get("time") else ""
    if entry["finished"] and entry["current"] != entry["phase"]:
        at = f" at {entry['time']}" if entry.get("time") else ""
        return f"{who}: finished {reached}{at}, now in {phase(entry['current'])['title']}"
    return f"{who}: in {reached}{since}"


def stall(report, now=None, profile=DEFAULT_PROFILE, overrides=None):
    """Whether the start-up stays in its current phase too long: None when it does not (or cannot be judged).

    Judged on ``report["current"]`` (``read_phases`` or ``summarize``): a start-up that completed is not stalled;
    with ``now`` (seconds since the epoch, the moment the log was read) and the line's epoch, stalled when the
    phase has lasted longer than its bound; without ``now``, the log is taken as ended: a start-up it shows
    unfinished is stalled ("the log stops in phase X"). Returns {phase, title, checks, entry, elapsed_s, bound_s}.
    """
    entry = report.get("current")
    if entry is None or report.get("complete"):
        return None
    current = entry["current"]
    if current == FINAL:
        return None
    limit = bounds(profile, overrides)[current]
    elapsed = None
    if now is not None:
        if entry.get("epoch") is None:
            return None
        elapsed = now - entry["epoch"]
        if elapsed <= limit:
            return None
    return {"phase": current, "title": phase(current)["title"], "checks": list(phase(current)["checks"]),
            "entry": entry, "elapsed_s": None if elapsed is None else int(elapsed), "bound_s": limit}
