"""Ray's authentication pinned by the plan (plan/ray_auth.py) and rendered into the Ray unit.

Ray 2.59+ turns token authentication on by itself where RAY_AUTH_MODE is unset and any token file exists
(tests/fixtures/ray/logs/auth-*): the plan always names the mode, token by default, and the Ray unit sets it
with the token handed over by systemd (LoadCredential=), never in argv or the unit file.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import jinja2
import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import PlanError, plan_from_request
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.ray_auth import (
    RAY_AUTH_TOKEN_PATH,
    ray_auth_section,
)

REPO = Path(__file__).resolve().parents[2]
RAY_UNIT = REPO / "roles" / "ray_cluster" / "templates" / "ray-node.service.j2"
VLLM_UNIT = REPO / "roles" / "vllm_service" / "templates" / "vllm.service.j2"


def two_node_request(**extra):
    h100 = {"count": 8, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "nvlink": True}
    nodes = [{"name": f"n{k}", "address": f"10.0.0.{k}", "gpus": dict(h100)} for k in (1, 2)]
    return {"model": "llama-3.1-405b", "cluster": nodes, **extra}


def test_token_is_the_default_and_a_ray_command_reads_the_nodes_token_file():
    plan = plan_from_request(two_node_request(overrides={"backend": "ray"}))
    assert plan["backend"] == "ray"
    assert plan["ray_auth"] == {
        "mode": "token", "token_path": "/etc/vllm-cluster/ray-auth-token", "credential": "ray-auth-token",
        "environment": {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "/etc/vllm-cluster/ray-auth-token"}}


def test_disabled_is_an_explicit_choice_and_still_pinned():
    plan = plan_from_request(two_node_request(ray_auth="disabled"))
    assert plan["ray_auth"]["mode"] == "disabled"
    assert plan["ray_auth"]["environment"] == {"RAY_AUTH_MODE": "disabled"}  # never unset: Ray would guess


@pytest.mark.parametrize("value", ["tls", "", "Token", True])
def test_another_mode_is_refused_with_the_choices(value):
    with pytest.raises(PlanError, match=r"ray_auth must be one of \['token', 'disabled'\]"):
        plan_from_request(two_node_request(ray_auth=value))


def render_ray_unit(mode, head=True):
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    environment.filters["comment"] = lambda text: "# " + str(text)
    environment.filters["quote"] = shlex.quote
    environment.filters["bool"] = bool
    auth = ray_auth_section(mode)
    return environment.from_string(RAY_UNIT.read_text()).render(
        ansible_managed="managed", __ray_cluster_is_head=head, vllm_cluster_plan={"deployment": "d"},
        __ray_cluster_address="10.0.0.1", ray_cluster_user="vllm", ray_cluster_state_dir="/var/lib/vllm-cluster",
        ray_cluster_startup_timeout_sec=120, ray_cluster_environment={}, __ray_cluster_head_address="10.0.0.1",
        __ray_cluster_ports={"ray_gcs": 6379, "ray_dashboard": 8265}, ray_cluster_worker_head_wait_sec=600,
        __ray_cluster_argv=["/opt/vllm-cluster/venv/bin/ray", "start", "--block"], ray_cluster_restart_sec=5,
        __ray_cluster_systemd_version=252, ray_cluster_restart_max_delay_sec=60, ray_cluster_stop_timeout_sec=30,
        ray_cluster_limit_memlock="infinity", ray_cluster_hardening=True, __ray_cluster_auth=auth,
        __ray_cluster_token_mode=auth["mode"] == "token")


@pytest.mark.parametrize("head", [True, False])
def test_the_ray_unit_pins_the_mode_and_takes_the_token_from_systemd(head):
    unit = render_ray_unit("token", head)
    assert "Environment=RAY_AUTH_MODE=token\n" in unit
    assert f"LoadCredential=ray-auth-token:{RAY_AUTH_TOKEN_PATH}\n" in unit
    assert "Environment=RAY_AUTH_TOKEN_PATH=%d/ray-auth-token\n" in unit  # systemd's credentials directory
    execstart = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert "token" not in execstart.lower()


def test_the_ray_unit_with_authentication_disabled_says_so():
    unit = render_ray_unit("disabled")
    assert "Environment=RAY_AUTH_MODE=disabled\n" in unit
    assert "LoadCredential" not in unit and "RAY_AUTH_TOKEN_PATH" not in unit


def test_vllm_on_ray_gets_the_same_authentication_as_the_ray_units():
    """vLLM's API server joins the Ray cluster as a driver: its unit sets the plan's mode and credential where vLLM
    is part of the cluster unit (backend ray), nothing elsewhere."""
    template = VLLM_UNIT.read_text()
    block = re.search(r"\{% if \(vllm_service_plan \| vllm_ops\.cluster\.launch_mode\)\['vllm_part_of_cluster_unit'\] %\}"
                      r"\n# vLLM joins the Ray cluster.*?\{% endif %\}\n\{% endif %\}", template, re.S)
    assert block, "vllm.service.j2 has no Ray authentication block under vllm_part_of_cluster_unit"
    text = block.group(0)
    assert "Environment=RAY_AUTH_MODE={{ vllm_service_plan['ray_auth']['mode'] }}" in text
    assert ("LoadCredential={{ vllm_service_plan['ray_auth']['credential'] }}:"
            "{{ vllm_service_plan['ray_auth']['token_path'] }}") in text
    assert "Environment=RAY_AUTH_TOKEN_PATH=%d/{{ vllm_service_plan['ray_auth']['credential'] }}" in text
