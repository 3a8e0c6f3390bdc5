"""Role vllm_router without a router host: its launcher (the key out of argv) and its unit, rendered.

The launcher is roles/vllm_router/files/vllm-router-launch.py itself, loaded as the role installs it;
its checks run before it imports vllm_router, so they need no router here. The unit is the role's
template rendered with the role's defaults and workers from a real plan. The by-hand run of the launcher
against vllm-router 0.1.17 (ps shows vllm::router, the key in no argv, environment or log line) is in
docs/router.md; the run on a router host (systemd's LoadCredential) is the lab's, not here.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from importlib.machinery import SourceFileLoader

import jinja2
import pytest
import yaml
from ansible_collections.vllm_ops.cluster.plugins.filter.router import (
    router_argv,
    router_exec_start,
    router_workers,
)
from test_facts_modules import REPO
from test_monitoring_targets import lab_plan

ROLE = REPO / "roles" / "vllm_router"
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
VARS = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())


def launcher():
    loader = SourceFileLoader("vllm_router_launch", str(ROLE / "files" / "vllm-router-launch.py"))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


# argparse takes a unique prefix of a flag: --a is --api-key to vllm-router's parser.
@pytest.mark.parametrize("word", ["--api-key", "--api-key=s3cret", "--api", "--api-k=s3cret", "--a"])
def test_the_launcher_refuses_the_key_on_its_command_line_before_starting_anything(word, capsys):
    assert launcher().main(["--port", "8080", word, "s3cret"], {}) == 2
    err = capsys.readouterr().err
    assert "is refused on the command line" in err and "s3cret" not in err


def test_other_flags_are_not_taken_for_the_key():
    assert launcher().key_flag_in(["--host", "0.0.0.0", "--policy", "cache_aware", "--", "-a"]) is None


def test_the_key_comes_from_the_credential_the_unit_names(tmp_path):
    module = launcher()
    (tmp_path / "api-key").write_text("k-123\n")
    environ = {"VLLM_ROUTER_KEY_CREDENTIAL": "api-key", "CREDENTIALS_DIRECTORY": str(tmp_path)}
    assert module.read_key(environ) == "k-123"
    assert module.read_key({}) is None  # the unit names no credential: a router without a key


@pytest.mark.parametrize(("content", "environ", "message"), [
    (None, {"VLLM_ROUTER_KEY_CREDENTIAL": "api-key"}, "but no CREDENTIALS_DIRECTORY; expected the unit's "
                                                      "LoadCredential=api-key:<root-only file>"),
    (None, {"VLLM_ROUTER_KEY_CREDENTIAL": "api-key", "CREDENTIALS_DIRECTORY": "."}, "cannot read the key credential"),
    ("two words\n", None, "is empty or holds spaces or non-ASCII characters"),
    ("\n", None, "is empty or holds spaces"),
])
def test_a_missing_or_bad_credential_stops_the_launcher_with_one_line(tmp_path, content, environ, message, capsys):
    module = launcher()
    if content is not None:
        (tmp_path / "api-key").write_text(content)
    environ = environ or {"VLLM_ROUTER_KEY_CREDENTIAL": "api-key", "CREDENTIALS_DIRECTORY": str(tmp_path)}
    if environ.get("CREDENTIALS_DIRECTORY") == ".":
        environ = {**environ, "CREDENTIALS_DIRECTORY": str(tmp_path / "absent")}
    assert module.main(["--port", "8080"], environ) == 2
    err = capsys.readouterr().err
    assert err.startswith("vllm-router-launch: ") and message in err and err.count("\n") == 1


def render_unit(**variables):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROLE / "templates"), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True)
    env.filters["comment"] = lambda text: "# " + text
    env.filters["bool"] = bool
    env.filters["vllm_ops.cluster.router_exec_start"] = router_exec_start
    plans = [lab_plan({"tp": 1}, deployment=f"r{k}", cluster=[{"name": f"node{k}", "address": f"10.77.1.{k}",
                                                              "fabric_interface": "eth1",
                                                              "gpus": {"count": 1, "name": "cpu",
                                                                       "memory_total_mib": 4096, "nvlink": False}}],
                      serve_args={"served-model-name": "tiny"}) for k in (1, 2)]
    workers = router_workers(plans)
    values = {**DEFAULTS, **variables}
    settings = {name[len("vllm_router_"):]: values[name] for name in values
                if name.startswith("vllm_router_") and name[len("vllm_router_"):] in
                {key for key in VARS["__vllm_router_settings"]}}
    settings["prometheus_address"] = "10.77.1.9"
    argv = router_argv(settings, workers, "router1", values["vllm_router_extra_args"], plans)
    return env.get_template("vllm-router.service.j2").render(
        ansible_managed="Ansible managed", **values, __vllm_router_workers=workers, __vllm_router_argv=argv,
        __vllm_router_launcher="/opt/vllm-router/venv/bin/vllm-router-launch",
        __vllm_router_has_key=len(values["vllm_router_api_key"]) > 0, __vllm_router_key_credential="api-key",
        __vllm_router_key_path="/etc/vllm-router/api-key")


def test_the_unit_loads_the_key_as_a_credential_and_never_puts_it_on_the_command_line():
    unit = render_unit(vllm_router_api_key="k-123456")
    lines = unit.splitlines()
    assert "LoadCredential=api-key:/etc/vllm-router/api-key" in lines
    assert "Environment=VLLM_ROUTER_KEY_CREDENTIAL=api-key" in lines
    (exec_start,) = [line for line in lines if line.startswith("ExecStart=")]
    assert exec_start.startswith("ExecStart=/opt/vllm-router/venv/bin/vllm-router-launch --host 0.0.0.0 --port 8080 ")
    assert exec_start.endswith("--worker-urls http://10.77.1.1:8000 http://10.77.1.2:8000")
    assert "k-123456" not in unit and "--api-key" not in unit
    assert "Description=vLLM router: r1, r2" in lines


def test_the_unit_is_sandboxed_and_restarts_forever():
    lines = render_unit(vllm_router_api_key="k-123456").splitlines()
    for line in ("DynamicUser=yes", "NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateDevices=yes",
                 "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX", "CapabilityBoundingSet=", "Restart=always",
                 "StartLimitIntervalSec=0", "SystemCallFilter=@system-service"):
        assert line in lines, line
    assert "ProtectSystem=strict" not in render_unit(vllm_router_api_key="k", vllm_router_hardening=False)


def test_without_a_key_there_is_no_credential_and_a_low_port_gets_only_the_bind_capability():
    lines = render_unit(vllm_router_api_key="", vllm_router_port=80, vllm_router_guard=False).splitlines()
    assert not [line for line in lines if line.startswith(("LoadCredential", "Environment=VLLM_ROUTER_KEY"))]
    assert "AmbientCapabilities=CAP_NET_BIND_SERVICE" in lines and "CapabilityBoundingSet=CAP_NET_BIND_SERVICE" in lines
    # Behind the guard the router listens on its backend port; the guard (root, then its user) binds port 80.
    assert "CapabilityBoundingSet=" in render_unit(vllm_router_api_key="", vllm_router_port=80).splitlines()


def test_systemds_own_parser_accepts_the_unit_and_rates_its_sandbox(tmp_path):
    # systemd 252's systemd-analyze, offline: every key known and every value valid, then the exposure score.
    unit = tmp_path / "vllm-router.service"
    text = render_unit(vllm_router_api_key="k-123456")
    unit.write_text(text.replace("/opt/vllm-router/venv/bin/vllm-router-launch", "/usr/bin/true"))
    verify = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert verify.returncode == 0 and verify.stdout + verify.stderr == "", verify.stdout + verify.stderr
    broken = tmp_path / "broken" / "vllm-router.service"
    broken.parent.mkdir()
    broken.write_text(unit.read_text().replace("ProtectSystem=strict", "ProtectSytem=strict"))
    seen = subprocess.run(["systemd-analyze", "verify", "--man=no", str(broken)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert "Unknown key 'ProtectSytem'" in seen.stderr  # the check sees a mistake
    security = subprocess.run(["systemd-analyze", "security", "--offline=true", str(unit)], capture_output=True,
                              text=True, timeout=60, check=False)
    score = re.search(r"Overall exposure level for vllm-router\.service: ([0-9.]+)", security.stdout)
    assert score and float(score.group(1)) <= 2.0, security.stdout[-400:]
