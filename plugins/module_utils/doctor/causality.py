"""The causal order of the findings: which finding follows from which, node by node.

A matched signature's hits are split by node into instances (signature, node).
Two kinds of links join them, cause -> consequence:

- the catalog's ``explains`` (signature to signature), kept only between
  instances that share a node: on the same node, or one names the other's
  address (a probe of the head's port involves the head). Symptoms that any
  rank of the deployment can cause (``CLUSTER_WIDE_EFFECTS``: a placement group
  that cannot form, a collective that times out) take their causes from every node, and
  ``CLUSTER_WIDE_CAUSES`` (a Ray node short of GPUs) explain their effects on every node;
  a refused port (``TARGET_ONLY``) is about the node that refused, not the one that probed;
- ``RELATIONS``, the node-aware links the catalog cannot say: the head that
  cannot start explains the workers that cannot reach it, a link down on a node
  explains the blocked ports and missing peers that involve that node, a node
  that cannot be reached explains everything on it or involving it. They are
  data: the cause's signatures and where it must be (the head, any node), the
  consequences' signatures and where (the workers, the head, the nodes the cause
  involves), and what must hold of the evidence.

A node-aware link wins over a catalog link in the opposite direction (a worker
timing out on the head's port does not explain the head's crash when the head
is down); other cycles are cut at the instance ranked first. What is left is a
directed acyclic graph; its transitive reduction gives each consequence its
direct causes ("follows from"). Instances of one signature with the same causes
stay one finding; a signature whose instances follow from different findings is
split by node (the head's ``unit_failed`` and a worker's are then two findings).

The findings are then ranked: faults before warnings, the signature's priority,
lowered below every cause (``rank_priority``), the kinds of evidence, the nodes,
catalog order; and a finding never comes before one it follows from.

Pure Python 3.11, no Ansible import.
"""

from __future__ import annotations

from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import VLLM_UNIT

# The catalog's 'explains' may cross nodes for these consequences: any rank on any node can cause them.
CLUSTER_WIDE_EFFECTS = (
    "placement_group_unsatisfiable",
    "nccl_watchdog_timeout",
    "gloo_connect_failed",
    "api_unanswered_from_controller",
)

# Causes about a resource every node shares: a Ray node short of GPUs starves the placement group the head's vLLM
# asks for, so its 'explains' reach the findings of every node (vLLM's GPU-count warning on the head).
CLUSTER_WIDE_CAUSES = ("ray_gpus_below_plan",)

# Findings about the node a probe reached, not the node that probed: a refused port is the target's own state.
TARGET_ONLY = ("head_not_listening",)

# The service (vllm or ray) a cause stops when its hits do not name a unit or port.
CAUSE_SERVICES = {
    "ray_not_running": ("ray",),
    "ray_worker_stopped": ("ray",),
    "ray_version_mismatch": ("ray",),
    "node_unreachable": ("vllm", "ray"),
}

# Node-aware links. cause: the signatures ('ids'; 'startup_reasons': any startup signature that explains
# unit_failed, a reason a unit fails), where they must be ('on': head or any) and, for 'carries_fabric', that
# the link named is the node's fabric interface or its route to a peer. effects: signature id ('*': any) ->
# where the consequence must be ('on': workers = nodes other than the head, head, involved = on the cause's node
# or naming its address), the service it needs from the cause ('service'; else from its hits), and the kinds of
# evidence it may rest on ('evidence': only these; a probe that timed out is a blocked port, not a head down).
RELATIONS = (
    {
        "name": "head_down",
        "why": "the head ({node}) does not run {service}",
        "cause": {
            "ids": ("unit_failed", "vllm_unit_stopped", "deployment_unit_missing", "ray_not_running",
                    "ray_worker_stopped", "node_unreachable"),
            "startup_reasons": True,
            "on": "head",
        },
        "effects": {
            "head_not_listening": {"on": "workers"},
            "rendezvous_port_blocked": {"on": "workers", "evidence": ("log",)},
            "ray_node_missing": {"on": "workers", "service": "ray"},
            "ray_node_registration_failed": {"on": "workers", "service": "ray"},
            "api_unanswered_from_controller": {"on": "head", "service": "vllm"},
        },
    },
    {
        "name": "link_down",
        "why": "the link of {node}'s fabric path is down",
        "cause": {"ids": ("ib_port_down", "fabric_link_down"), "on": "any", "carries_fabric": True},
        "effects": {
            "rendezvous_port_blocked": {"on": "involved"},
            "ray_node_missing": {"on": "involved"},
            "gloo_connect_failed": {"on": "involved"},
            "nccl_watchdog_timeout": {"on": "involved"},
        },
    },
    {
        "name": "node_down",
        "why": "{node} cannot be reached",
        "cause": {"ids": ("node_unreachable",), "on": "any"},
        "effects": {"*": {"on": "involved"}},
    },
)


def relation_ids():
    """Every signature id RELATIONS names (tests check each is in the catalog)."""
    ids = set()
    for relation in RELATIONS:
        ids.update(relation["cause"]["ids"])
        ids.update(name for name in relation["effects"] if name != "*")
    ids.update(CLUSTER_WIDE_EFFECTS)
    ids.update(TARGET_ONLY)
    ids.update(CAUSE_SERVICES)
    return ids


class _Instance:
    """One signature's hits on one node (node None: the cluster as a whole)."""

    def __init__(self, order, sig, node, hits):
        self.order, self.sig, self.node, self.hits = order, sig, node, hits
        self.key = (sig["id"], node)
        self.kinds = {hit.get("kind") for hit in hits if hit.get("kind")}


def _is_local(address):
    return not address or address.startswith(("127.", "::1", "fe80:")) or address in ("::", "0.0.0.0", "*")


def _address_book(cluster):
    book = {}
    for node in cluster.nodes:
        for address in {node.plan.get("address")} | node.local_addresses():
            if address and not _is_local(address):
                book.setdefault(address, node.name)
    return book


def _involved(instance, book):
    """The nodes a finding's instance is about: its own node, and the nodes its hits address (a probe's target)."""
    targets = set()
    for hit in instance.hits:
        address = hit["values"].get("address")
        if isinstance(address, str) and address in book:
            targets.add(book[address])
    if instance.sig["id"] in TARGET_ONLY and targets:
        return targets
    return targets | ({instance.node} if instance.node else set())


def _ray_ports(cluster):
    return {port for name, port in (cluster.plan.get("ports") or {}).items() if name.startswith("ray")}


def _hit_services(cluster, hit):
    values = hit["values"]
    unit = values.get("unit")
    if isinstance(unit, str) and unit:
        return {"vllm"} if unit == VLLM_UNIT else {"ray"} if unit.startswith("ray-") else set()
    name = values.get("port_name")
    if isinstance(name, str) and name:
        return {"ray"} if name.startswith("ray") else {"vllm"}
    port = values.get("port")
    if port is not None and str(port).isdigit() and int(port) in _ray_ports(cluster):
        return {"ray"}
    source = hit.get("source") or ""
    if source.startswith("journal ray-"):
        return {"ray"}
    if source.startswith(f"journal {VLLM_UNIT}"):
        return {"vllm"}
    return set()


def _services(cluster, instance, default):
    found = set()
    for hit in instance.hits:
        found |= _hit_services(cluster, hit)
    return found or set(default)


def _link_carries_fabric(cluster, node, instance):
    """The link a link-down finding names is the node's fabric interface or its route to a peer."""
    devices = set()
    for hit in instance.hits:
        values = hit["values"]
        for key in ("interface", "ifname", "device", "netdev"):
            if isinstance(values.get(key), str):
                devices.add(values[key])
        hca = values.get("hca")
        if hca:
            for port in node.ib.get("ports") or []:
                if port.get("netdev") and hca in (port.get("name"), port.get("ca")):
                    devices.add(port["netdev"])
    path = {cluster.fabric_interface(node)} | set((node.gather.get("routes") or {}).values())
    return bool(devices & (path - {None}))


def _cause_matches(cluster, relation, instance, head):
    spec = relation["cause"]
    sig = instance.sig
    named = sig["id"] in spec["ids"] or (
        spec.get("startup_reasons") and sig["family"] == "startup" and "unit_failed" in sig["explains"]
    )
    if not named or instance.node is None:
        return False
    if spec["on"] == "head" and (head is None or instance.node != head.name):
        return False
    if spec.get("carries_fabric"):
        node = next((n for n in cluster.nodes if n.name == instance.node), None)
        if node is None or not _link_carries_fabric(cluster, node, instance):
            return False
    return True


def _effect_matches(cluster, relation, cause, effect, head, book):
    spec = relation["effects"].get(effect.sig["id"]) or relation["effects"].get("*")
    if spec is None or effect.key == cause.key or effect.sig["id"] == cause.sig["id"]:
        return False
    where = spec["on"]
    if where == "workers" and (effect.node is None or head is None or effect.node == head.name):
        return False
    if where == "head" and (head is None or effect.node != head.name):
        return False
    if where == "involved" and cause.node not in _involved(effect, book):
        return False
    if spec.get("evidence") and not effect.kinds <= set(spec["evidence"]):
        return False
    if relation["name"] == "head_down":
        needed = {spec["service"]} if spec.get("service") else _services(cluster, effect, ("vllm",))
        if not needed & _services(cluster, cause, CAUSE_SERVICES.get(cause.sig["id"], ("vllm",))):
            return False
    return True


def _why(relation, cluster, cause, head):
    services = _services(cluster, cause, CAUSE_SERVICES.get(cause.sig["id"], ("vllm",)))
    service = " and ".join(sorted({"vllm": "vLLM", "ray": "Ray"}[s] for s in services)) or "vLLM"
    return relation["why"].format(service=service, node=cause.node, head=head.name if head else "the head")


def _links(cluster, instances):
    """{effect key: {cause key: {'relation', 'why'}}}, before cycles are cut."""
    head = cluster.head
    book = _address_book(cluster)
    by_id = {}
    for instance in instances:
        by_id.setdefault(instance.sig["id"], []).append(instance)
    links = {}
    node_aware = set()
    for relation in RELATIONS:
        causes = [i for i in instances if _cause_matches(cluster, relation, i, head)]
        for cause in causes:
            for effect in instances:
                if _effect_matches(cluster, relation, cause, effect, head, book):
                    links.setdefault(effect.key, {}).setdefault(
                        cause.key, {"relation": relation["name"], "why": _why(relation, cluster, cause, head)})
                    node_aware.add((cause.key, effect.key))
    for cause in instances:
        for name in cause.sig["explains"]:
            for effect in by_id.get(name, []):
                if (effect.key, cause.key) in node_aware:
                    continue  # a node-aware link says the opposite: it wins
                shared = _involved(cause, book) & _involved(effect, book)
                if (cause.node is None or effect.node is None or name in CLUSTER_WIDE_EFFECTS
                        or cause.sig["id"] in CLUSTER_WIDE_CAUSES or shared):
                    links.setdefault(effect.key, {}).setdefault(
                        cause.key, {"relation": "catalog", "why": f"{cause.sig['id']} explains {name}"})
    return links


def _base_key(instance, node_rank):
    return (0 if instance.sig["severity"] == "fault" else 1, -instance.sig["priority"], instance.order,
            node_rank(instance.node))


def _acyclic(instances, links, node_rank):
    """Cut cycles: place instances cause first, best ranked first; a cycle loses the links into its best instance."""
    remaining = {i.key: i for i in instances}
    links = {effect: dict(causes) for effect, causes in links.items()}
    placed = []
    while remaining:
        free = [i for i in remaining.values() if not set(links.get(i.key, {})) & set(remaining)]
        pool = free or list(remaining.values())
        best = min(pool, key=lambda i: _base_key(i, node_rank))
        if not free:
            for cause in list(links.get(best.key, {})):
                if cause in remaining:
                    del links[best.key][cause]
        placed.append(best)
        del remaining[best.key]
    return placed, links


def _reduce(placed, links):
    """Transitive reduction: a cause reached through another cause is not a direct cause."""
    reach = {}
    for instance in placed:  # causes come first
        ancestors = set()
        for cause in links.get(instance.key, {}):
            ancestors |= {cause} | reach.get(cause, set())
        reach[instance.key] = ancestors
    direct = {}
    for instance in placed:
        causes = links.get(instance.key, {})
        direct[instance.key] = {
            cause: info for cause, info in causes.items()
            if not any(cause in reach.get(other, set()) for other in causes if other != cause)
        }
    return direct, reach


def causal_order(cluster, matched, node_rank):
    """Group the matched signatures' hits into findings in causal order.

    ``matched``: [(catalog order, signature, hits tagged with their 'kind', kinds)]; ``node_rank`` orders node
    names. Returns the findings as groups, ranked: [{order, sig, hits, nodes, kinds, rank_priority, follows_from,
    explains_findings}], where follows_from and explains_findings are [{id, node, rank}] (rank: the 1-based
    position of that finding in the list) and follows_from adds the relation and why.
    """
    node_rank = _none_last(node_rank)
    instances = []
    for order, sig, hits, _ in matched:
        by_node = {}
        for hit in hits:
            by_node.setdefault(hit["node"], []).append(hit)
        for node in sorted(by_node, key=node_rank):
            instances.append(_Instance(order, sig, node, by_node[node]))
    placed, links = _acyclic(instances, _links(cluster, instances), node_rank)
    direct, reach = _reduce(placed, links)

    # Instances of one signature with the same cause findings stay one finding.
    group_of = {}
    groups = {}
    for instance in placed:
        causes = frozenset(group_of[cause] for cause in direct[instance.key])
        gid = (instance.sig["id"], causes)
        group_of[instance.key] = gid
        groups.setdefault(gid, []).append(instance)
    found = []
    for gid, members in groups.items():
        members.sort(key=lambda i: node_rank(i.node))
        keys = {m.key for m in members}
        sig = members[0].sig
        nodes = [m.node for m in members if m.node]
        found.append({
            "gid": gid, "order": members[0].order, "sig": sig, "members": keys,
            "hits": [hit for hit in _ordered_hits(matched, sig["id"]) if (sig["id"], hit["node"]) in keys],
            "nodes": nodes,
            "kinds": set().union(*(m.kinds for m in members)),
            "causes": {gid_ for m in members for gid_ in (group_of[c] for c in direct[m.key])},
            "follows_from": [(cause, info) for m in members for cause, info in direct[m.key].items()],
            "explains": {key for key, ancestors in reach.items() if ancestors & keys},
        })
    by_gid = {group["gid"]: group for group in found}
    ranks = {}

    def rank(group, stack=()):
        if group["gid"] in ranks:
            return ranks[group["gid"]]
        value = group["sig"]["priority"]
        for cause in group["causes"]:
            if cause != group["gid"] and cause not in stack:
                value = min(value, rank(by_gid[cause], (*stack, group["gid"])) - 1)
        ranks[group["gid"]] = value
        return value

    for group in found:
        group["rank_priority"] = rank(group)

    def key(group):
        return (0 if group["sig"]["severity"] == "fault" else 1, -group["rank_priority"], -len(group["kinds"]),
                -len(group["nodes"]), group["order"])

    ordered = []
    remaining = {group["gid"]: group for group in found}
    while remaining:
        free = [g for g in remaining.values() if not (g["causes"] - {g["gid"]}) & set(remaining)]
        best = min(free or list(remaining.values()), key=key)
        ordered.append(best)
        del remaining[best["gid"]]
    position = {group["gid"]: number for number, group in enumerate(ordered, start=1)}

    def ref(instance_key):
        return {"id": instance_key[0], "node": instance_key[1], "rank": position[group_of[instance_key]]}

    for group in ordered:
        follows = []
        for cause, info in group.pop("follows_from"):
            entry = {**ref(cause), "relation": info["relation"], "why": info["why"]}
            if entry not in follows:
                follows.append(entry)
        group["follows_from"] = sorted(follows, key=lambda r: (r["rank"], node_rank(r["node"])))
        explained = [ref(k) for k in group.pop("explains") if group_of[k] != group["gid"]]
        group["explains_findings"] = sorted(explained, key=lambda r: (r["rank"], node_rank(r["node"])))
        for name in ("gid", "members", "causes"):
            del group[name]
    return ordered


def _none_last(node_rank):
    """node_rank that also takes None (a cluster-wide hit), after every node."""
    return lambda name: (1,) if name is None else (0, *node_rank(name))


def _ordered_hits(matched, sig_id):
    for _, sig, hits, _ in matched:
        if sig["id"] == sig_id:
            return hits
    return []
