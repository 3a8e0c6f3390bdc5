#!/usr/bin/python
"""Ansible module nft_table_sync: load the deployment's nftables table again when its live rules drifted, and name
the rules of other tables that drop the deployment's ports."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nft_table_sync
short_description: Reload the deployment's nftables table when its live rules differ; name other tables' blocking rules
version_added: 0.5.0
description:
  - Compares the live table (C(nft --stateless list table inet <table>)) with the listing recorded right after the
    last load of O(file) (O(record)); when they differ, the table is absent, the file changed or nothing is recorded,
    loads O(file) again (C(nft -f), one transaction) and reports C(changed) when the live rules changed, with the
    rules before and after in C(--diff).
  - Reads every other table (C(nft -j list ruleset)) for a rule whose verdict is drop or reject on one of O(ports);
    fails naming the host, table, chain, rule, port and the command that deletes it, unless O(ignored) accepts it.
    Other tables are never changed.
options:
  table: {description: The deployment's table (family inet)., type: str, default: vllm_cluster}
  file: {description: The file that loads the table., type: path, required: true}
  record: {description: Where the listing after the last load is kept., type: path, required: true}
  file_changed: {description: The file was written in this run (load it)., type: bool, default: false}
  ports:
    description: The deployment's ports and V(first-last) ranges other tables must not drop.
    type: list
    elements: str
    default: []
  port_names: {description: "Port -> what it is (V(the API port)), as the messages name it.", type: dict, default: {}}
  ignored:
    description: V(true), or a list of V(family table), V(family table chain) or V(family table chain handle N) whose
      blocking rules are accepted.
    type: raw
    default: false
  label: {description: The host as the messages name it., type: str}
notes:
  - In check mode nothing is loaded; C(changed) says whether a load would change the rules (true when unknown).
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
author:
  - vllm-cluster developers (@vllm-ops)
"""

EXAMPLES = r"""
- name: Load the table again when its live rules drifted; name other tables that drop our ports
  vllm_ops.cluster.nft_table_sync:
    file: /etc/vllm-cluster/firewall.nft
    record: /run/vllm-cluster/firewall.loaded.json
    ports: ["8000", "29500-29510"]
"""

RETURN = r"""
reloaded: {description: "Whether the table was loaded (in check mode - would be).", returned: always, type: bool}
reason: {description: "Why it was (or was not) loaded.", returned: always, type: str}
blocking:
  description: Rules of other tables that drop or reject a port of the deployment.
  returned: always
  type: list
  elements: dict
  sample: [{"family": "inet", "table": "foreign", "chain": "in", "handle": 2, "verdict": "drop", "port": 8000,
            "text": "tcp dport 8000 drop", "ignored": false, "message": "..."}]
msg: {description: "What was done, or the blocking rules named.", returned: always, type: str}
"""

import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.nft_ruleset import (  # noqa: E402
    blocking_message,
    blocking_rules,
    normalised_table,
    rule_ignored,
    table_decision,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "table": {"type": "str", "default": "vllm_cluster"},
            "file": {"type": "path", "required": True},
            "record": {"type": "path", "required": True},
            "file_changed": {"type": "bool", "default": False},
            "ports": {"type": "list", "elements": "str", "default": []},
            "port_names": {"type": "dict", "default": {}},
            "ignored": {"type": "raw", "default": False},
            "label": {"type": "str"},
        },
        supports_check_mode=True,
    )
    params = module.params
    host = params["label"] or socket.gethostname()
    nft = module.get_bin_path("nft")
    if module.check_mode and (not nft or not os.path.exists(params["file"])):
        module.exit_json(changed=True, reloaded=True, reason="nft or the file is not installed yet", blocking=[],
                         msg=f"{host}: would load table inet {params['table']} (nft or the file is not installed yet)")
    if not nft:
        module.fail_json(msg=f"{host}: nft not found; expected the nftables package")

    def listing():
        rc, out, _ = module.run_command([nft, "--stateless", "list", "table", "inet", params["table"]])
        return normalised_table(out) if rc == 0 else ""

    with open(params["file"], "rb") as handle:
        sha256 = hashlib.sha256(handle.read()).hexdigest()
    try:
        with open(params["record"], encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        record = None
    before = listing()
    reload, reason = table_decision(before, record, sha256, params["file_changed"])
    after, changed = before, False
    if reload and module.check_mode:
        known = record and record.get("sha256") == sha256 and not params["file_changed"]
        after = record["listing"] if known else f"# what {params['file']} loads\n"
        changed = after != before
    elif reload:
        rc, _, err = module.run_command([nft, "-f", params["file"]])
        if rc != 0:
            module.fail_json(msg=f"{host}: nft -f {params['file']} failed: {err.strip()}; expected it to load the "
                                 f"table inet {params['table']} (nft -c -f {params['file']})")
        after = listing()
        changed = after != before
        os.makedirs(os.path.dirname(params["record"]), exist_ok=True)
        with open(params["record"], "w", encoding="utf-8") as handle:
            json.dump({"sha256": sha256, "listing": after}, handle)

    rc_json, ruleset_json, err = module.run_command([nft, "-j", "list", "ruleset"])
    rc_text, ruleset_text, _ = module.run_command([nft, "-a", "list", "ruleset"])
    if rc_json != 0 or rc_text != 0:
        module.fail_json(msg=f"{host}: nft list ruleset failed: {err.strip()}")
    names = {int(port): name for port, name in (params["port_names"] or {}).items() if str(port).isdigit()}
    blocking = []
    for hit in blocking_rules(ruleset_json, ruleset_text, params["ports"], ("inet", params["table"])):
        hit["ignored"] = rule_ignored(hit, params["ignored"])
        hit["message"] = blocking_message(host, hit, names)
        blocking.append(hit)
    verb = ("would load" if module.check_mode else "loaded") if reload else "kept"
    msg = f"{host}: {verb} table inet {params['table']} ({reason})"
    result = {"changed": changed, "reloaded": reload, "reason": reason, "blocking": blocking, "msg": msg}
    if module._diff and changed:
        result["diff"] = {"before": before, "after": after, "before_header": f"live table inet {params['table']}",
                          "after_header": params["file"]}
    for hit in blocking:
        if hit["ignored"]:
            module.warn(hit["message"] + " (accepted)")
    refused = [hit["message"] for hit in blocking if not hit["ignored"]]
    if refused:
        module.fail_json(**{**result, "msg": "; ".join(refused)})
    module.exit_json(**result)


if __name__ == "__main__":
    main()
