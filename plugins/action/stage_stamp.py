"""Action stage_stamp: the module on the node and, while it runs, the controller's client completion.

deploy.yml's converged check (playbooks/converged.yml) skips a stage only when the deployment answers a real
completion from the controller. The action asks it while the node collects its stamps' evidence, so a no-op
re-run pays for one round trip, not two. The options below are the action's own; the rest go to the module
(plugins/modules/stage_stamp.py documents both).
"""

from __future__ import annotations

import threading

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.vllm_ops.cluster.plugins.lookup.api_completion import ask

# The completion matters only when this node would let the vllm stage be skipped: its stamps up to that stage
# hold and its units are healthy. Otherwise the answer is not awaited (every stage runs anyway).
LAST_STAGE_NEEDING_THE_CLIENT = "vllm"


def client_needed(stages, result):
    """Whether this node's check leaves the controller's completion as the deciding fact."""
    if result.get("failed") or result.get("health_problems"):
        return False
    checked = result.get("stages") or {}
    for stage in stages:
        if (checked.get(stage) or {}).get("reasons", ["not checked"]):
            return False
        if stage == LAST_STAGE_NEEDING_THE_CLIENT:
            break
    return True


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        targets = args.pop("client_targets", None) or []
        api_key = args.pop("client_api_key", None) or ""
        timeout = float(args.pop("client_timeout", 10))
        if not isinstance(targets, list) or not all(isinstance(t, dict) and "url" in t for t in targets):
            raise AnsibleActionFail(f"stage_stamp: client_targets must be a list of {{host, url, model}}, "
                                    f"got {targets!r}")
        if targets and args.get("state", "check") != "check":
            raise AnsibleActionFail("stage_stamp: client_targets go with state=check only")
        # Daemon threads: a completion nobody waits for (every stage runs) does not hold the worker's exit.
        found = [None] * len(targets)

        def probe(index, target):
            found[index] = ask(target, api_key, timeout)

        threads = [threading.Thread(target=probe, args=(i, t), daemon=True) for i, t in enumerate(targets)]
        for thread in threads:
            thread.start()
        result.update(self._execute_module(module_name="vllm_ops.cluster.stage_stamp", module_args=args,
                                           task_vars=task_vars))
        if targets and client_needed(args.get("stages") or [], result):
            for thread in threads:
                thread.join(timeout + 5)
            result["client_problems"] = [
                problem if finished else f"controller: POST {target['url']} gave no answer within {timeout + 5:g} s"
                for target, problem, finished in zip(targets, found, [not t.is_alive() for t in threads], strict=True)
                if problem or not finished]
        return result
