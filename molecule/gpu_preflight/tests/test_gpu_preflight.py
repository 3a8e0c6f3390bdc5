"""After gpu_preflight passed: each node, read with nvidia-smi itself, is what the role accepted.

testinfra over SSH (the lab's inventory); every test runs once per node.
"""

from __future__ import annotations

FIELDS = "name,driver_version,memory.total,persistence_mode,mig.mode.current"


def gpu_rows(host) -> list[list[str]]:
    out = host.check_output(f"nvidia-smi --query-gpu={FIELDS} --format=csv,noheader,nounits")
    return [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line.strip()]


def test_every_gpu_is_in_persistence_mode_and_not_in_mig_mode(host):
    rows = gpu_rows(host)
    assert rows, "nvidia-smi lists no GPU"
    assert {row[3] for row in rows} == {"Enabled"}
    assert {row[4] for row in rows} == {"Disabled"}


def test_no_process_holds_a_gpu(host):
    out = host.check_output("nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader")
    assert out.strip() == ""


def test_the_node_matches_the_first_node(host):
    """Parity, seen from this node: same model, driver, memory and count as node1."""
    import testinfra  # the plugin's own module: a second host of the same inventory

    reference = testinfra.get_host("ansible://node1", ansible_inventory=host.backend.ansible_inventory)
    mine, theirs = gpu_rows(host), gpu_rows(reference)
    assert len(mine) == len(theirs)
    assert {tuple(row[:3]) for row in mine} == {tuple(row[:3]) for row in theirs}


def test_the_nvswitch_fabric_is_registered_on_every_gpu(host):
    xml = host.check_output("nvidia-smi -q -x")
    assert xml.count("<fabric>") == len(gpu_rows(host))
    assert xml.count("<state>Completed</state>") == xml.count("<fabric>")
