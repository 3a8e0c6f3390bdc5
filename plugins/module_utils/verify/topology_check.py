"""Compare what vLLM reports (parsed journals, per node) with what the plan expects.

``check(plan, observed, gpus=None)`` takes the plan (docs/architecture.md, its
``expect`` block above all), ``observed`` = ``{host: vllm_topology fact}`` (what
``vllm_logs.parse_log`` read from each node's journal, plus the unit's state and,
on a Ray head, ``vllm_logs.ray_placement``), and optionally ``gpus`` = ``{host:
[gpu rows from gpu_facts]}`` for the memory balance on CUDA. It returns::

    {"ok": bool, "rows": [...], "mismatches": [...], "table": "...", "topology": {...}}

Every row is ``{node, check, expected, found, ok}``; ``table`` prints them as
aligned columns, so a failure shows expected and found values per node, and a
success prints the verified topology. ``topology`` is the verified layout in
short form (ranks, processes and KV per node).

Where a value comes from (research/vllm-internals.md §2): ranks and world size
from every worker's ``world_size=… rank=… local_rank=…`` line in the node's own
journal (for Ray, the head's journal, attributed by the ``ip=`` of Ray's log
prefix, and the Ray state API when given); TP/PP/DP/EP from the ``is assigned
as`` lines; KV tokens from the engine's ``KV cache size`` line, exact on CPU and
within ``expect.kv_tolerance`` on GPU.

Pure Python (3.11+); imports nothing from Ansible.
"""

from __future__ import annotations

from collections import Counter

from ansible_collections.vllm_ops.cluster.plugins.module_utils import launch
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify import gpu_balance
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify.vllm_logs import parse_assigned_line

ALL_NODES = "all"
MAX_CELL = 72
# systemd states in which the unit's main process runs ("activating (auto-restart)" waits between runs).
LIVE_STATES = ("active", "activating", "reloading", "deactivating")


class TopologyCheckError(ValueError):
    """The plan lacks what verification needs (an old or hand-made plan)."""


# --------------------------------------------------------------------------- formatting


def _ranks_text(values):
    """[0, 1, 2, 3, 5] -> '0-3,5'; repeated values are listed as often as they occur."""
    values = sorted(values)
    if not values:
        return "none"
    if len(set(values)) != len(values):
        return ",".join(str(v) for v in values)
    parts, start = [], 0
    for index in range(1, len(values) + 1):
        if index == len(values) or values[index] != values[index - 1] + 1:
            first, last = values[start], values[index - 1]
            parts.append(str(first) if first == last else f"{first}-{last}" if last > first + 1 else f"{first},{last}")
            start = index
    return ",".join(parts)


def _axes_text(assigned):
    text = f"DP{assigned['dp']} PP{assigned['pp']} TP{assigned['tp']}"
    if assigned.get("ep") is not None:
        text += f" EP{assigned['ep']}"
    return text


def _kv_text(engine):
    text = f"{engine['kv_cache_tokens']:,}"
    if engine.get("max_concurrency") is not None and engine.get("max_model_len"):
        text += f" ({engine['max_concurrency']:.2f}x at {engine['max_model_len']:,})"
    return text


def _cell(value):
    text = str(value)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 3] + "..."


def render_table(rows):
    """Aligned plain-text table: NODE CHECK EXPECTED FOUND RESULT."""
    header = ("NODE", "CHECK", "EXPECTED", "FOUND", "RESULT")
    body = [
        (row["node"], row["check"], _cell(row["expected"]), _cell(row["found"]), "ok" if row["ok"] else "MISMATCH")
        for row in rows
    ]
    widths = [max(len(line[col]) for line in [header, *body]) for col in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[col]) for col, cell in enumerate(line)).rstrip() for line in [header, *body]]
    return "\n".join(lines)


# --------------------------------------------------------------------------- the comparison


class _Rows:
    def __init__(self):
        self.rows = []

    def add(self, node, check, expected, found, ok):
        self.rows.append({"node": node, "check": check, "expected": expected, "found": found, "ok": bool(ok)})


def _require(plan):
    for key in ("nodes", "expect", "tp", "pp", "dp", "world_size", "backend"):
        if key not in plan:
            raise TopologyCheckError(f"the plan has no '{key}': re-run playbooks/plan.yml (plan_version 1)")
    for key in ("worker_log_world_size", "rank_assignments", "assigned_lines", "engines", "kv_tolerance"):
        if key not in plan["expect"]:
            raise TopologyCheckError(f"the plan's expect block has no '{key}': re-run playbooks/plan.yml")


def _attribute(plan, observed):
    """Worker lines, rank assignments and worker names per node, each from the journal that holds it.

    mp: each node's own journal. Ray: the head's journal holds every worker's lines; Ray's
    log prefix carries the worker's ip, which names the node.
    """
    host_by_address = {node["address"]: node["host"] for node in plan["nodes"]}
    workers, assignments, names = {}, {}, {}
    for host, fact in observed.items():
        if not fact or not _runs(fact):
            continue
        name_by_pid = {entry["pid"]: entry["name"] for entry in fact.get("worker_processes", [])}
        for worker in fact.get("workers", []):
            node = host_by_address.get(worker.get("ip"), host) if worker.get("ip") else host
            workers.setdefault(node, []).append(worker)
            names.setdefault(node, []).append(name_by_pid.get(worker["pid"], worker.get("process") or "?"))
        for assigned in fact.get("assignments", []):
            node = host_by_address.get(assigned.get("ip"), host) if assigned.get("ip") else host
            assignments.setdefault(node, []).append(assigned)
    return workers, assignments, names


def _runs(fact):
    """False for a unit known to be stopped: its journal is its last run's, not live ranks."""
    unit = fact.get("unit") or {}
    state = unit.get("active_state")
    return state is None or (state in LIVE_STATES and unit.get("sub_state") != "auto-restart")


def _unit_rows(rows, host, fact):
    unit = (fact or {}).get("unit") or {}
    state = unit.get("active_state")
    if not fact:
        rows.add(host, "unit", "active (running)", "no data from this node (failed or unreachable)", False)
        return False
    found = f"{state or 'unknown'} ({unit.get('sub_state') or '?'})"
    if unit.get("restarts"):
        found += f", restarted {unit['restarts']}x"
    rows.add(host, "unit", "active (running)", found, state == "active")
    errors = fact.get("errors") or []
    if errors:
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        rows.add(host, "start-up errors", "none", errors[0]["line"] + more, False)
    return state == "active"


def _role_row(rows, plan, node, fact):
    headless = next((h for h in plan["expect"].get("headless_launches", []) if h["node"] == node["host"]), None)
    found_headless = (fact or {}).get("headless") or []
    if headless is None:
        url = (fact or {}).get("server_url")
        found = f"API server on {url}" if url else "no 'Starting vLLM server' line"
        if found_headless:
            found = f"headless {found_headless[0]['kind']}"
        expected = "API server (head)" if node.get("role") == "head" else "API server (independent replica)"
        rows.add(node["host"], "role", expected, found, bool(url) and not found_headless)
        return
    head = plan["nodes"][0]
    master = f"{head['address']}:{plan['ports']['master']}" if "master" in plan.get("ports", {}) else None
    if headless["kind"] == "multiproc_executor":
        expected = "headless multiproc executor" + (f" -> {master}" if master else "")
    else:
        expected = f"{headless['dp_engines']} headless DP engine(s)"
    if not found_headless:
        rows.add(node["host"], "role", expected, "no headless launch line", False)
        return
    launch = found_headless[-1]
    if launch["kind"] == "multiproc_executor":
        found = f"headless multiproc executor -> {launch['head_address']}"
        ok = headless["kind"] == "multiproc_executor" and (master is None or launch["head_address"] == master)
    else:
        found = f"{launch['dp_engines']} headless DP engine(s)"
        ok = headless["kind"] == "dp_engines" and launch["dp_engines"] == headless["dp_engines"]
    rows.add(node["host"], "role", expected, found, ok)


def _engine_rows(rows, plan, node, fact):
    expect = plan["expect"]
    expected_engines = [e for e in expect["engines"] if e["node"] == node["host"]]
    found_engines = list((fact or {}).get("engines") or [])
    tolerance = float(expect.get("kv_tolerance") or 0.0)
    exact = tolerance == 0.0
    for engine in expected_engines:
        match = next((e for e in found_engines if e.get("process") == engine["engine"]), None)
        if match is None and len(expected_engines) == 1 and len(found_engines) == 1:
            match = found_engines[0]  # an older engine name (EngineCore_0) for the one engine of the node
        expected_text = f"{engine['kv_cache_tokens']:,}" + (" (exact)" if exact else f" +-{tolerance:.1%}")
        check = f"KV tokens {engine['engine']}"
        if match is None:
            rows.add(node["host"], check, expected_text, "no KV cache line", False)
            continue
        found_engines.remove(match)
        want, got = engine["kv_cache_tokens"], match["kv_cache_tokens"]
        ok = got == want if exact else (want > 0 and abs(got - want) / want <= tolerance)
        if not exact and want > 0:
            found_text = f"{_kv_text(match)} ({(got - want) / want:+.1%})"
        else:
            found_text = _kv_text(match)
        rows.add(node["host"], check, expected_text, found_text, ok)
    if found_engines:
        rows.add(
            node["host"],
            "engines",
            ", ".join(e["engine"] for e in expected_engines) or "none on this node",
            "unexpected " + ", ".join(f"{e.get('process')}: {_kv_text(e)}" for e in found_engines),
            False,
        )


def _expert_rows(rows, plan, node, fact):
    ep = plan["expect"].get("expert_parallel")
    if not ep:
        return
    leaders = [
        r for r in plan["expect"]["rank_assignments"] if r["node"] == node["host"] and r["local_rank"] == 0
    ]
    expected = sorted(
        f"EP{r['ep']}/{ep['size']}: {ep['local_experts_by_ep_rank'][r['ep']]}/{ep['global_experts']}"
        for r in leaders
        if r.get("ep") is not None
    )
    found = sorted(
        f"EP{e['ep_rank']}/{e['ep_size']}: {e['local_experts']}/{e['global_experts']}"
        for e in (fact or {}).get("expert_parallel") or []
    )
    rows.add(node["host"], "expert parallel", "; ".join(expected) or "none", "; ".join(found) or "none",
             expected == found)


def _configured_row(rows, plan, host, fact):
    """The sizes one API server was given: the plan's, with independent replicas' DP counted per server."""
    configured = (fact or {}).get("configured") or {}
    if not configured:
        return
    dp = (plan.get("data_parallel") or {}).get("replicas_per_server", plan["dp"])
    want = (plan["tp"], plan["pp"], dp)
    got = tuple(configured.get(k, 1) for k in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"))
    rows.add(host, "sizes vLLM was given", "TP={} PP={} DP={}".format(*want),
             "TP={} PP={} DP={}".format(*got), want == got)


def _ray_rows(rows, plan, ray):
    if not ray:
        return
    tp = plan["tp"]
    exact = plan["expect"].get("ranks_by_node_exact", True)
    host_by_address = {node["address"]: node["host"] for node in plan["nodes"]}
    for node in plan["nodes"]:
        actors = ray["by_node_ip"].get(node["address"], [])
        ranks = sorted(a["pp"] * tp + a["tp"] for a in actors if a["tp"] is not None)
        want = plan["expect"]["ranks_by_node"].get(node["host"], [])
        if exact:
            rows.add(node["host"], "Ray workers (ranks)", _ranks_text(want), _ranks_text(ranks) if actors else "none",
                     ranks == sorted(want))
        else:
            rows.add(node["host"], "Ray workers (count)", str(len(want)), str(len(actors)), len(actors) == len(want))
    strangers = sorted(ip for ip in ray["by_node_ip"] if ip not in host_by_address)
    if strangers:
        rows.add(ALL_NODES, "Ray workers elsewhere", "none", ", ".join(strangers), False)
    if ray.get("dead"):
        rows.add(ALL_NODES, "Ray workers not alive", "none",
                 ", ".join(f"{a['name']} {a['state']}" for a in ray["dead"]), False)


def _balance_row(rows, node, labels, samples, tolerance):
    verdict = gpu_balance.memory_balance(samples, tolerance=tolerance)
    measured = [g for g in verdict["gpus"] if g["deviation"] is not None]
    if measured:
        worst = max(measured, key=lambda g: abs(g["deviation"]))
        found = (f"{len(verdict['gpus'])} GPUs, largest deviation {worst['deviation']:+.1%} "
                 f"({labels[worst['gpu']]}: {worst['mean']:.0f} MiB, mean {verdict['mean_mib']:.0f} MiB)")
    else:
        found = f"{len(verdict['gpus'])} GPUs, no memory figures"
    if verdict["status"] == "warn":
        found += ": " + "; ".join(verdict["reasons"])
    rows.add(node, "GPU memory balance", f"within +-{tolerance:.0%}", found, verdict["status"] != "fail")


def _gpu_rows(rows, plan, gpus, tolerance):
    """Used memory of the plan's GPUs (nvidia-smi via gpu_facts), per node and over the deployment."""
    if plan.get("cluster", {}).get("device", "cuda") != "cuda" or not gpus:
        return
    every, every_labels = [], {}
    for node in plan["nodes"]:
        wanted = set(node.get("local_gpus") or [])
        samples, labels = [], {}
        for gpu in gpus.get(node["host"]) or []:
            if gpu.get("index") not in wanted:
                continue
            used = gpu.get("memory_used_mib", gpu.get("memory.used"))
            samples.append({"index": gpu["index"], "memory.used": used})
            labels[gpu["index"]] = f"GPU {gpu['index']}"
            every_labels[len(every)] = f"{node['host']} GPU {gpu['index']}"
            every.append({"index": len(every), "memory.used": used})
        if not samples:
            rows.add(node["host"], "GPU memory balance", f"within +-{tolerance:.0%}", "no GPU rows", False)
        elif len(samples) > 1:
            _balance_row(rows, node["host"], labels, samples, tolerance)
    if len(plan["nodes"]) > 1 and len(every) > 1:
        _balance_row(rows, ALL_NODES, every_labels, every, tolerance)


def check(plan, observed, gpus=None, memory_tolerance=gpu_balance.DEFAULT_MEMORY_TOLERANCE):
    """Compare ``plan['expect']`` with ``observed`` (per host); see the module docstring."""
    _require(plan)
    expect = plan["expect"]
    observed = observed or {}
    rows = _Rows()
    workers_by_node, assigned_by_node, names_by_node = _attribute(plan, observed)
    planned_hosts = [node["host"] for node in plan["nodes"]]
    head = plan["nodes"][0]
    mode = launch.of_plan(plan)
    exact_ranks = expect.get("ranks_by_node_exact", True)

    for node in plan["nodes"]:
        host = node["host"]
        fact = observed.get(host)
        rows_here = [r for r in expect["rank_assignments"] if r["node"] == host]
        if node.get("runs_vllm", True):
            _unit_rows(rows, host, fact)
            _role_row(rows, plan, node, fact)
        workers = workers_by_node.get(host, [])
        want_sizes = {expect["worker_log_world_size"]} if rows_here else set()
        got_sizes = {w["world_size"] for w in workers}
        rows.add(host, "world_size", _ranks_text(sorted(want_sizes)) if want_sizes else "none",
                 _ranks_text(sorted(got_sizes)) if got_sizes else "none", got_sizes == want_sizes)
        want_ranks = sorted(f"{r['log_rank']}/{r['local_rank']}" for r in rows_here)
        got_ranks = sorted(f"{w['rank']}/{w['local_rank']}" for w in workers)
        if exact_ranks:
            rows.add(host, "ranks (rank/local)", " ".join(want_ranks) or "none", " ".join(got_ranks) or "none",
                     want_ranks == got_ranks)
        else:
            rows.add(host, "workers", str(len(want_ranks)), str(len(got_ranks)), len(want_ranks) == len(got_ranks))
        want_axes = sorted(
            _axes_text(parse_assigned_line(a["line"])) for a in expect["assigned_lines"] if a["node"] == host
        )
        got_axes = sorted(_axes_text(a) for a in assigned_by_node.get(host, []))
        if exact_ranks:
            rows.add(host, "DP/PP/TP/EP ranks", "; ".join(want_axes) or "none", "; ".join(got_axes) or "none",
                     want_axes == got_axes)
        if mode.worker_processes_named:
            want_names = sorted(r["process"] for r in rows_here)
            got_names = sorted(names_by_node.get(host, []))
            rows.add(host, "worker processes", " ".join(want_names) or "none", " ".join(got_names) or "none",
                     want_names == got_names)
        _engine_rows(rows, plan, node, fact)
        _expert_rows(rows, plan, node, fact)

    # Every rank exactly once, over the whole deployment (dense DP: once per replica).
    want_all = Counter(r["log_rank"] for r in expect["rank_assignments"])
    got_all = Counter(w["rank"] for node_workers in workers_by_node.values() for w in node_workers)
    if want_all != got_all:
        extra = sorted((got_all - want_all).elements())
        missing = sorted((want_all - got_all).elements())
        detail = []
        if missing:
            detail.append("missing " + _ranks_text(missing))
        if extra:
            detail.append("extra " + _ranks_text(extra))
        found_text = (_ranks_text(list(got_all.elements())) or "none") + " (" + ", ".join(detail) + ")"
    else:
        found_text = _ranks_text(list(got_all.elements()))
    copies = plan["dp"] if not expect.get("dp_shares_world") and plan["dp"] > 1 else 1
    rows.add(ALL_NODES, "every rank once" + (f" per replica (x{copies})" if copies > 1 else ""),
             _ranks_text(list(want_all.elements())), found_text, want_all == got_all)

    independent = (plan.get("data_parallel") or {}).get("mode") == "independent"
    for node in plan["nodes"] if independent else [head]:  # independent replicas: each server on its own
        _configured_row(rows, plan, node["host"], observed.get(node["host"]))
    _ray_rows(rows, plan, (observed.get(head["host"]) or {}).get("ray"))
    _gpu_rows(rows, plan, gpus, memory_tolerance)

    # Nodes outside the plan must not run vLLM (a unit left from an earlier layout breaks the next one).
    for host in sorted(observed):
        if host in planned_hosts or not observed[host]:
            continue
        unit = observed[host].get("unit") or {}
        state = unit.get("active_state") or "unknown"
        if unit.get("load_state") == "not-found":
            state = "no vllm unit"
        rows.add(host, "unit (not in plan)", "no vllm unit running", state,
                 state not in ("active", "activating", "reloading"))

    mismatches = [row for row in rows.rows if not row["ok"]]
    return {
        "ok": not mismatches,
        "rows": rows.rows,
        "mismatches": mismatches,
        "table": render_table(rows.rows),
        "topology": _topology_summary(plan, workers_by_node, assigned_by_node, names_by_node, observed),
    }


def _topology_summary(plan, workers_by_node, assigned_by_node, names_by_node, observed):
    nodes = {}
    for node in plan["nodes"]:
        host = node["host"]
        fact = observed.get(host) or {}
        nodes[host] = {
            "ranks": sorted(w["rank"] for w in workers_by_node.get(host, [])),
            "world_sizes": sorted({w["world_size"] for w in workers_by_node.get(host, [])}),
            "assigned": sorted(_axes_text(a) for a in assigned_by_node.get(host, [])),
            "processes": sorted(names_by_node.get(host, [])),
            "engines": [
                {"engine": e.get("process"), "kv_cache_tokens": e["kv_cache_tokens"],
                 "max_concurrency": e.get("max_concurrency")}
                for e in fact.get("engines") or []
            ],
            "headless": [h["kind"] for h in fact.get("headless") or []],
            "server_url": fact.get("server_url"),
        }
    return {
        "strategy": plan.get("strategy"),
        "backend": plan["backend"],
        "tp": plan["tp"],
        "pp": plan["pp"],
        "dp": plan["dp"],
        "ep": plan.get("ep"),
        "world_size": plan["world_size"],
        "nodes": nodes,
    }


def readiness_targets(plan, host):
    """What the journal of ``host`` must show before verification reads it: counts of lines.

    ``workers``: per-worker rank lines; ``engines``: KV lines; ``server``: the API server's start
    line (head of an mp deployment, or the Ray head). A node outside the plan waits for nothing.
    """
    expect = plan["expect"]
    node = next((n for n in plan["nodes"] if n["host"] == host), None)
    if node is None or not node.get("runs_vllm", True):
        return {"workers": 0, "engines": 0, "server": False}
    return {
        "workers": launch.of_plan(plan).readiness_workers(plan, node),
        "engines": sum(1 for e in expect["engines"] if e["node"] == host),
        "server": not node.get("headless", False),
    }
