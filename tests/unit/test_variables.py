"""plan/variables.py and filter variable_problems: unknown variables and variables that differ between hosts.

The known names come from specs (request.py's INPUTS, the roles' meta/argument_specs.yml, meta/variables.yml),
so a variable that a playbook or role reads without a spec fails here, not in an operator's run.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml
from ansible_collections.vllm_ops.cluster.plugins.filter.variable_problems import (
    variable_problems as the_filter,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.request import VARIABLES
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.variables import (
    COLLECTION_SPEC,
    checked_prefixes,
    known_variables,
    suggestions,
    variable_problems,
)

REPO = Path(__file__).resolve().parents[2]
KNOWN = known_variables(REPO)
GPUS = {"count": 8, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "nvlink": True}
# Where the project reads or sets its variables (docs and tests name made-up ones on purpose).
READERS = ("playbooks", "roles", "inventories", "lab", "molecule", "deploy.yml")


def problems(host_vars, **kwargs):
    return variable_problems(host_vars, REPO, **kwargs)


def node(**variables):
    return {"ansible_host": "192.0.2.10", "inventory_hostname": "x", "vllm_cluster_gpus": GPUS, **variables}


# --- unknown names ---------------------------------------------------------------------------------------


def test_a_misspelled_variable_is_named_with_its_host_value_and_a_suggestion():
    assert problems({"gpu-a": node(vllm_cluster_tensor_parallel=2)}) == [
        "host gpu-a: vllm_cluster_tensor_parallel=2 is not a variable of vllm-cluster; did you mean vllm_cluster_tp?"]
    found = problems({"gpu-a": node(vllm_cluster_max_model_length=4096)})
    assert len(found) == 1
    assert found[0].startswith("host gpu-a: vllm_cluster_max_model_length=4096 is not a variable of vllm-cluster; "
                               "did you mean vllm_cluster_max_model_len")


@pytest.mark.parametrize(("typo", "meant"), [
    ("vllm_cluster_pipeline_parallel_size", "vllm_cluster_pp"),
    ("vllm_cluster_data_parallel", "vllm_cluster_dp"),
    ("vllm_cluster_gpu_mem_utilization", "vllm_cluster_gpu_memory_utilization"),
    ("vllm_cluster_modle", "vllm_cluster_model"),
    ("vllm_cluster_gpu", "vllm_cluster_gpus"),
    ("vllm_cluster_fabric_iface", "vllm_cluster_fabric_interface"),
    ("vllm_cluster_kv_cache_type", "vllm_cluster_kv_cache_dtype"),
])
def test_the_suggestion_is_the_variable_meant_first(typo, meant):
    assert suggestions(typo, KNOWN, "vllm_cluster_")[0] == meant


def test_a_group_variable_misspelled_is_one_line_for_all_its_hosts():
    found = problems({host: node(vllm_cluster_backnd="ray") for host in ("gpu-a", "gpu-b", "gpu-c")})
    assert found == ["hosts gpu-a, gpu-b, gpu-c: vllm_cluster_backnd='ray' is not a variable of vllm-cluster; "
                     "did you mean vllm_cluster_backend?"]


def test_a_role_variable_is_checked_against_its_roles_spec():
    found = problems({"gpu-a": node(vllm_service_startup_timeout_s=1800, node_firewall_api_allowed_cidr=["10.0.0.0/8"])})
    assert found[0] == ("host gpu-a: node_firewall_api_allowed_cidr=['10.0.0.0/8'] is not a variable of role "
                        "node_firewall; did you mean node_firewall_api_allowed_cidrs?")
    assert found[1].startswith("host gpu-a: vllm_service_startup_timeout_s=1800 is not a variable of role vllm_service; "
                               "did you mean vllm_service_start_timeout_s")
    nothing_close = problems({"gpu-a": node(doctor_colour="red")})
    assert nothing_close == ["host gpu-a: doctor_colour='red' is not a variable of role doctor; the known ones are in "
                             "roles/doctor/meta/argument_specs.yml (ansible-doc -t role vllm_ops.cluster.doctor)"]


def test_known_variables_internal_names_and_other_names_pass():
    assert problems({"gpu-a": node(
        vllm_cluster_tp=2, vllm_cluster_model="llama-3.1-8b", vllm_cluster_api_key="k",      # planner, meta/variables.yml
        vllm_service_start_timeout_s=1800, node_firewall_api_allowed_cidrs=["10.0.0.0/8"],  # role options
        doctor_checklist_fail_on_fail=True,                                                # a second entry point's
        vllm_runtime_versions={"vllm": "0.32.0"},                                          # a fact the role sets
        _vllm_cluster_scratch=1, __vllm_cluster_hosts=["gpu-a"], __vllm_service_state={},  # internal
        ansible_port=22, lab_repository="/srv", vllm_gpu={}, groups={}, omit="x")}) == []


def test_a_secret_value_is_never_shown():
    found = problems({"gpu-a": node(vllm_cluster_api_kye="s3cr3t", vllm_cluster_hf_token="hf_abc")})
    assert len(found) == 2 and not any("s3cr3t" in line or "hf_abc" in line for line in found)
    assert "vllm_cluster_api_kye=<hidden> is not a variable of vllm-cluster; did you mean vllm_cluster_api_key?" in found[0]


def test_the_value_is_shown_short():
    found = problems({"gpu-a": node(vllm_cluster_tensor_parallel=list(range(100)))})
    assert "vllm_cluster_tensor_parallel=[0, 1, 2" in found[0] and "...  is not" not in found[0]
    assert len(found[0]) < 200


# --- values that differ between the hosts of a deployment ------------------------------------------------------


def test_a_planning_variable_that_differs_between_hosts_is_an_error_naming_hosts_and_values():
    found = problems({"gpu-a": node(vllm_cluster_max_model_len=8192), "gpu-b": node(vllm_cluster_max_model_len=4096)})
    assert found == ["vllm_cluster_max_model_len differs between the hosts of deployment vllm: gpu-a=8192, "
                     "gpu-b=4096; set it for the group (group_vars), not per host (the plan reads the head's value "
                     "alone)"]


def test_set_on_one_host_only_is_a_difference_too_and_the_deployment_is_named():
    found = problems({"gpu-a": node(vllm_cluster_deployment="llama"), "gpu-b": node(vllm_cluster_deployment="llama"),
                      "gpu-c": node(vllm_cluster_deployment="llama", vllm_cluster_tp=4)})
    assert found == ["vllm_cluster_tp differs between the hosts of deployment llama: gpu-a, gpu-b=(not set), "
                     "gpu-c=4; set it for the group (group_vars), not per host (the plan reads the head's value alone)"]


def test_every_planning_variable_is_compared():
    for variable in VARIABLES:
        found = problems({"gpu-a": node(**{variable: 1}), "gpu-b": node(**{variable: 2})})
        assert len(found) == 1 and found[0].startswith(f"{variable} differs between"), variable


def test_per_host_variables_and_facts_may_differ():
    a = node(vllm_cluster_fabric_address="10.0.0.1", vllm_cluster_fabric_interface="eth1",
             vllm_cluster_ib_hcas=["mlx5_0"], vllm_cluster_stage_digest="d1", vllm_service_user="vllm")
    b = node(vllm_cluster_fabric_address="10.0.0.2", vllm_cluster_fabric_interface="ens1f0",
             vllm_cluster_gpus=dict(GPUS, count=4), vllm_cluster_stage_digest="d2", vllm_service_user="svc")
    assert problems({"gpu-a": a, "gpu-b": b}) == []


def test_a_differing_secret_names_the_hosts_not_the_values():
    found = problems({"gpu-a": node(vllm_cluster_api_key="one"), "gpu-b": node(vllm_cluster_api_key="two"),
                      "gpu-c": node()})
    assert found == ["vllm_cluster_api_key differs between the hosts of deployment vllm: gpu-a=<hidden value 1>, "
                     "gpu-b=<hidden value 2>, gpu-c=(not set); set it for the group (group_vars), not per host "
                     "(every host must have the same value)"]


def test_the_exemption_is_read_from_the_spec(tmp_path):
    """per_host comes from meta/variables.yml: take it away from vllm_cluster_fabric_address and it is compared."""
    for spec in [COLLECTION_SPEC, *(str(p.relative_to(REPO)) for p in REPO.glob("roles/*/meta/argument_specs.yml"))]:
        (tmp_path / spec).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / spec, tmp_path / spec)
    hosts = {"gpu-a": node(vllm_cluster_fabric_address="10.0.0.1"), "gpu-b": node(vllm_cluster_fabric_address="10.0.0.2")}
    assert variable_problems(hosts, tmp_path) == []
    spec = yaml.safe_load((tmp_path / COLLECTION_SPEC).read_text())
    del spec["variables"]["vllm_cluster_fabric_address"]["per_host"]
    (tmp_path / COLLECTION_SPEC).write_text(yaml.safe_dump(spec))
    assert variable_problems(hosts, tmp_path) == [
        "vllm_cluster_fabric_address differs between the hosts of deployment vllm: gpu-a='10.0.0.1', "
        "gpu-b='10.0.0.2'; set it for the group (group_vars), not per host (every host must have the same value)"]
    # And a new option in a role's spec is known at once.
    role_spec = tmp_path / "roles/vllm_verify/meta/argument_specs.yml"
    data = yaml.safe_load(role_spec.read_text())
    data["argument_specs"]["main"]["options"]["vllm_verify_brand_new"] = {"type": "int", "description": "new"}
    role_spec.write_text(yaml.safe_dump(data))
    assert variable_problems({"gpu-a": node(vllm_verify_brand_new=1)}, tmp_path) == []


# --- the known list is the specs' -----------------------------------------------------------------------------


def test_the_known_list_is_every_spec():
    assert set(VARIABLES) <= set(KNOWN)
    for path in REPO.glob("roles/*/meta/argument_specs.yml"):
        for entry_point in yaml.safe_load(path.read_text())["argument_specs"].values():
            assert set(entry_point.get("options") or {}) <= set(KNOWN), path
    collection = yaml.safe_load((REPO / COLLECTION_SPEC).read_text())["variables"]
    assert set(collection) <= set(KNOWN)
    roles = {p.parents[1].name for p in REPO.glob("roles/*/meta/argument_specs.yml")}
    assert set(checked_prefixes(REPO)) == {"vllm_cluster_"} | {f"{role}_" for role in roles}
    assert len(roles) >= 9 and len(KNOWN) > 200


def test_meta_variables_documents_each_variable_once():
    collection = yaml.safe_load((REPO / COLLECTION_SPEC).read_text())["variables"]
    options = {name for path in REPO.glob("roles/*/meta/argument_specs.yml")
               for entry in yaml.safe_load(path.read_text())["argument_specs"].values()
               for name in entry.get("options") or {}}
    for name, entry in collection.items():
        assert name.startswith("vllm_cluster_"), name
        assert entry.get("description") and entry.get("type"), name
        assert set(entry) <= {"description", "type", "per_host", "set_by", "no_log"}, name
        assert name not in VARIABLES and name not in options, f"{name} is declared twice"
    # The inventory's own ones are in docs/architecture.md's table (the facts the playbooks set are not inputs).
    text = (REPO / "docs" / "architecture.md").read_text()
    table = text[text.index("## Inventory interface"): text.index("## Facts")]
    undocumented = [name for name, entry in collection.items() if not entry.get("set_by") and f"`{name}`" not in table]
    assert not undocumented, f"docs/architecture.md's inventory table lacks {undocumented}"


def _read_in_the_tree(pattern):
    found = {}
    for top in READERS:
        path = REPO / top
        for file in [path] if path.is_file() else path.rglob("*"):
            if file.is_file() and "__pycache__" not in file.parts and file.suffix in ("", ".yml", ".yaml", ".j2", ".py",
                                                                                       ".sh", ".cfg", ".md"):
                for name in pattern.findall(file.read_text(errors="replace")):
                    found.setdefault(name, set()).add(str(file.relative_to(REPO)))
    return found


def test_every_vllm_cluster_variable_the_project_reads_has_a_spec():
    """A new vllm_cluster_* variable needs a home: a planner input, a role option or meta/variables.yml."""
    read = _read_in_the_tree(re.compile(r"(?<![\w])(vllm_cluster_[a-z0-9_]*[a-z0-9])\b"))
    assert {"vllm_cluster_tp", "vllm_cluster_gpus", "vllm_cluster_full_run", "vllm_cluster_plan"} <= set(read)
    specs = {name for name, known in KNOWN.items() if known.source.endswith((".yml", "request.py"))}
    missing = {name: sorted(files) for name, files in read.items() if name not in specs}
    assert not missing, f"vllm_cluster_* variables without a spec (add them to {COLLECTION_SPEC}): {missing}"


def test_every_variable_a_shipped_inventory_sets_is_known():
    inventories = [p for p in (REPO / "inventories").iterdir() if p.is_dir()]
    inventories += [p for p in (REPO / "inventories" / "examples").iterdir() if p.is_dir()]
    checked = 0
    for inventory in inventories:
        for file in sorted(inventory.glob("*_vars/*.yml")) + sorted(inventory.glob("hosts.yml")):
            data = yaml.safe_load(file.read_text()) or {}
            if file.name == "hosts.yml":
                group = data["all"]["children"]["vllm_nodes"]
                # A fleet's vllm_nodes has one child group per deployment (inventories/examples/fleet-two-models).
                groups = [group, *(group.get("children") or {}).values()]
                tables = [table for one in groups
                          for table in (one.get("vars") or {}, *(one.get("hosts") or {}).values())]
            else:
                tables = [data]
            for table in tables:
                checked += 1
                assert problems({"gpu-a": table}) == [], file
    assert checked >= 12


# --- the filter ------------------------------------------------------------------------------------------------


class LazyVars(Mapping):
    """Like hostvars[host]: values are templated when read, and a broken template raises then."""

    def __init__(self, values):
        self.values = values

    def __getitem__(self, name):
        value = self.values[name]
        if value == "{{ undefined }}":
            raise KeyError("'undefined' is undefined")
        return value

    def __iter__(self):
        return iter(self.values)

    def __len__(self):
        return len(self.values)


def test_the_filter_reads_only_our_names_and_reports_a_broken_template():
    model = {"vllm_cluster_model": "llama-3.1-8b"}
    hosts = {"gpu-a": LazyVars({"ansible_host": "{{ undefined }}", "vllm_cluster_tp": 2, **model,
                                "vllm_cluster_max_model_lenght": "{{ undefined }}"}),
             "gpu-b": LazyVars({"vllm_cluster_tp": 2, **model})}
    found = the_filter(hosts)
    assert found == ["host gpu-a: vllm_cluster_max_model_lenght=<cannot read it: \"'undefined' is undefined\"> is not a "
                     "variable of vllm-cluster; did you mean vllm_cluster_max_model_len?"]
    assert the_filter({"gpu-a": LazyVars({"vllm_cluster_tp": 2, **model})}, "named") == []
    # A hub source stands for the model: plan.yml reads its commit's config.json.
    hub = {"vllm_runtime_model_source": "hub:org/name@" + "a" * 40}
    assert the_filter({"gpu-a": LazyVars(hub)}, "named") == []
    # The filter adds the checks that need more than the specs' names: a planner input's kind, a role's spec (Ansible's
    # validator), the model, and with api_key the key.
    assert the_filter({"gpu-a": LazyVars({"vllm_cluster_tp": "two", "vllm_verify_fail": "maybe"})}, api_key=True) == [
        "host gpu-a: vllm_cluster_model is not set: expected the model to serve, a catalog name, a hub id or a path on "
        "the controller, set for the deployment's group (or vllm_runtime_model_source: hub:<org>/<name>@<commit>, "
        "whose config.json plan.yml reads)",
        "host gpu-a: vllm_cluster_tp='two': expected an integer (a planner input, plugins/module_utils/plan/request.py)",
        "host gpu-a: vllm_verify_fail='maybe': expected true or false "
        "(role vllm_verify, roles/vllm_verify/meta/argument_specs.yml)",
        "host gpu-a: vllm_cluster_api_key is not set (or empty): expected the API key vLLM requires on /v1; set it for "
        "the deployment's group from Ansible Vault or an environment lookup (inventories/prod.example/group_vars/"
        "vllm_nodes.yml shows both); to serve without a key (UNSAFE: anyone who reaches the API port can use it) set "
        "vllm_service_allow_no_api_key: true"]


def test_the_known_names_are_kept_between_runs_and_read_again_when_a_file_changes(tmp_path, monkeypatch):
    """Each task of a playbook is a new process: the names parsed once are kept in the user's cache, keyed by
    every read file's path, mtime and size. A role that gains a variable must be known at once."""
    from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import variables as declared

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "collection"
    shutil.copytree(REPO / "meta", root / "meta")
    shutil.copytree(REPO / "roles" / "vllm_verify", root / "roles" / "vllm_verify")
    declared._known_read.cache_clear()
    assert "vllm_verify_client_timeout_s" in known_variables(root)
    kept = list((tmp_path / "cache" / "vllm-cluster").glob("known-variables-*.json"))
    assert len(kept) == 1
    declared._known_read.cache_clear()
    parsed = []
    monkeypatch.setattr(declared, "_known_parse", lambda *args: parsed.append(args) or ({}, {}))
    assert known_variables(root) == known_variables(root) and "vllm_verify_client_timeout_s" in known_variables(root)
    assert parsed == []  # read from the cache, not parsed
    spec = root / "roles" / "vllm_verify" / "meta" / "argument_specs.yml"
    spec.write_text(spec.read_text() + "\n")  # a changed file: parsed again
    declared._known_read.cache_clear()
    known_variables(root)
    assert len(parsed) == 1
    declared._known_read.cache_clear()
