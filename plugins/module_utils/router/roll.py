"""How a change reaches a deployment's running servers: one server at a time behind the router, or not at all.

``roll_steps(previous, new)`` compares the plan that runs (``/etc/vllm-cluster/plan.json``, kept by vllm_service)
with the new one and says what a change may do:

- ``first``: nothing runs yet (no previous plan): deploy starts every server;
- ``none``: no server's command line or environment changes;
- ``roll``: the layout is the same and the deployment has several API servers (a dense model's independent DP
  replicas): each changed server, in plan order, is taken out of the router, stopped (vLLM's
  ``--shutdown-timeout`` lets its requests finish), started with the new configuration, verified, smoked and
  put back before the next; the others keep serving;
- ``restart``: the layout is the same but one API server fronts the deployment (one replica, or vLLM's own DP):
  there is no other server to take its traffic, so the change restarts it, and the plan says so;
- ``scale``: independent servers are added or removed and the others do not change: the new ones start and
  join the router, the removed ones leave it and drain; a scale and a change of the staying servers at once is
  refused (the seed's rule: one variable at a time);
- a layout change (TP=2 -> TP=4, other nodes, another DP mode) cannot roll: ``RollError`` unless the run asks
  for it (``allow_layout_switch``), then ``switch``: every server stops and starts at once.

Pure Python (3.11+); imports nothing from Ansible.
"""

from __future__ import annotations

import difflib

from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.text import flag_value
from ansible_collections.vllm_ops.cluster.plugins.module_utils.router.workers import (
    WILDCARD_HOSTS,
    RouterError,
    node_worker,
    serves_api,
    url,
)

# What makes two plans the same layout: the parallel sizes, how DP runs, the backend and the model's place.
LAYOUT_KEYS = ("tp", "pp", "dp", "ep", "backend")
# Per node: where its ranks run. A change of these moves ranks between machines or GPUs.
NODE_LAYOUT_KEYS = ("ranks", "local_gpus", "dp_ranks", "headless", "runs_vllm")
SWITCH_VARIABLE = "vllm_cluster_allow_layout_switch"


class RollError(RouterError):
    """A change that cannot roll, said with the deployment, the values and what to do."""


def _dp_mode(plan):
    return (plan.get("data_parallel") or {}).get("mode") or ("none" if int(plan.get("dp") or 1) == 1 else "vllm")


def _api_port(plan):
    return (plan.get("ports") or {}).get("api")


def layout_changes(previous, new):
    """What differs between the two plans' layouts, one phrase each (``tp 2 -> 4``); [] when it is the same."""
    changes = [f"{key} {previous.get(key)} -> {new.get(key)}" for key in LAYOUT_KEYS
               if previous.get(key) != new.get(key)]
    if _dp_mode(previous) != _dp_mode(new):
        changes.append(f"data parallel {_dp_mode(previous)} -> {_dp_mode(new)}")
    if _api_port(previous) != _api_port(new):
        changes.append(f"API port {_api_port(previous)} -> {_api_port(new)}")
    before = {node.get("host"): node for node in previous.get("nodes") or []}
    after = {node.get("host"): node for node in new.get("nodes") or []}
    if list(before) != list(after):
        changes.append(f"nodes {', '.join(before) or 'none'} -> {', '.join(after) or 'none'}")
        return changes
    for host, node in after.items():
        for key in NODE_LAYOUT_KEYS:
            if before[host].get(key) != node.get(key):
                changes.append(f"{host} {key} {before[host].get(key)} -> {node.get(key)}")
    return changes


def server_changes(previous_node, new_node):
    """What changes on one node: the ``argv`` words it drops and adds, and the ``env`` names that change (values
    are not shown: the environment may carry a secret one day)."""
    changes = []
    old_argv, new_argv = [str(w) for w in previous_node.get("argv") or []], [str(w) for w in new_node.get("argv") or []]
    if old_argv != new_argv:
        opcodes = difflib.SequenceMatcher(a=old_argv, b=new_argv, autojunk=False).get_opcodes()
        dropped = [w for tag, i1, i2, _, _ in opcodes if tag in ("delete", "replace") for w in old_argv[i1:i2]]
        added = [w for tag, _, _, j1, j2 in opcodes if tag in ("insert", "replace") for w in new_argv[j1:j2]]
        changes.append(" ".join(["argv"] + (["drops", *dropped] if dropped else []) + (["adds", *added] if added
                                                                                       else [])))
    old_env, new_env = previous_node.get("env") or {}, new_node.get("env") or {}
    names = sorted(name for name in set(old_env) | set(new_env) if old_env.get(name) != new_env.get(name))
    if names:
        changes.append(f"env {', '.join(names)}")
    return changes


def _scale(previous, new):
    """``(added, removed)`` hosts when only independent servers come or go, else None."""
    if _dp_mode(previous) != "independent" or _dp_mode(new) != "independent":
        return None
    if any(previous.get(key) != new.get(key) for key in ("tp", "pp", "ep", "backend")):
        return None
    if _api_port(previous) != _api_port(new):
        return None
    per_server = ("replicas_per_server",)
    if any((previous.get("data_parallel") or {}).get(key) != (new.get("data_parallel") or {}).get(key)
           for key in per_server):
        return None
    before = {node.get("host"): node for node in previous.get("nodes") or []}
    after = {node.get("host"): node for node in new.get("nodes") or []}
    for host in set(before) & set(after):
        if any(before[host].get(key) != after[host].get(key) for key in NODE_LAYOUT_KEYS):
            return None
    added = [host for host in after if host not in before]
    removed = [host for host in before if host not in after]
    return (added, removed) if added or removed else None


def roll_steps(previous, new, allow_layout_switch=False):
    """``{deployment, action, why, servers: [{host, url, changes}], unchanged: [host]}`` for a change.

    ``servers`` are the API servers whose node changes, in plan order (the order a roll takes them).
    """
    if not isinstance(new, dict) or not new.get("nodes"):
        raise RollError("roll: the new plan has no nodes; expected the plan of playbooks/plan.yml")
    name = new.get("deployment", "?")
    if not previous:
        return {"deployment": name, "action": "first", "servers": [], "unchanged": [],
                "why": f"{name}: nothing runs yet (no previous plan): every server starts."}
    if previous.get("deployment") not in (None, name):
        raise RollError(f"roll: the running plan is of deployment {previous.get('deployment')}, the new one of "
                        f"{name}; expected the same deployment's plans")
    scaled = _scale(previous, new)
    if scaled:
        added, removed = scaled
        staying = [node for node in new["nodes"] if node.get("host") not in added]
        before = {node.get("host"): node for node in previous["nodes"]}
        changing = [node.get("host") for node in staying if server_changes(before[node.get("host")], node)]
        if changing:
            raise RollError(
                f"deployment {name}: servers are added ({', '.join(added) or 'none'}) or removed "
                f"({', '.join(removed) or 'none'}) while the staying ones change ({', '.join(changing)}); expected "
                "one change at a time: first the servers, then the change (or the change, then the servers)")
        return {"deployment": name, "action": "scale", "servers": [], "unchanged": [n.get("host") for n in staying],
                "added": [{"host": host, "url": node_worker(new, node)["url"]} for node in new["nodes"]
                          for host in [node.get("host")] if host in added],
                "removed": [{"host": host, "url": node_worker(previous, node)["url"]} for node in previous["nodes"]
                            for host in [node.get("host")] if host in removed],
                "why": f"{name}: independent servers {('added: ' + ', '.join(added)) if added else ''}"
                       f"{'; ' if added and removed else ''}{('removed: ' + ', '.join(removed)) if removed else ''}"
                       "; the others do not change and keep serving: a new server joins the router once verified, "
                       "a removed one leaves it and drains (--shutdown-timeout) before it stops."}
    moved = layout_changes(previous, new)
    if moved:
        if not allow_layout_switch:
            raise RollError(
                f"deployment {name}: the layout changes ({'; '.join(moved)}), which cannot roll one server at a "
                "time (the replicas would not agree on the model's split); expected the same layout, or "
                f"-e {SWITCH_VARIABLE}=true to stop every server and start the new layout at once (the "
                "deployment does not serve meanwhile)")
        return {"deployment": name, "action": "switch", "servers": [], "unchanged": [],
                "why": f"{name}: the layout changes ({'; '.join(moved)}): every server stops, then the new "
                       f"layout starts ({SWITCH_VARIABLE}); no request is served meanwhile."}
    before = {node.get("host"): node for node in previous["nodes"]}
    changed = [node for node in new["nodes"] if server_changes(before[node.get("host")], node)]
    api_nodes = [node for node in new["nodes"] if serves_api(node)]
    unchanged = [node.get("host") for node in new["nodes"] if node not in changed]
    if not changed:
        return {"deployment": name, "action": "none", "servers": [], "unchanged": unchanged,
                "why": f"{name}: no server's command line or environment changes."}
    changed_hosts = {node.get("host") for node in changed}
    if len(api_nodes) < 2:
        return {"deployment": name, "action": "restart", "unchanged": unchanged,
                "servers": [{"host": node.get("host"), "url": None,
                             "changes": server_changes(before[node.get("host")], node)} for node in changed],
                "why": f"{name}: one API server fronts the deployment ({_dp_mode(new)} data parallel), so there is "
                       "no other server to take its requests: the change restarts it (plan more replicas, a "
                       "dense model's DP, to roll)."}
    if any(not serves_api(node) for node in changed):
        raise RollError(f"deployment {name}: a node without an API server changes "
                        f"({', '.join(h for h in changed_hosts if not serves_api(before[h]))}); expected only "
                        "independent servers in a deployment that rolls")
    return {"deployment": name, "action": "roll", "unchanged": unchanged,
            "servers": [{"host": node.get("host"), "url": node_worker(new, node)["url"],
                         "changes": server_changes(before[node.get("host")], node)} for node in changed],
            "why": f"{name}: {len(changed)} of its {len(api_nodes)} independent servers change: one at a time, "
                   "each out of the router, drained (--shutdown-timeout), restarted, verified and back in before "
                   "the next; the others keep serving."}


# --- The rolling path (playbooks/vllm.yml, role vllm_service: tasks/roll.yml and the roll's steps in service.yml) ---

ROUTER_UNIT = "vllm-router.service"  # role vllm_router's unit (its vars/main.yml)
# vllm-router 0.1.17's own defaults for --host and --port (its --help), for a unit whose argv leaves them out.
ROUTER_DEFAULT_HOST, ROUTER_DEFAULT_PORT = "127.0.0.1", "30000"
# What a stopping vLLM needs beyond --shutdown-timeout before systemd's TimeoutStopSec sends SIGKILL: the engine's
# own shutdown (workers, shared memory) after the last request.
STOP_MARGIN_S = 30
ONE_AT_A_TIME = ("roll", "none")


def router_admin_url(host, exec_start):
    """Where the router's admin endpoints (/list_workers, /add_worker, /remove_worker) answer, seen from the router
    host itself: its ``--host`` (loopback when it binds every address) and ``--port``.

    ``exec_start`` is the running unit's command line (the words, or ``systemctl show -p ExecStart --value``'s
    text). vllm-router 0.1.17 takes no key on these endpoints (docs/router.md): the roll calls them on the router
    host only.
    """
    text = " ".join(str(word) for word in exec_start) if isinstance(exec_start, (list, tuple)) else str(exec_start)
    if "argv[]=" in text:  # systemctl show's form: { path=... ; argv[]=... ; ignore_errors=no ; ... }
        text = text.split("argv[]=", 1)[1].split(" ;", 1)[0]
    words = text.split()
    if not words:
        raise RollError(f"router host {host}: {ROUTER_UNIT} has no command line; expected the unit of role "
                        "vllm_router (playbooks/router.yml)")
    bound = flag_value(words, "--host") or ROUTER_DEFAULT_HOST
    port = flag_value(words, "--port") or ROUTER_DEFAULT_PORT
    if not str(port).isdigit():
        raise RollError(f"router host {host}: {ROUTER_UNIT} has --port {port!r}; expected a port number")
    if bound in WILDCARD_HOSTS:
        bound = "::1" if bound == "::" else "127.0.0.1"
    return url(bound, port)


def listed_workers(answer):
    """The worker URLs of a /list_workers answer (vllm-router 0.1.17: ``{"urls": [...]}``; a list of URLs, or of
    ``{"url": ...}`` objects, is read too); RollError on anything else."""
    found = answer.get("urls", answer.get("workers")) if isinstance(answer, dict) else answer
    if not isinstance(found, list):
        raise RollError(f"router: /list_workers answered {str(answer)[:200]!r}; expected a JSON object with the "
                        "worker URLs (urls)")
    urls = [item.get("url") if isinstance(item, dict) else item for item in found]
    if not all(isinstance(item, str) for item in urls):
        raise RollError(f"router: /list_workers answered {str(answer)[:200]!r}; expected worker URLs")
    return [item.rstrip("/") for item in urls]


def shutdown_timeout_s(argv):
    """vLLM's ``--shutdown-timeout`` in an argv (seconds; 0 when absent: vLLM aborts in-flight requests)."""
    value = flag_value([str(word) for word in argv or []], "--shutdown-timeout")
    try:
        return int(float(value)) if value not in (None, "") else 0
    except ValueError:
        return 0


def stop_timeout_problem(host, argv, stop_timeout_s):
    """'' when systemd's TimeoutStopSec covers vLLM's --shutdown-timeout plus the engine's shutdown, else why not."""
    drain = shutdown_timeout_s(argv)
    if drain and int(stop_timeout_s) < drain + STOP_MARGIN_S:
        return (f"host {host}: vllm_service_stop_timeout_s is {stop_timeout_s} but vLLM's --shutdown-timeout is "
                f"{drain} s: systemd would kill vLLM before its requests finish; expected at least {drain} + "
                f"{STOP_MARGIN_S} = {drain + STOP_MARGIN_S} s")
    return ""


def running_argv_problem(host, cmdline, planned_argv):
    """'' when the running vLLM process was started with the planned ``vllm serve`` arguments, else what differs.

    ``cmdline`` is /proc/<MainPID>/cmdline (NUL-separated text, or its words): the interpreter and the ``vllm``
    script come first, then ``serve`` and the plan's arguments.
    """
    words = cmdline.split("\0") if isinstance(cmdline, str) else [str(word) for word in cmdline or []]
    words = [word for word in words if word != ""]
    planned = [str(word) for word in planned_argv or []]
    wanted = planned[1:] if planned[:1] == ["vllm"] else planned  # from "serve" on
    if wanted and words[-len(wanted):] == wanted:
        return ""
    shown = " ".join(words)[-400:] or "no process"
    return (f"host {host}: the running vLLM was started with '{shown}'; expected its arguments to end with the "
            f"plan's '{' '.join(wanted)}'")


def _previous_plan(previous_by_host, new):
    """The running plan the change is compared with, and per host the previous node of an interrupted roll."""
    known = {host: plan for host, plan in (previous_by_host or {}).items() if isinstance(plan, dict)}
    distinct = []
    for plan in known.values():
        if plan not in distinct:
            distinct.append(plan)
    order = [node.get("host") for node in new["nodes"]]
    first = next((known[host] for host in order if host in known), distinct[0] if distinct else None)
    return first, known, len(distinct) > 1


def roll_plan(new, previous_by_host, routers=None, allow_layout_switch=False):
    """What playbooks/vllm.yml does with a deployment's change: ``roll_steps`` plus how it runs.

    ``previous_by_host``: each node's running plan (its plan.json; None where there is none). The nodes of an
    interrupted roll run different plans: each server is then compared with its own. ``routers``: the router
    hosts of the inventory (``[{host, deployments, exec_start}]``, exec_start None when the router's unit is not
    installed). Adds ``one_at_a_time`` (the servers restart one by one behind the routers that front the
    deployment: action ``roll``, or ``none`` where a role setting still restarts them), ``order`` (the hosts
    in the order they roll), ``workers`` (each API server's URL) and ``routers`` (``[{host, admin_url}]``).
    """
    if not isinstance(new, dict) or not new.get("nodes"):
        raise RollError("roll: the new plan has no nodes; expected the plan of playbooks/plan.yml")
    name = new.get("deployment", "?")
    fronting = [router for router in routers or []
                if not router.get("deployments") or name in (router["deployments"].split(",")
                                                             if isinstance(router["deployments"], str)
                                                             else router["deployments"])]
    previous, known, interrupted = _previous_plan(previous_by_host, new)
    try:
        steps = roll_steps(previous, new, allow_layout_switch)
    except RollError as exc:
        if fronting:
            raise
        # No router fronts it: nothing to roll behind, the change restarts the deployment as before.
        steps = {"deployment": name, "action": "switch", "servers": [], "unchanged": [],
                 "why": f"{name}: no router fronts it; {exc}: every server restarts together"}
    if interrupted and steps["action"] in ONE_AT_A_TIME:
        changed, owns = [], {}
        for node in new["nodes"]:
            owns[node.get("host")] = next((n for n in (known.get(node.get("host")) or {}).get("nodes") or []
                                           if n.get("host") == node.get("host")), None)
            if owns[node.get("host")] is None or server_changes(owns[node.get("host")], node):
                changed.append(node)
        steps["servers"] = [{"host": node.get("host"), "url": node_worker(new, node)["url"],
                             "changes": server_changes(owns[node.get("host")], node)
                             if owns.get(node.get("host")) else ["no running plan"]}
                            for node in changed if serves_api(node)]
        steps["unchanged"] = [node.get("host") for node in new["nodes"] if node not in changed]
        steps["action"] = "roll" if changed else "none"
        steps["why"] = (f"{name}: its servers run different plans (a roll that stopped): "
                        f"{', '.join(s['host'] for s in steps['servers']) or 'none'} take the new one, one at a time")
    api_nodes = [node for node in new["nodes"] if serves_api(node)]
    rolls = (steps["action"] in ONE_AT_A_TIME and len(api_nodes) > 1 and _dp_mode(new) == "independent"
             and bool(fronting))
    missing = [router["host"] for router in fronting if not router.get("exec_start")]
    if rolls and missing:
        if steps["action"] == "roll":
            raise RollError(
                f"deployment {name}: the router host(s) {', '.join(missing)} front it (inventory group of "
                f"vllm_router) but run no {ROUTER_UNIT}; expected the router in place before a rolling change "
                "(playbooks/router.yml), or the deployment out of vllm_router_deployments")
        rolls = False  # nothing changes in the plan: today's behaviour
    steps["one_at_a_time"] = rolls
    steps["order"] = [node.get("host") for node in new["nodes"]] if rolls else []
    steps["workers"] = {node.get("host"): node_worker(new, node)["url"] for node in api_nodes} if rolls else {}
    steps["routers"] = [{"host": router["host"], "admin_url": router_admin_url(router["host"], router["exec_start"])}
                        for router in fronting] if rolls else []
    return steps
