"""Read vLLM's start-up log (a unit's journal) and return the topology it reports.

vLLM prints what it actually built, once it has built it (research/vllm-internals.md §2):

- every worker: ``world_size=W rank=R local_rank=L distributed_init_method=M backend=B``;
- the local-rank-0 worker of each node and replica: ``rank R in world size W is
  assigned as DP rank d, PP rank p, PCP rank c, TP rank t, ETP rank e, EP rank x, EPLB rank y``
  (older releases: ``DP rank d, PP rank p, TP rank t, EP rank x``, from every rank);
- every engine core: ``CPU|GPU KV cache size: N tokens, Maximum concurrency for L tokens
  per request: Xx`` (releases up to about 0.9 print the two halves on two lines);
- process prefixes ``(Worker_TP1 pid=N)``, ``(EngineCore_DP1 pid=N)``, older
  ``(VllmWorker rank=1 pid=N)``, and Ray's ``(RayWorkerWrapper pid=N, ip=A)``;
- ``DP group leader: ...``, the two headless launch lines, ``[EP Rank r/N] Expert
  parallelism is enabled ...``, ``Starting vLLM server on URL``, and start-up errors.

``parse_log(text)`` takes the journal text (``journalctl -o cat`` or any format
that keeps the message intact: a syslog-style prefix before it is ignored) and
returns a plain dict. ``ray_placement(actors_json, nodes_json)`` joins ``ray list
actors --detail --format json`` with ``ray list nodes --format json``.

Pure Python (3.11+); imports nothing from Ansible.
"""

from __future__ import annotations

import ast
import json
import re

# Terminal colours: vLLM colours its log on a TTY or with VLLM_LOGGING_COLOR/FORCE_COLOR.
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# "(Worker_TP1 pid=2901)", "(VllmWorker rank=1 pid=2950721)", "(RayWorkerWrapper pid=1195524, ip=10.0.0.2)".
_PREFIX = re.compile(
    r"\((?P<name>[A-Za-z_][\w.-]*)(?: rank=(?P<prefix_rank>\d+))? pid=(?P<pid>\d+)(?:, ip=(?P<ip>[0-9A-Fa-f.:]+))?\)"
)

_WORKER = re.compile(
    r"world_size=(?P<world_size>\d+) rank=(?P<rank>\d+) local_rank=(?P<local_rank>\d+) "
    r"distributed_init_method=(?P<init_method>\S+) backend=(?P<backend>\w+)"
)
_ASSIGNED = re.compile(r"\brank (?P<rank>\d+) in world size (?P<world_size>\d+) is assigned as (?P<axes>.+?)\s*$")
_AXIS = re.compile(r"(?P<axis>DP|PP|PCP|TP|ETP|EP|EPLB) rank (?P<value>[^,\s]+)")
_KV_ONE_LINE = re.compile(
    r"(?P<device>[A-Z]+(?: \+ host)?) KV cache size: (?P<tokens>[\d,]+) tokens, "
    r"Maximum concurrency for (?P<length>[\d,]+) tokens per request: (?P<concurrency>[\d.]+)x"
)
_KV_TOKENS_ONLY = re.compile(r"(?P<device>[A-Z]+(?: \+ host)?) KV cache size: (?P<tokens>[\d,]+) tokens\s*$")
_KV_CONCURRENCY_ONLY = re.compile(
    r"^Maximum concurrency for (?P<length>[\d,]+) tokens per request: (?P<concurrency>[\d.]+)x"
)
_DP_LEADER = re.compile(
    r"DP group leader: node_rank=(?P<node_rank>\d+), node_rank_within_dp=(?P<node_rank_within_dp>\d+), "
    r"master_addr=(?P<master_addr>[^,\s]+), mq_connect_ip=(?P<mq_connect_ip>[^,\s]+) \(local\), "
    r"world_size=(?P<world_size>\d+), local_world_size=(?P<local_world_size>\d+)"
)
_HEADLESS_EXECUTOR = re.compile(
    r"Launching vLLM \(v(?P<version>[^)]+)\) headless multiproc executor, with head node address "
    r"(?P<head_address>\S+) for torch\.distributed process group"
)
_HEADLESS_ENGINES = re.compile(
    r"Launching (?P<engines>\d+) data parallel engine\(s\) in headless mode, with head node address "
    r"(?P<head_address>\S+?)\.?\s*$"
)
_INFERRED_DP = re.compile(r"Inferred data_parallel_rank (?P<dp_rank>\d+) from node_rank (?P<node_rank>\d+)")
_EXPERT_PARALLEL = re.compile(
    r"\[EP Rank (?P<ep_rank>\d+)/(?P<ep_size>\d+)\] Expert parallelism is enabled\. "
    r"Expert placement strategy: (?P<strategy>\w+)\. Local/global number of experts: "
    r"(?P<local_experts>\d+)/(?P<global_experts>\d+)"
)
_KV_MEMORY_CPU = re.compile(
    r"(?P<mode>Explicitly|Auto) set \((?P<gib>[\d.]+)/(?P<total_gib>[\d.]+)\) GiB for KV cache on node (?P<numa>\d+)"
)
_KV_MEMORY_GPU = re.compile(r"Available KV cache memory: (?P<gib>[\d.]+) GiB")
# "Model loading took 0.25 GiB memory and 1.2 seconds" (0.33), "... took 15.4136 GiB and 3.1 seconds",
# "Loading model weights took 57.7520 GB" (0.5/0.6).
_WEIGHTS = re.compile(
    r"(?:Model loading|Loading model weights) took (?P<gib>[\d.]+) ?(?:GiB|GB)(?: memory)?"
    r"(?: and (?P<seconds>[\d.]+) seconds)?"
)
_ENGINE_READY = re.compile(r"init engine \(profile, create kv cache, warmup model\) took (?P<seconds>[\d.]+) s")
_SERVER = re.compile(r"Starting vLLM (?:API )?server(?: \d+)? on (?P<url>\S+)")
_VERSION = (
    re.compile(r"vLLM API server version (?P<version>\S+)"),
    re.compile(r"Initializing a V1 LLM engine \(v(?P<version>[^)]+)\)"),
    _HEADLESS_EXECUTOR,
)
_NON_DEFAULT_ARGS = re.compile(r"non-default args: (?P<args>\{.*\})\s*$")
_ENGINE_CONFIG = re.compile(r"Initializing a V1 LLM engine \(v[^)]+\) with config: (?P<config>.*)$")
_CONFIG_SIZES = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")

# vLLM's header: "INFO 11-29 20:50:01 [parallel_state.py:1906] " (0.4-era: no "[" before the file).
_HEADER = re.compile(
    r"^\s*(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)? \[?[\w./-]+:\d+\] "
)
# A syslog-style journal prefix ("Nov 30 03:04:05 node1 vllm[123]: ") when the journal was not read with -o cat.
_JOURNAL_PREFIX = re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [^\s:]+(?:\[\d+\])?: ")
# Start-up failures worth showing an operator, besides ERROR lines, in the words Python uses.
_ERROR_PATTERNS = (
    re.compile(r"^(?:\w+\.)*\w*(?:Error|Exception)(?::|$)"),  # "AssertionError", "RuntimeError: ..."
    re.compile(r"^Traceback \(most recent call last\)"),
)
MAX_ERRORS = 20


def _int(text):
    return int(text.replace(",", ""))


def _rank_value(text):
    """'3' -> 3, 'N/A' -> None."""
    return int(text) if text.isdigit() else None


def parse_assigned_axes(axes):
    """'DP rank 0, PP rank 1, ... EP rank N/A' -> {'dp': 0, 'pp': 1, ..., 'ep': None}."""
    return {match.group("axis").lower(): _rank_value(match.group("value")) for match in _AXIS.finditer(axes)}


def parse_assigned_line(line):
    """One ``rank R in world size W is assigned as ...`` line -> dict, or None when it is not one."""
    match = _ASSIGNED.search(line)
    if not match:
        return None
    result = {"rank": int(match.group("rank")), "world_size": int(match.group("world_size"))}
    result.update(parse_assigned_axes(match.group("axes")))
    return result


def _strip(line):
    return _ANSI.sub("", line).rstrip("\r\n")


def _process(line):
    """The vLLM process that printed the line: innermost prefix name, pid, prefix rank; Ray's ip if any."""
    prefixes = list(_PREFIX.finditer(line))
    if not prefixes:
        return None, None, None, None
    ip = next((p.group("ip") for p in prefixes if p.group("ip")), None)
    last = prefixes[-1]
    rank = int(last.group("prefix_rank")) if last.group("prefix_rank") else None
    return last.group("name"), int(last.group("pid")), ip, rank


def _literal_dict(text):
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _sizes_from_args(text):
    """Parallel sizes from a ``non-default args: {...}`` dict (absent keys are vLLM's default, 1)."""
    args = _literal_dict(text)
    sizes = {}
    for key in _CONFIG_SIZES:
        if args is not None:
            value = args.get(key)
        else:  # a dict that is not a Python literal (cut short, objects inside): read the numbers only
            found = re.search(rf"'{key}': (\d+)", text)
            value = int(found.group(1)) if found else None
        sizes[key] = int(value) if isinstance(value, int) else 1
    return sizes


def _sizes_from_engine_config(text):
    sizes = {}
    for key in _CONFIG_SIZES:
        found = re.search(rf"\b{key}=(\d+)", text)
        if found:
            sizes[key] = int(found.group(1))
    return sizes


def empty_topology():
    return {
        "lines": 0,
        "version": None,
        "configured": {},
        "workers": [],
        "assignments": [],
        "worker_processes": [],
        "engines": [],
        "dp_leaders": [],
        "headless": [],
        "inferred_dp_ranks": [],
        "expert_parallel": [],
        "kv_memory": [],
        "weights": [],
        "server_url": None,
        "errors": [],
    }


def parse_log(text):
    """Parse a vLLM journal; see the module docstring for what is read. Never raises on odd lines."""
    topology = empty_topology()
    names_by_pid = {}  # pid -> [names in order of appearance]
    ip_by_pid = {}
    prefix_rank_by_pid = {}  # "(VllmWorker rank=1 pid=N)" of the 0.9-era V1 engine
    pending_kv = {}  # pid -> engine dict waiting for its "Maximum concurrency" line (two-line format)
    engines_by_process = {}
    for raw in (text or "").splitlines():
        line = _strip(raw)
        if not line.strip():
            continue
        topology["lines"] += 1
        name, pid, ip, prefix_rank = _process(line)
        prefix_end = max((m.end() for m in _PREFIX.finditer(line)), default=0)
        message = _JOURNAL_PREFIX.sub("", line[prefix_end:]) if prefix_end else _JOURNAL_PREFIX.sub("", line)
        header = _HEADER.match(message)
        level = header.group("level") if header else None
        body = message[header.end():] if header else message.strip()
        if pid is not None:
            names = names_by_pid.setdefault(pid, [])
            if not names or names[-1] != name:
                names.append(name)
            if ip:
                ip_by_pid[pid] = ip
            if prefix_rank is not None:
                prefix_rank_by_pid[pid] = prefix_rank
        where = {"process": name, "pid": pid}
        if ip:
            where["ip"] = ip

        match = _WORKER.search(message)
        if match:
            topology["workers"].append(
                {
                    **where,
                    "world_size": int(match.group("world_size")),
                    "rank": int(match.group("rank")),
                    "local_rank": int(match.group("local_rank")),
                    "init_method": match.group("init_method"),
                    "backend": match.group("backend"),
                }
            )
            continue
        assigned = parse_assigned_line(message)
        if assigned is not None:
            topology["assignments"].append({**where, **assigned})
            continue
        match = _KV_ONE_LINE.search(message)
        if match:
            engine = {
                **where,
                "device": match.group("device"),
                "kv_cache_tokens": _int(match.group("tokens")),
                "max_model_len": _int(match.group("length")),
                "max_concurrency": float(match.group("concurrency")),
            }
            key = (name, pid)
            if key not in engines_by_process:  # info_once, but a restart inside one journal repeats it
                engines_by_process[key] = engine
                topology["engines"].append(engine)
            continue
        match = _KV_TOKENS_ONLY.search(message)
        if match:
            engine = {
                **where,
                "device": match.group("device"),
                "kv_cache_tokens": _int(match.group("tokens")),
                "max_model_len": None,
                "max_concurrency": None,
            }
            key = (name, pid)
            if key not in engines_by_process:
                engines_by_process[key] = engine
                topology["engines"].append(engine)
                pending_kv[pid] = engine
            continue
        match = _KV_CONCURRENCY_ONLY.search(body)
        if match and pid in pending_kv:
            engine = pending_kv.pop(pid)
            engine["max_model_len"] = _int(match.group("length"))
            engine["max_concurrency"] = float(match.group("concurrency"))
            continue
        match = _DP_LEADER.search(message)
        if match:
            leader = {**where, **match.groupdict()}
            for key in ("node_rank", "node_rank_within_dp", "world_size", "local_world_size"):
                leader[key] = int(leader[key])
            topology["dp_leaders"].append(leader)
            continue
        match = _HEADLESS_EXECUTOR.search(message)
        if match:
            topology["headless"].append(
                {
                    **where,
                    "kind": "multiproc_executor",
                    "version": match.group("version"),
                    "head_address": match.group("head_address"),
                    "dp_engines": 0,
                }
            )
            topology["version"] = topology["version"] or match.group("version")
            continue
        match = _HEADLESS_ENGINES.search(message)
        if match:
            topology["headless"].append(
                {
                    **where,
                    "kind": "dp_engines",
                    "version": None,
                    "head_address": match.group("head_address"),
                    "dp_engines": int(match.group("engines")),
                }
            )
            continue
        match = _INFERRED_DP.search(message)
        if match:
            topology["inferred_dp_ranks"].append(
                {**where, "dp_rank": int(match.group("dp_rank")), "node_rank": int(match.group("node_rank"))}
            )
            continue
        match = _EXPERT_PARALLEL.search(message)
        if match:
            topology["expert_parallel"].append(
                {
                    **where,
                    "ep_rank": int(match.group("ep_rank")),
                    "ep_size": int(match.group("ep_size")),
                    "strategy": match.group("strategy"),
                    "local_experts": int(match.group("local_experts")),
                    "global_experts": int(match.group("global_experts")),
                }
            )
            continue
        match = _KV_MEMORY_CPU.search(message)
        if match:
            topology["kv_memory"].append(
                {
                    **where,
                    "gib": float(match.group("gib")),
                    "total_gib": float(match.group("total_gib")),
                    "numa_node": int(match.group("numa")),
                    "mode": match.group("mode").lower(),
                }
            )
            continue
        match = _KV_MEMORY_GPU.search(message)
        if match:
            topology["kv_memory"].append(
                {**where, "gib": float(match.group("gib")), "total_gib": None, "numa_node": None, "mode": "gpu"}
            )
            continue
        match = _WEIGHTS.search(message)
        if match:
            topology["weights"].append(
                {
                    **where,
                    "gib": float(match.group("gib")),
                    "seconds": float(match.group("seconds")) if match.group("seconds") else None,
                }
            )
            continue
        match = _ENGINE_READY.search(message)
        if match:
            for engine in topology["engines"]:
                if engine["pid"] == pid:
                    engine["init_seconds"] = float(match.group("seconds"))
            continue
        match = _SERVER.search(message)
        if match:
            topology["server_url"] = topology["server_url"] or match.group("url")
            continue
        match = _NON_DEFAULT_ARGS.search(message)
        if match:
            topology["configured"] = {**_sizes_from_args(match.group("args")), "source": "non-default args"}
            continue
        match = _ENGINE_CONFIG.search(message)
        if match:
            if not topology["configured"]:
                topology["configured"] = {**_sizes_from_engine_config(match.group("config")), "source": "engine config"}
        for pattern in _VERSION:
            found = pattern.search(message)
            if found and topology["version"] is None:
                topology["version"] = found.group("version")
        if level in ("ERROR", "CRITICAL") or any(pattern.search(body) for pattern in _ERROR_PATTERNS):
            entry = {**where, "line": body.strip()[:300]}
            if len(topology["errors"]) < MAX_ERRORS and entry not in topology["errors"]:
                topology["errors"].append(entry)

    for pid, names in sorted(names_by_pid.items()):
        if not any(n.startswith(("Worker", "VllmWorker", "RayWorker")) for n in names):
            continue
        # A worker is "VllmWorker-N" while it starts, "Worker" until its groups exist, then "Worker_TP1"
        # (only axes larger than 1): the last Worker name is its final one. Older releases: "VllmWorker".
        final = [n for n in names if n == "Worker" or n.startswith("Worker_")]
        entry = {"pid": pid, "name": final[-1] if final else names[-1]}
        if pid in ip_by_pid:
            entry["ip"] = ip_by_pid[pid]
        if pid in prefix_rank_by_pid:
            entry["rank"] = prefix_rank_by_pid[pid]
        topology["worker_processes"].append(entry)
    return topology


def worker_process_names(topology):
    """Names of the worker processes that printed a per-worker rank line, one per worker."""
    by_pid = {entry["pid"]: entry["name"] for entry in topology["worker_processes"]}
    return sorted(by_pid.get(worker["pid"], worker["process"] or "?") for worker in topology["workers"])


# --------------------------------------------------------------------------- Ray state API

# vLLM 0.32 (ray_utils.build_actor_name) adds _TP<r> only when TP > 1, _PP<r> only when PP > 1 and _PCP<r>
# only when PCP > 1: "vllm_Worker_<instance>_TP1" at TP=2 PP=1, "vllm_Worker_<instance>_PP1" at TP=1 PP=2.
_RAY_ACTOR_NAME = re.compile(
    r"^vllm_Worker_(?P<instance>.+?)(?:_dp(?P<dp>\d+))?(?:_TP(?P<tp>\d+))?(?:_PP(?P<pp>\d+))?(?:_PCP(?P<pcp>\d+))?$"
)


def _current_jobs(actors):
    """The Ray jobs of the running vLLM: those of its live workers, else the newest job (ids are little-endian)."""
    alive = {actor.get("job_id") for actor in actors if actor.get("state") == "ALIVE"}
    if alive or not actors:
        return alive
    ids = [actor.get("job_id") for actor in actors if actor.get("job_id")]
    if not ids:
        return {None}
    return {max(ids, key=_job_order)}


def _job_order(job_id):
    try:
        return int.from_bytes(bytes.fromhex(job_id), "little")
    except ValueError:
        return -1


class RayStateError(ValueError):
    """The text is not the JSON that ``ray list ... --format json`` prints."""


def _json_list(text, what):
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError as exc:
        raise RayStateError(f"{what} is not JSON: {exc}") from None
    if not isinstance(value, list):
        raise RayStateError(f"{what} is not a JSON list (got {type(value).__name__})")
    return value


def ray_placement(actors_json, nodes_json, class_name="RayWorkerProc"):
    """Join vLLM's Ray worker actors with Ray's nodes: where does each TP/PP rank run?

    ``actors_json``: ``ray list actors --detail --format json --filter class_name=RayWorkerProc``;
    ``nodes_json``: ``ray list nodes --format json``. Returns ``{workers, by_node_ip, nodes,
    dead}``; each worker has its name, tp, pp, dp (None when absent), pid, node_id and node_ip.
    """
    actors = _json_list(actors_json, "ray list actors output")
    nodes = _json_list(nodes_json, "ray list nodes output")
    ip_by_node = {}
    node_rows = []
    for node in nodes:
        node_id = node.get("node_id")
        ip_by_node[node_id] = node.get("node_ip")
        node_rows.append(
            {
                "node_id": node_id,
                "node_ip": node.get("node_ip"),
                "is_head_node": bool(node.get("is_head_node")),
                "state": node.get("state"),
                "gpus": (node.get("resources_total") or {}).get("GPU"),
            }
        )
    workers, dead = [], []
    ours = [actor for actor in actors if actor.get("class_name") == class_name]
    current = _current_jobs(ours)
    for actor in ours:
        if actor.get("state") != "ALIVE" and actor.get("job_id") not in current:
            continue  # an earlier vLLM's worker: Ray's state API keeps dead actors after a restart
        match = _RAY_ACTOR_NAME.match(actor.get("name") or "")
        row = {
            "name": actor.get("name"),
            "state": actor.get("state"),
            "pid": actor.get("pid"),
            "node_id": actor.get("node_id"),
            "node_ip": ip_by_node.get(actor.get("node_id")),
            "tp": int(match.group("tp") or 0) if match else None,
            "pp": int(match.group("pp") or 0) if match else None,
            "dp": int(match.group("dp")) if match and match.group("dp") else None,
        }
        (workers if actor.get("state") == "ALIVE" else dead).append(row)
    by_ip = {}
    for row in workers:
        by_ip.setdefault(row["node_ip"], []).append(row)
    return {"workers": workers, "by_node_ip": by_ip, "nodes": node_rows, "dead": dead}
