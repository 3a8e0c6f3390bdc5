#!/usr/bin/python
"""Ansible module router_worker: take a vLLM server out of vllm-router, or put it back, and check its list."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: router_worker
short_description: Take one worker out of vllm-router or put it back, and check that the router lists it so
version_added: 0.1.0
description:
  - Reads the router's C(/list_workers), then C(POST /remove_worker?url=...) (O(state=absent)) or
    C(POST /add_worker?url=...) (O(state=present)) when the worker is not already so, then reads
    C(/list_workers) again until it lists the worker (or no longer does) within O(timeout) seconds.
  - O(state=query) only reads the list.
  - vllm-router 0.1.17 takes no key on these endpoints; run the module on the router host itself
    (C(delegate_to)) against its loopback or own address (docs/router.md, "Rolling changes").
  - In check mode it reads the list and reports what it would change; it sends nothing else.
  - The logic that reads the answer is C(plugins/module_utils/router/roll.py) (C(listed_workers)).
options:
  router_url:
    description: The router's client URL as seen from where the module runs, C(http://127.0.0.1:8080).
    type: str
    required: true
  worker_url:
    description: The worker's URL exactly as the router lists it, C(http://10.0.0.1:8000). Not needed for V(query).
    type: str
  state:
    description: V(absent) takes the worker out, V(present) puts it back, V(query) reads the list.
    type: str
    choices: [absent, present, query]
    default: query
  timeout:
    description: Seconds for each request and for the list to show the change.
    type: int
    default: 120
  label:
    description: The host this worker is, for messages.
    type: str
    default: "?"
author:
  - vllm-cluster developers (@vllm-ops)
"""

EXAMPLES = r"""
- name: Take node2's vLLM out of the router before its restart
  vllm_ops.cluster.router_worker:
    router_url: http://127.0.0.1:8080
    worker_url: http://10.0.0.2:8000
    state: absent
    label: node2
  delegate_to: router-a
"""

RETURN = r"""
workers:
  description: The URLs the router lists after the module's change.
  returned: always
  type: list
  elements: str
listed_before:
  description: Whether the router listed the worker before the module's change.
  returned: when worker_url is given
  type: bool
"""

import json
import time
from urllib.parse import quote

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url
from ansible_collections.vllm_ops.cluster.plugins.module_utils.router.roll import RollError, listed_workers


def _request(module, method, url):
    timeout = module.params["timeout"]
    try:
        response = open_url(url, method=method, timeout=timeout, validate_certs=False)
        return response.getcode(), response.read().decode("utf-8", "replace")
    except Exception as exc:  # noqa: BLE001 - HTTP errors and unreachable routers alike end in one message
        code = getattr(exc, "code", None)
        body = exc.read().decode("utf-8", "replace") if hasattr(exc, "read") else ""
        return code, body or str(exc)


def _workers(module, base):
    code, body = _request(module, "GET", f"{base}/list_workers")
    if code != 200:
        module.fail_json(msg=f"router {base}: /list_workers answered {code or 'nothing'} ({body[:300]}); "
                             f"expected 200 with its workers (vllm-router running, reached from the router host)")
    try:
        return listed_workers(json.loads(body))
    except (ValueError, RollError) as exc:
        module.fail_json(msg=f"router {base}: {exc}")


def main():
    module = AnsibleModule(
        argument_spec={
            "router_url": {"type": "str", "required": True},
            "worker_url": {"type": "str"},
            "state": {"type": "str", "choices": ["absent", "present", "query"], "default": "query"},
            "timeout": {"type": "int", "default": 120},
            "label": {"type": "str", "default": "?"},
        },
        required_if=[("state", "absent", ("worker_url",)), ("state", "present", ("worker_url",))],
        supports_check_mode=True,
    )
    base = module.params["router_url"].rstrip("/")
    worker = (module.params["worker_url"] or "").rstrip("/")
    state, label = module.params["state"], module.params["label"]
    workers = _workers(module, base)
    if state == "query" or not worker:
        module.exit_json(changed=False, workers=workers)
    listed = worker in workers
    wanted = state == "present"
    if listed == wanted or module.check_mode:
        module.exit_json(changed=listed != wanted, workers=workers, listed_before=listed)
    endpoint = "add_worker" if wanted else "remove_worker"
    code, body = _request(module, "POST", f"{base}/{endpoint}?url={quote(worker, safe='')}")
    if code != 200:
        module.fail_json(msg=f"host {label}: router {base} answered {code or 'nothing'} to /{endpoint} of {worker} "
                             f"({body[:300]}); expected 200", workers=workers, listed_before=listed)
    deadline = time.monotonic() + module.params["timeout"]
    while True:
        workers = _workers(module, base)
        if (worker in workers) == wanted:
            module.exit_json(changed=True, workers=workers, listed_before=listed, answer=body[:300])
        if time.monotonic() > deadline:
            module.fail_json(msg=f"host {label}: after /{endpoint} the router {base} still "
                                 f"{'does not list' if wanted else 'lists'} {worker} within "
                                 f"{module.params['timeout']} s (workers: {', '.join(workers) or 'none'})",
                             workers=workers, listed_before=listed)
        time.sleep(1)


if __name__ == "__main__":
    main()
