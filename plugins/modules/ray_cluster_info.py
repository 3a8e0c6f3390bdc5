#!/usr/bin/python
"""Ansible module ray_cluster_info: what the Ray cluster reports, and whether it is what the plan expects."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: ray_cluster_info
short_description: Read Ray's nodes (state API or ray status) and wait for the expected nodes and GPUs
version_added: 0.1.0
description:
  - Reads the Ray cluster's nodes with C(ray list nodes --format json) from the
    state API (served by the head's dashboard), or, when O(source=status) or the
    state API does not answer, with C(ray status) from the GCS.
  - With O(expect_nodes), compares the ALIVE nodes with the expected ones (by
    address) and their GPUs, and with O(wait_timeout) keeps reading until they
    match. On timeout it fails with one message naming each missing node (name
    and address), the nodes Ray did report, nodes ALIVE at unexpected addresses,
    and GPU count differences.
  - Optionally also returns actors and placement groups (O(collect)).
  - Only reads; runs the C(ray) CLI of the runtime venv.
options:
  ray:
    description: The C(ray) command of the runtime venv.
    type: path
    default: /opt/vllm-cluster/venv/bin/ray
  dashboard_url:
    description: The head's dashboard, e.g. C(http://10.0.0.1:8265) (state API).
    type: str
  gcs_address:
    description: The head's GCS, e.g. C(10.0.0.1:6379) (C(ray status)).
    type: str
  source:
    description:
      - V(state_api) reads C(ray list nodes); V(status) reads C(ray status);
        V(auto) reads the state API and falls back to C(ray status) when it
        does not answer (C(ray status) counts nodes but cannot name them).
    type: str
    choices: [auto, state_api, status]
    default: auto
  expect_nodes:
    description:
      - The nodes that must be ALIVE, each C({name, address}) and optionally
        C(gpus) (the GPUs that node must register).
    type: list
    elements: dict
  expect_gpus:
    description: Total GPUs the ALIVE nodes must register; default the sum of O(expect_nodes)' C(gpus).
    type: float
  wait_timeout:
    description: Seconds to keep reading until the cluster matches; 0 reads once.
    type: int
    default: 0
  poll_interval:
    description: Seconds between reads while waiting.
    type: int
    default: 5
  command_timeout:
    description: Seconds one C(ray) command may take.
    type: int
    default: 60
  collect:
    description: Also read V(actors) and/or V(placement_groups) from the state API (C(--detail)).
    type: list
    elements: str
    choices: [actors, placement_groups]
    default: []
notes:
  - Check mode runs the same reads.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
author:
  - vllm-cluster developers (@vllm-ops)
"""

EXAMPLES = r"""
- name: Wait for the head and two workers with 2 GPUs each
  vllm_ops.cluster.ray_cluster_info:
    dashboard_url: http://10.232.0.11:8265
    gcs_address: 10.232.0.11:6379
    expect_nodes:
      - {name: node1, address: 10.232.0.11, gpus: 2}
      - {name: node2, address: 10.232.0.12, gpus: 2}
      - {name: node3, address: 10.232.0.13, gpus: 2}
    wait_timeout: 600

- name: Where did vLLM place its Ray workers
  vllm_ops.cluster.ray_cluster_info:
    dashboard_url: http://10.232.0.11:8265
    collect: [actors, placement_groups]
  register: ray_state
"""

RETURN = r"""
source:
  description: Where the nodes were read, V(state_api) or V(status).
  returned: always
  type: str
nodes:
  description: Nodes from the state API (node_id, address, name, is_head, state, state_message, gpus, cpus, resources).
  returned: when read from the state API
  type: list
  elements: dict
status:
  description: C(ray status) parsed (nodes, node_count, pending, failures, usage, demands, per_node).
  returned: when read from ray status
  type: dict
alive:
  description: ALIVE nodes.
  returned: always
  type: int
gpus:
  description: GPUs over the ALIVE nodes.
  returned: always
  type: float
ok:
  description: Whether the cluster matches O(expect_nodes) / O(expect_gpus) (true when nothing is expected).
  returned: always
  type: bool
missing:
  description: Expected nodes that are not ALIVE, each with name, address and state (V(absent) or Ray's state).
  returned: always
  type: list
  elements: dict
unexpected:
  description: ALIVE nodes at addresses no expected node has.
  returned: always
  type: list
  elements: dict
message:
  description: The verdict in words; empty when it matches.
  returned: always
  type: str
waited:
  description: Seconds spent waiting.
  returned: always
  type: float
actors:
  description: Actors (actor_id, class_name, state, name, node_id, pid, placement_group_id).
  returned: when collect has actors
  type: list
  elements: dict
placement_groups:
  description: Placement groups (placement_group_id, name, state, bundles with node_id).
  returned: when collect has placement_groups
  type: list
  elements: dict
"""

import os  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify.ray_state import (  # noqa: E402
    RayStateError,
    compare_nodes,
    compare_status,
    parse_actors,
    parse_nodes,
    parse_placement_groups,
    parse_status,
)


class ReadError(RuntimeError):
    """A ray command failed or printed something unreadable."""


def _run(module, argv, timeout):
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONNOUSERSITE="1")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, env=env,
                              cwd="/")
    except subprocess.TimeoutExpired:
        raise ReadError(f"`{' '.join(argv[1:4])}` did not answer within {timeout} s") from None
    except OSError as error:
        raise ReadError(f"cannot run {argv[0]}: {error}") from None
    if proc.returncode != 0:
        lines = [line for line in (proc.stderr + "\n" + proc.stdout).splitlines() if line.strip()]
        # Ray's CLI ends with "Error: ..." or an exception line; that is the line to show.
        reason = next((line.strip() for line in reversed(lines) if line.strip().startswith(("Error", "ray.", "Runtime"))),
                      lines[-1].strip() if lines else "no output")
        raise ReadError(f"`{' '.join(argv[1:4])}` exited {proc.returncode}: {reason}")
    return proc.stdout


def read_state_api(module, params, what, detail=False):
    argv = [params["ray"], "list", what, "--format", "json", "--limit", "10000",
            "--address", params["dashboard_url"]]
    if detail:
        argv.append("--detail")
    return _run(module, argv, params["command_timeout"])


def read_once(module, params, expected, expect_gpus, cluster):
    """One reading: (result dict, error text or None)."""
    errors = []
    if params["source"] in ("auto", "state_api") and params["dashboard_url"]:
        try:
            nodes = parse_nodes(read_state_api(module, params, "nodes"))
            verdict = compare_nodes(expected, nodes, expect_gpus, cluster) if expected is not None else None
            return {"source": "state_api", "nodes": nodes, "verdict": verdict}, None
        except (ReadError, RayStateError) as error:
            errors.append(f"state API at {params['dashboard_url']}: {error}")
            if params["source"] == "state_api":
                return None, "; ".join(errors)
    if params["source"] in ("auto", "status") and params["gcs_address"]:
        try:
            status = parse_status(_run(module, [params["ray"], "status", "--address", params["gcs_address"]],
                                       params["command_timeout"]))
            verdict = compare_status(expected, status, expect_gpus, cluster) if expected is not None else None
            return {"source": "status", "status": status, "verdict": verdict}, None
        except (ReadError, RayStateError) as error:
            errors.append(f"ray status at {params['gcs_address']}: {error}")
    if not errors:
        errors.append("neither dashboard_url nor gcs_address is set for the chosen source")
    return None, "; ".join(errors)


def main():
    module = AnsibleModule(
        argument_spec={
            "ray": {"type": "path", "default": "/opt/vllm-cluster/venv/bin/ray"},
            "dashboard_url": {"type": "str"},
            "gcs_address": {"type": "str"},
            "source": {"type": "str", "choices": ["auto", "state_api", "status"], "default": "auto"},
            "expect_nodes": {"type": "list", "elements": "dict"},
            "expect_gpus": {"type": "float"},
            "wait_timeout": {"type": "int", "default": 0},
            "poll_interval": {"type": "int", "default": 5},
            "command_timeout": {"type": "int", "default": 60},
            "collect": {"type": "list", "elements": "str", "choices": ["actors", "placement_groups"],
                        "default": []},
        },
        required_one_of=[["dashboard_url", "gcs_address"]],
        supports_check_mode=True,
    )
    params = module.params
    host = socket.gethostname()
    if not os.access(params["ray"], os.X_OK):
        module.fail_json(msg=f"host {host}: {params['ray']} is not an executable ray command; expected the runtime "
                             "venv's ray (the vllm_runtime role installs it)")
    expected = params["expect_nodes"]
    cluster = f"Ray cluster {params['gcs_address'] or params['dashboard_url']}"
    start = time.monotonic()
    deadline = start + max(0, params["wait_timeout"])
    reading, error = None, None
    while True:
        reading, error = read_once(module, params, expected, params["expect_gpus"], cluster)
        matched = reading is not None and (reading["verdict"] is None or reading["verdict"]["ok"])
        if matched or time.monotonic() + params["poll_interval"] > deadline:
            break
        time.sleep(params["poll_interval"])
    waited = round(time.monotonic() - start, 1)
    if reading is None:
        unconfirmed = ""
        if expected:
            unconfirmed = " None of the expected nodes could be confirmed: " + ", ".join(
                f"{entry.get('name') or entry.get('address')} ({entry.get('address')})" for entry in expected) + "."
        module.fail_json(msg=f"host {host}: cannot read {cluster} after {waited} s: {error}.{unconfirmed}",
                         waited=waited)

    verdict = reading["verdict"] or {"ok": True, "missing": [], "unexpected": [], "message": ""}
    result = {
        "changed": False,
        "source": reading["source"],
        "ok": verdict["ok"],
        "missing": verdict["missing"],
        "unexpected": verdict["unexpected"],
        "message": verdict["message"],
        "waited": waited,
    }
    if reading["source"] == "state_api":
        result["nodes"] = reading["nodes"]
        alive = [node for node in reading["nodes"] if node["state"] == "ALIVE"]
        result["alive"] = len(alive)
        result["gpus"] = float(sum(node["gpus"] for node in alive))
    else:
        result["status"] = reading["status"]
        result["alive"] = reading["status"]["node_count"]
        result["gpus"] = float(reading["status"]["usage"].get("GPU", {}).get("total", 0.0))
    try:
        if "actors" in params["collect"]:
            result["actors"] = parse_actors(read_state_api(module, params, "actors", detail=True))
        if "placement_groups" in params["collect"]:
            result["placement_groups"] = parse_placement_groups(
                read_state_api(module, params, "placement-groups", detail=True))
    except (ReadError, RayStateError) as error:
        module.fail_json(msg=f"host {host}: cannot read {cluster}'s actors or placement groups: {error}", **result)
    if not verdict["ok"]:
        suffix = f" (waited {waited} s)" if params["wait_timeout"] > 0 else ""
        module.fail_json(msg=f"{verdict['message']}{suffix}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
