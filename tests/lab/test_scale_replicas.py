"""Removing and adding a replica behind the router leaves the other replicas serving (runbooks drain-node.md and
add-replica.md, issue 18).

test_router.py's front: three independent TP=1 replicas of the lab's tiny Llama (node1, node2, node3) behind
vllm-router on node1, as test_router hands it on in a run (conftest FRONT_MODULES), or deployed here when this
module runs alone (deploy.yml and router.yml, both idempotent). First the drain: the project's module
`router_worker`, run ad hoc on the router host as the runbook says, takes node3 out of the router (node1 and node2
serve every request after it), `systemctl stop` ends it, teardown.yml --limit node3 removes it and deploy.yml with
node3 out of the group changes nothing on node1 and node2 (same MainPID). Then node3 joins the group again and
`vllm_cluster_dp` goes back to 3: deploy.yml starts vLLM on node3 only (node1's and node2's vLLM keep their
process: same MainPID, same NRestarts), `router_worker state=present` puts node3 into the router, which then sends
it requests. The last test hands the front on, or leaves the lab as test_deploy leaves it (test_router.leave_front).

What could make it fail: vllm_service stopping every server of a deployment when one is added or removed (what it
did before), a router that does not take or drop a worker, a new server the router never sends to.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml
from conftest import CONTROLLER_BIN
from test_router import (
    LIST_WORKERS,
    REPLICAS,
    REPO,
    ROUTER_HOST,
    ROUTER_PORT,
    front_inventory,
    leave_front,
    openai_through_router,
    play,
)
from test_router import processed as router_processed

# Outside CI's time budget (265 s in a clean-clone CI run): scripts/test --extended runs it (docs/lab.md).
pytestmark = [pytest.mark.lab, pytest.mark.lab_extended, pytest.mark.timeout(3600)]

FIRST, ADDED = ("node1", "node2"), "node3"  # node3 is drained, then added again


def set_replicas(inventory, hosts, members):
    """The group replicas holds `hosts`, and vllm_cluster_dp is their number."""
    listing = yaml.safe_load((inventory / "hosts.yml").read_text())
    listing["all"]["children"]["vllm_nodes"]["children"]["replicas"]["hosts"] = {h: members[h] for h in hosts}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(listing, sort_keys=False))
    group_vars = inventory / "group_vars" / "replicas.yml"
    values = yaml.safe_load(group_vars.read_text())
    values["vllm_cluster_dp"] = len(hosts)
    group_vars.write_text(yaml.safe_dump(values))


@pytest.fixture(scope="module")
def front(shared_lab, tiny_model, tmp_path_factory):
    """The three replicas and the router: as handed on (both playbooks change nothing then), or deployed here."""
    lab, inventory = front_inventory(shared_lab, tmp_path_factory)
    listing = yaml.safe_load((inventory / "hosts.yml").read_text())
    members = dict(listing["all"]["children"]["vllm_nodes"]["children"]["replicas"]["hosts"])
    play((lab, inventory), "deploy.yml")
    play((lab, inventory), "playbooks/router.yml")
    assert f"{lab.fabric_address(ADDED)}:8000" in listed(lab)
    return lab, inventory, members


def process(lab, node):
    shown = lab.ssh(node, "systemctl show -p MainPID,NRestarts,ActiveState vllm.service").stdout
    return dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)


def router_worker(lab, inventory, node, state):
    """The runbook's command: the project's module router_worker, ad hoc on the router host."""
    url = f"http://{lab.fabric_address(node)}:8000"
    argv = [str(CONTROLLER_BIN / "ansible"), ROUTER_HOST, "-i", str(inventory), "-m", "vllm_ops.cluster.router_worker",
            "-a", f"router_url=http://127.0.0.1:{ROUTER_PORT} worker_url={url} state={state}"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO, env=lab.ansible_env(),
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return url


def listed(lab):
    return lab.ssh(ROUTER_HOST, LIST_WORKERS).stdout


def test_a_drained_replica_leaves_the_router_and_is_removed_while_the_others_serve(front):
    lab, inventory, members = front
    before = {node: process(lab, node) for node in FIRST}
    assert all(p["ActiveState"] == "active" for p in before.values()), before
    url = router_worker(lab, inventory, ADDED, "absent")
    assert url not in listed(lab)
    counted = router_processed(lab).get(url, 0.0)
    openai_through_router(lab, 6)
    assert router_processed(lab).get(url, 0.0) == counted  # nothing more for the drained replica
    lab.ssh(ADDED, "systemctl stop vllm.service")
    play((lab, inventory), "playbooks/teardown.yml", "--limit", ADDED)
    set_replicas(inventory, FIRST, members)
    out = play((lab, inventory), "deploy.yml").stdout
    assert {node: process(lab, node) for node in FIRST} == before, out[-3000:]
    assert lab.ssh(ADDED, "systemctl is-active vllm.service", check=False).stdout.strip() != "active"
    assert openai_through_router(lab, 4)


def test_two_replicas_on_cores_of_their_own_answer_one_request_after_another_without_a_stall(front):
    """node1 and node2 serve behind the router (round_robin); the lab's nodes share the host's cores, and
    vllm_cluster_cpu_core_ids binds each node's CPU worker to its own. A vLLM CPU worker busy-waits on its queue
    for a second after each step: two bound to one core stall each other, and every other request waited 0.7-1 s
    (measured: 43 of 60 requests over 0.5 s with both on core 0, none with one core each). What could make it
    fail: the plan binding both to one core, a router that holds requests."""
    lab, _, _ = front
    assert len(os.sched_getaffinity(0)) >= 2, "the lab host needs two cores for two replicas on cores of their own"
    binds = {node: lab.ssh(node, "grep ^VLLM_CPU_OMP_THREADS_BIND= /etc/vllm-cluster/vllm.env").stdout.strip()
             for node in FIRST}
    assert len(set(binds.values())) == len(FIRST), binds
    done = openai_through_router(lab, 30)
    assert [d["tokens"] for d in done] == [4] * 30
    slow = [round(d["seconds"], 2) for d in done if d["seconds"] > 0.5]
    assert not slow, f"{len(slow)} of 30 requests took over 0.5 s: {slow}"


def test_a_replica_added_starts_alone_and_joins_the_router(front):
    lab, inventory, members = front
    before = {node: process(lab, node) for node in FIRST}
    assert all(p["ActiveState"] == "active" for p in before.values()), before
    assert f"{lab.fabric_address(ADDED)}:8000" not in listed(lab)

    set_replicas(inventory, (*FIRST, ADDED), members)
    out = play((lab, inventory), "deploy.yml").stdout
    after = {node: process(lab, node) for node in FIRST}
    assert after == before, f"deploy.yml restarted a running replica to add {ADDED}: {before} -> {after}"
    assert process(lab, ADDED)["ActiveState"] == "active"
    assert "independent servers: the others keep serving" in out

    url = router_worker(lab, inventory, ADDED, "present")
    assert url in listed(lab)
    counted = router_processed(lab).get(url, 0.0)
    openai_through_router(lab, 9)  # round_robin: every third request goes to the new replica
    assert router_processed(lab).get(url, 0.0) - counted >= 1, router_processed(lab)


def test_the_front_is_handed_on_or_the_lab_is_left_as_test_deploy_leaves_it(front, request):
    """node3 is back: the front as test_router handed it on (test_router.leave_front)."""
    lab, inventory, _ = front
    assert tuple(sorted(yaml.safe_load((inventory / "hosts.yml").read_text())["all"]["children"]["vllm_nodes"]
                        ["children"]["replicas"]["hosts"])) == REPLICAS
    leave_front((lab, inventory), request)
