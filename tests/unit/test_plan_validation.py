"""deploy.yml refuses, in plan.yml's first play on the controller, what a role or the vllm stage would refuse later.

Each run is the real `ansible-playbook deploy.yml` with Ansible's default output, against a temporary inventory
whose nodes declare their GPUs (planning contacts none) and whose addresses are loopback ones on a closed port:
a task on a node would end UNREACHABLE at once. A refusal must name the host, the variable, the value and what
was expected, be printed once, and show no Ansible internals or Python type names.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.arguments import (
    _plain,
    api_key_problems,
    argument_problems,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.checks import PlanError
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.inputs import check_cluster
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.variables import unreadable

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
GPUS = {"count": 8, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "nvlink": True}
CHECK = "TASK [Check the variables of every deployment and host (variable_problems)]"
# Words of Ansible's own error wording and of Python's types that a refusal must not show.
INTERNALS = ("_Ansible", "Tagged", "<class", "NoneType", "is of type", "we were unable to convert",
             "Finalization of task args", "filter plugin", "Traceback")

# One wrongly typed variable of every role that has an argument spec: (host, variable, value, expected).
PLANTS = {
    "doctor": ("node1", "doctor_command_timeout", "soon", "an integer"),
    "gpu_preflight": ("node2", "gpu_preflight_require_gpus", "maybe", "true or false"),
    "nccl_network": ("node1", "nccl_network_probe_backend", "mpi", "one of nccl, gloo"),
    "node_firewall": ("node2", "node_firewall_ephemeral_range", ["low", "high"], "a list of integers"),
    "ray_cluster": ("node1", "ray_cluster_restart_sec", "ten", "an integer"),
    "vllm_benchmark": ("node2", "vllm_benchmark_fail_on", "always", "one of none, fail, warn"),
    "vllm_monitoring": ("node1", "vllm_monitoring_port", "http", "an integer"),
    "vllm_router": ("node2", "vllm_router_policy", "fastest",
                    "one of random, round_robin, cache_aware, kv_aware, power_of_two, consistent_hash, "
                    "sticky_least_loaded"),
    "vllm_runtime": ("node1", "vllm_runtime_device", "gpu", "one of cuda, cpu"),
    "vllm_service": ("node2", "vllm_service_start_timeout_s", "soon", "an integer"),
    "vllm_verify": ("node1", "vllm_verify_fail", "maybe", "true or false"),
}


def closed_port():
    """A loopback port nothing listens on: ssh to it is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def inventory(tmp_path, group=None, hosts=None):
    port = closed_port()
    nodes = {"node1": {"ansible_host": "127.0.0.1"}, "node2": {"ansible_host": "127.0.0.2"}}
    for name, extra in (hosts or {}).items():
        nodes[name].update(extra)
    variables = {"vllm_cluster_model": "llama-3.1-8b", "vllm_cluster_gpus": GPUS, "ansible_port": port,
                 "ansible_user": "nobody", **(group or {})}
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"children": {"vllm_nodes": {"hosts": nodes, "vars": variables}}}}))
    return path


def deploy(tmp_path, path, *extra):
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
               ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_TIMEOUT="5",
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"),
               ANSIBLE_SSH_CONTROL_PATH_DIR=str(tmp_path / "cp"), ANSIBLE_HOST_KEY_CHECKING="False")
    result = subprocess.run([str(ANSIBLE_PLAYBOOK), str(REPO / "deploy.yml"), "-i", str(path), *extra],
                            capture_output=True, text=True, timeout=180, cwd=REPO, env=env, check=False)
    return result, result.stdout + result.stderr


def refused_before_any_node(result, output):
    """The run failed in plan.yml's variable check, and no play after it started, nor any task on a node."""
    assert result.returncode != 0, output[-3000:]
    assert CHECK in output, output[-3000:]
    assert "PLAY [Gather GPU facts on the nodes that do not declare them]" not in output, output[-3000:]
    assert "UNREACHABLE" not in output and "unreachable=1" not in output, output[-3000:]
    recap = output[output.index("PLAY RECAP"):]
    assert re.findall(r"^(\S+)\s+:", recap, re.M) == ["localhost"], recap
    for word in INTERNALS:
        assert word not in output, (word, output[-3000:])


def show(value):
    """How a refusal shows a plant: YAML's flow style, strings in single quotes (["low"] is ['low'])."""
    return f"'{value}'" if isinstance(value, str) else str(value)


def test_a_wrongly_typed_variable_of_every_role_is_refused_before_any_node_is_contacted(tmp_path):
    roles = {path.parents[1].name for path in REPO.glob("roles/*/meta/argument_specs.yml")}
    assert set(PLANTS) == roles, "every role with an argument spec has a plant here"
    hosts = {"node1": {}, "node2": {}}
    for host, name, value, _expected in PLANTS.values():
        hosts[host][name] = value
    path = inventory(tmp_path, {"vllm_cluster_api_key": "k3y"}, hosts)
    result, output = deploy(tmp_path, path)
    refused_before_any_node(result, output)
    for role, (host, name, value, expected) in PLANTS.items():
        line = (f"host {host}: {name}={show(value)}: expected {expected} "
                f"(role {role}, roles/{role}/meta/argument_specs.yml)")
        assert output.count(line) == 1, (line, output[-4000:])
    assert output.count("expected") == len(PLANTS), output[-4000:]
    assert "plan.yml refused the variables of deployment vllm (printed above, one line each); no node was contacted" \
        in output


def test_a_missing_api_key_is_refused_before_any_node_is_contacted(tmp_path):
    result, output = deploy(tmp_path, inventory(tmp_path))
    refused_before_any_node(result, output)
    line = ("hosts node1, node2: vllm_cluster_api_key is not set (or empty): expected the API key vLLM requires on /v1; "
            "set it for the deployment's group from Ansible Vault or an environment lookup")
    assert output.count(line) == 1, output[-3000:]
    assert output.count("vllm_service_allow_no_api_key: true") == 1


def test_an_unreadable_api_key_and_a_planner_input_are_refused_once(tmp_path):
    missing = tmp_path / "secrets" / "vllm-api-key"
    lookup = "{{ lookup('ansible.builtin.file', '" + str(missing) + "') }}"
    result, output = deploy(tmp_path, inventory(tmp_path, {"vllm_cluster_api_key": lookup, "vllm_cluster_tp": "two"}))
    refused_before_any_node(result, output)
    assert output.count("hosts node1, node2: vllm_cluster_tp='two': expected an integer (a planner input, "
                        "plugins/module_utils/plan/request.py)") == 1, output[-3000:]
    assert output.count("hosts node1, node2: vllm_cluster_api_key=<cannot read it: ") == 1, output[-3000:]
    assert str(missing) in output


def test_valid_variables_quoted_numbers_and_a_key_from_a_lookup_pass_the_check_and_reach_the_nodes(tmp_path):
    """The control: the same inventory, right, passes the check; the run then goes on to the (unreachable) nodes.

    Quoted integers and booleans are what Ansible's validator and the planner read them as.
    """
    key = tmp_path / "secrets" / "vllm-api-key"
    key.parent.mkdir()
    key.write_text("k3y-from-a-file\n")
    group = {"vllm_cluster_api_key": "{{ lookup('ansible.builtin.file', '" + str(key) + "') }}",
             "vllm_cluster_tp": "2", "vllm_service_start_timeout_s": "900", "vllm_verify_fail": "yes",
             "vllm_cluster_gpus": dict(GPUS, count="8", memory_total_mib="81559")}
    result, output = deploy(tmp_path, inventory(tmp_path, group))
    assert result.returncode != 0
    assert "plan.yml refused" not in output and "expected" not in output, output[-3000:]
    assert "TP=2" in output  # the layout table: "2" planned as 2
    assert "UNREACHABLE" in output, output[-3000:]
    assert "k3y-from-a-file" not in output


def test_the_opt_out_lets_a_run_without_a_key_reach_the_nodes(tmp_path):
    result, output = deploy(tmp_path, inventory(tmp_path, {"vllm_service_allow_no_api_key": True}))
    assert "vllm_cluster_api_key is not set" not in output and "UNREACHABLE" in output, output[-3000:]


def test_a_deployment_without_a_model_is_refused_before_any_node_is_contacted(tmp_path):
    path = inventory(tmp_path, {"vllm_cluster_api_key": "k3y"})
    data = yaml.safe_load(path.read_text())
    del data["all"]["children"]["vllm_nodes"]["vars"]["vllm_cluster_model"]
    path.write_text(yaml.safe_dump(data))
    result, output = deploy(tmp_path, path)
    refused_before_any_node(result, output)
    assert output.count("hosts node1, node2: vllm_cluster_model is not set: expected the model to serve, a catalog "
                        "name, a hub id or a path on the controller, set for the deployment's group") == 1


def test_plan_yml_alone_does_not_ask_for_a_key(tmp_path):
    """Only a run that starts vLLM needs the key (deploy.yml says so); planning alone contacts no node."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    result = subprocess.run([str(ANSIBLE_PLAYBOOK), str(REPO / "playbooks" / "plan.yml"), "-i",
                             str(inventory(tmp_path))], capture_output=True, text=True, timeout=120, cwd=REPO,
                            env=env, check=False)
    assert result.returncode == 0, result.stdout[-3000:]


@pytest.mark.parametrize(("count", "memory"), [("8", 81559), (8, "81559"), (" 8 ", "81559.0")])
def test_quoted_gpu_numbers_are_read_as_numbers(count, memory):
    node = {"name": "gpu-a", "address": "10.0.0.1", "gpus": dict(GPUS, count=count, memory_total_mib=memory)}
    gpus = check_cluster([node])[0]["gpus"]
    assert gpus["count"] == 8 and gpus["memory_total_mib"] == 81559.0


@pytest.mark.parametrize(("key", "value", "message"), [
    ("count", "four", "node gpu-a: gpus.count must be an integer >= 1, got 'four'"),
    ("memory_total_mib", "80GB", "node gpu-a: gpus.memory_total_mib must be a positive number, got '80GB'"),
])
def test_a_gpu_number_that_is_not_one_is_named(key, value, message):
    node = {"name": "gpu-a", "address": "10.0.0.1", "gpus": dict(GPUS, **{key: value})}
    with pytest.raises(PlanError) as raised:
        check_cluster([node])
    assert str(raised.value) == message


# --- plan/arguments.py, without a playbook -------------------------------------------------------------------


def test_argument_problems_take_what_ansibles_validator_takes_and_group_the_hosts():
    hosts = {"gpu-a": {"vllm_service_start_timeout_s": "soon", "vllm_service_restart_sec": "10",
                       "vllm_service_eager_first": "yes", "node_firewall_ephemeral_range": ["32768", 60999]},
             "gpu-b": {"vllm_service_start_timeout_s": "soon", "vllm_service_stage": "fast"}}
    assert argument_problems(hosts, REPO) == [
        "host gpu-b: vllm_service_stage='fast': expected one of eager, final "
        "(role vllm_service, roles/vllm_service/meta/argument_specs.yml)",
        "hosts gpu-a, gpu-b: vllm_service_start_timeout_s='soon': expected an integer "
        "(role vllm_service, roles/vllm_service/meta/argument_specs.yml)"]
    # Options not set are never judged (a role's defaults are templates it renders on its node).
    assert argument_problems({"gpu-a": {}}, REPO) == []


def test_a_value_of_node_facts_is_left_to_the_role_and_a_secret_never_shown(tmp_path):
    # A template of what only a node knows (its facts) cannot be rendered before any node is contacted.
    assert argument_problems({"gpu-a": {"vllm_verify_fail": unreadable("'ansible_memtotal_mb' is undefined"),
                                        "vllm_verify_wait_timeout_s": "soon"}}, REPO) == [
        "host gpu-a: vllm_verify_wait_timeout_s='soon': expected an integer "
        "(role vllm_verify, roles/vllm_verify/meta/argument_specs.yml)"]
    # Every secret of the roles is a string, which takes any value; a spec with an integer secret shows how one
    # would be refused (the collection's spec files, copied, with one more option).
    for path in REPO.glob("roles/*/meta/argument_specs.yml"):
        (tmp_path / path.relative_to(REPO)).parent.mkdir(parents=True)
        (tmp_path / path.relative_to(REPO)).write_text(path.read_text())
    spec = tmp_path / "roles/vllm_verify/meta/argument_specs.yml"
    data = yaml.safe_load(spec.read_text())
    data["argument_specs"]["main"]["options"]["vllm_verify_pin"] = {"type": "int", "no_log": True}
    spec.write_text(yaml.safe_dump(data))
    assert argument_problems({"gpu-a": {"vllm_verify_pin": "s3cr3t"}}, tmp_path) == [
        "host gpu-a: vllm_verify_pin=<hidden>: expected an integer "
        "(role vllm_verify, roles/vllm_verify/meta/argument_specs.yml)"]


def test_the_validators_own_wording_is_cleaned_of_type_names():
    message = ("argument 'e' is of type <class 'ansible._internal._datatag._AnsibleTaggedStr'> found in 'd'. and we "
               "were unable to convert to bool: got _AnsibleTaggedStr")
    cleaned = _plain(message)
    assert "_Ansible" not in cleaned and "<class" not in cleaned and "is of type" not in cleaned
    assert cleaned.endswith("got str")


def test_the_api_key_check_respects_the_opt_out_and_vllm_service_api_key():
    assert api_key_problems({"a": {"vllm_cluster_api_key": "k"}, "b": {"vllm_service_api_key": "k"},
                             "c": {"vllm_service_allow_no_api_key": "true"},
                             "d": {"vllm_service_allow_no_api_key": True, "vllm_cluster_api_key": ""}}) == []
    found = api_key_problems({"a": {"vllm_cluster_api_key": "k", "vllm_service_api_key": ""},
                              "b": {"vllm_cluster_api_key": "two words"},
                              "c": {"vllm_service_allow_no_api_key": False}})
    assert [line.split(":")[0] for line in found] == ["host a", "host c", "host b"]
    assert found[0].startswith("host a: vllm_service_api_key is not set (or empty): expected the API key")
    assert found[1].startswith("host c: vllm_cluster_api_key is not set (or empty)")
    assert found[2] == ("host b: vllm_cluster_api_key=<hidden> has spaces or characters outside printable ASCII: "
                        "expected the API key vLLM requires on /v1 (printable ASCII, no spaces)")
    assert not any("two words" in line for line in found)
