"""nftables as the node prints it: the rules of other tables that drop or reject the deployment's ports.

``nft -j list ruleset`` (nftables >= 0.9; Debian 12 has 1.0.6) gives each
rule's table, chain, handle and match expressions; ``nft -a list ruleset``
gives the same rule as an operator reads it (``... # handle 4``), which the
messages quote. The deployment's own table is never judged here, and nothing
here deletes anything: a rule found is named, with the command that deletes it.

Pure Python 3.11, no Ansible import.
"""

from __future__ import annotations

import json
import re

DPORT_PROTOCOLS = ("tcp", "udp", "th", "sctp", "dccp")


def port_spec(ports):
    """[8000, "29500-29510", "32768"] -> [(8000, 8000), (29500, 29510), (32768, 32768)]."""
    ranges = []
    for item in ports or ():
        low, _, high = str(item).strip().partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            ranges.append((int(low), int(high or low)))
    return ranges


def _values(right, sets):
    """A match's right side -> [(low, high)]; None where it is not ports (a named set unknown, a variable)."""
    if isinstance(right, int):
        return [(right, right)]
    if isinstance(right, str):
        if right.startswith("@"):
            return sets.get(right[1:])
        return [(int(right), int(right))] if right.isdigit() else None
    if isinstance(right, dict):
        if "range" in right:
            low, high = right["range"]
            return [(int(low), int(high))] if isinstance(low, int) and isinstance(high, int) else None
        if "set" in right:
            found = []
            for element in right["set"]:
                values = _values(element, sets)
                if values is None:
                    return None
                found += values
            return found
    if isinstance(right, list):
        return _values({"set": right}, sets)
    return None


def _dport_matches(expr, sets):
    """[(op, [(low, high)])] of a rule's destination-port matches."""
    found = []
    for item in expr or ():
        match = item.get("match") if isinstance(item, dict) else None
        if not match:
            continue
        payload = (match.get("left") or {}).get("payload") or {}
        if payload.get("field") != "dport" or payload.get("protocol", "th") not in DPORT_PROTOCOLS:
            continue
        values = _values(match.get("right"), sets)
        if values is not None:
            found.append((match.get("op", "=="), values))
    return found


def _verdict(expr):
    for item in expr or ():
        if isinstance(item, dict):
            for verdict in ("drop", "reject"):
                if verdict in item:
                    return verdict
    return ""


def _first_hit(matches, ports):
    """The first of our ports every dport match lets through to the verdict, else None."""
    for low, high in ports:
        for port in range(low, min(high, low + 65535) + 1):
            if all(any(a <= port <= b for a, b in values) == (op != "!=") for op, values in matches):
                return port
    return None


def rule_texts(text):
    """``nft -a list ruleset`` -> {(family, table, chain, handle): the rule as nft prints it, without the handle}."""
    texts, table, chain = {}, None, None
    for raw in (text or "").splitlines():
        line = raw.strip()
        head = re.match(r"^table (\S+) (\S+) \{", line)
        if head:
            table, chain = (head.group(1), head.group(2)), None
            continue
        head = re.match(r"^(chain|set|map|flowtable) (\S+) \{", line)
        if head:
            chain = head.group(2) if head.group(1) == "chain" else None
            continue
        rule = re.match(r"^(.*\S)\s+# handle (\d+)$", line)
        if rule and table and chain and not line.startswith(("type ", "policy ", "set ", "map ", "flowtable ")):
            texts[(*table, chain, int(rule.group(2)))] = rule.group(1)
    return texts


def blocking_rules(ruleset_json, ruleset_text, ports, own_table=("inet", "vllm_cluster")):
    """The rules of other tables (any family) whose verdict is drop or reject for one of ``ports``.

    -> [{family, table, chain, handle, verdict, port, text}]. A rule without a destination-port match (a source
    address alone, a whole chain's policy) is not judged here.
    """
    data = json.loads(ruleset_json or "{}").get("nftables") or []
    wanted = port_spec(ports)
    sets = {}
    for item in data:
        found = item.get("set")
        if found and "elem" in found:
            values = _values({"set": found["elem"]}, {})
            if values is not None:
                sets[found["name"]] = values
    texts = rule_texts(ruleset_text)
    hits = []
    for item in data:
        rule = item.get("rule")
        if not rule or (rule.get("family"), rule.get("table")) == tuple(own_table):
            continue
        verdict = _verdict(rule.get("expr"))
        matches = _dport_matches(rule.get("expr"), sets)
        if not verdict or not matches:
            continue
        port = _first_hit(matches, wanted)
        if port is None:
            continue
        key = (rule["family"], rule["table"], rule["chain"], rule.get("handle"))
        hits.append({"family": key[0], "table": key[1], "chain": key[2], "handle": key[3], "verdict": verdict,
                     "port": port, "text": texts.get(key, "")})
    return hits


def rule_ignored(hit, ignored):
    """Whether ``node_firewall_foreign_rules_ignored`` accepts the rule: true, or a list naming its table
    (``inet foreign``), its chain (``inet foreign in``) or the rule (``inet foreign in handle 4``)."""
    if ignored is True:
        return True
    if not isinstance(ignored, (list, tuple)):
        return False
    names = {" ".join(str(entry).split()) for entry in ignored}
    where = f"{hit['family']} {hit['table']}"
    return bool({where, f"{where} {hit['chain']}", f"{where} {hit['chain']} handle {hit['handle']}"} & names)


def blocking_message(host, hit, port_names=None, variable="node_firewall_foreign_rules_ignored"):
    """One blocking rule as the firewall stage names it: host, table, chain, rule, port and the fix."""
    what = (port_names or {}).get(hit["port"], "a port of the deployment")
    rule = hit["text"] or f"handle {hit['handle']}"
    return (f"{hit_host(host)}: nftables table {hit['family']} {hit['table']}, chain {hit['chain']}: rule "
            f"'{rule}' {'drops' if hit['verdict'] == 'drop' else 'rejects'} traffic to port {hit['port']} ({what}); "
            f"vllm-cluster does not touch other tables: delete it with: nft delete rule {hit['family']} "
            f"{hit['table']} {hit['chain']} handle {hit['handle']} (or ask its owner), or accept it with "
            f"{variable}")


def hit_host(host):
    return host or "this node"


def normalised_table(text):
    """``nft --stateless list table`` -> its lines stripped of indentation and blanks (what two loads compare by)."""
    return "\n".join(line.strip() for line in (text or "").splitlines() if line.strip()) + ("\n" if text else "")


def table_decision(live, record, file_sha256, file_changed):
    """Whether the table must be loaded again, and why.

    live: the normalised live listing ('' when the table is absent); record: {sha256, listing} written right after
    the last load (None when missing). -> (reload, reason).
    """
    if file_changed:
        return True, "the file changed"
    if not live:
        return True, "the table is not loaded"
    if not record or record.get("sha256") != file_sha256:
        return True, "what the file loads is not recorded on this node"
    if record.get("listing") != live:
        return True, "the live rules differ from what the file loads"
    return False, "the live rules are what the file loads"
