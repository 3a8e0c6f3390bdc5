"""gpu_facts, ib_facts and cpu_facts run for real through ``ansible localhost``.

The only doubles are nvidia-smi and ibstat replay scripts that print REAL
captures from tests/fixtures (with the exit code recorded for them).
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.cpuinfo import (
    read_cpu_sources,
    summarize_cpu,
)

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
H200 = FIXTURES / "gpu" / "h200x2"
LOAD = FIXTURES / "gpu" / "h200x2-load"
PUBLIC_GPU = FIXTURES / "gpu" / "public"
IB = FIXTURES / "ib" / "public"
ANSIBLE = Path(sys.executable).with_name("ansible")
# Nodes run Python 3.11 (Debian 12); run the modules there when this machine has it.
MODULE_PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable


def run_local_tasks(tmp_path: Path, tasks: list) -> dict:
    """Run tasks through ansible-playbook on localhost with the nodes' Python; each task's result by its name."""
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    proc = subprocess.run(
        [str(ANSIBLE.with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={MODULE_PYTHON}", str(playbook)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return {t["task"]["name"]: t["hosts"]["localhost"] for t in json.loads(proc.stdout)["plays"][0]["tasks"]}
HOST = socket.gethostname()


def recorded_exit_codes() -> dict:
    """Exit codes recorded with the h200x2-load capture (commands.tsv)."""
    codes = {}
    for line in (LOAD / "commands.tsv").read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            continue
        name, code, _command = line.split("\t", 2)
        codes[name] = int(code)
    return codes


def write_double(path: Path, replies: dict) -> Path:
    """A replay script: for each argument string, print a capture (stdout, optional stderr) and exit."""
    lines = ["#!/bin/sh", "# Replay double: prints real captured output for the arguments it knows.", 'case "$*" in']
    for arguments, reply in replies.items():
        stdout, code = reply[0], reply[1]
        stderr = reply[2] if len(reply) > 2 else None
        action = f"cat {shlex.quote(str(stdout))}"
        if stderr is not None:
            action += f"; cat {shlex.quote(str(stderr))} >&2"
        lines.append(f"  {shlex.quote(arguments)}) {action}; exit {code} ;;")
    lines.append('  *) echo "replay double: no capture for: $*" >&2; exit 2 ;;')
    lines.append("esac")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    path.chmod(0o755)
    return path


def build_scenarios(root: Path) -> list[dict]:
    """Every module call the tests check: name, module, args, and how it is run."""
    codes = recorded_exit_codes()
    absent = root / "absent"
    no_dev = root / "no-dev"
    dev = device_tree(root / "with-dev")
    no_ib = root / "no-ib" / "*"
    with_ib = root / "with-ib"
    (with_ib / "mlx5_0").mkdir(parents=True)  # CA name from the captures

    h200 = write_double(root / "h200" / "nvidia-smi", {
        "-q -x": (H200 / "nvidia-smi-q.xml", 0),
        "topo -m": (H200 / "topo.txt", 0),
        "nvlink -s": (H200 / "nvlink-s.txt", 0),
    })
    load = write_double(root / "load" / "nvidia-smi", {
        "-q -x": (LOAD / "nvidia-smi-q-load.xml", 0),
        "topo -m": (LOAD / "topo.txt", 0),
        "nvlink -s": (LOAD / "nvlink-s.txt", 0),
    })
    # Knows only '-q -x': any other query would make the module fail.
    k80 = write_double(root / "k80" / "nvidia-smi", {"-q -x": (PUBLIC_GPU / "openpai-4x-tesla-k80-driver430.xml", 0)})
    no_devices = write_double(root / "no-devices" / "nvidia-smi", {
        "-q -x": (LOAD / "error-bad-index.txt", codes["error-bad-index.txt"]),
    })
    not_xml = write_double(root / "not-xml" / "nvidia-smi", {"-q -x": (H200 / "topo.txt", 0)})
    bad_topo = write_double(root / "bad-topo" / "nvidia-smi", {
        "-q -x": (H200 / "nvidia-smi-q.xml", 0),
        "topo -m": (LOAD / "error-bad-topo-arg.txt", codes["error-bad-topo-arg.txt"]),
    })

    def ib_args(binary: Path, hardware, **extra) -> dict:
        # ibdev2netdev has no allowed double: point it at a path that does not exist.
        return {"binary": str(binary), "ibdev2netdev_binary": str(absent / "ibdev2netdev"),
                "hardware_globs": [str(hardware)], **extra}

    ibstat = write_double(root / "ibstat" / "ibstat", {"": (IB / "gpud-ibstat-h100-12hca-3-down-disabled.txt", 0)})
    # The capture holds ibstat's stdout and its 'ibpanic' line; the source note records exit 255.
    lines = (IB / "gpud-ibstat-a100-8hca-ibpanic.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    stdout, stderr = root / "ibpanic.out", root / "ibpanic.err"
    stdout.write_text("".join(line for line in lines if not line.startswith("ibpanic:")), encoding="utf-8")
    stderr.write_text("".join(line for line in lines if line.startswith("ibpanic:")), encoding="utf-8")
    ibpanic = write_double(root / "ibpanic" / "ibstat", {"": (stdout, 255, stderr)})
    ibstatus = write_double(root / "ibstatus" / "ibstat", {"": (IB / "gpud-ibstatus-a100-all-active.txt", 0)})
    empty_root = root / "empty-root"
    empty_root.mkdir()

    return [
        # The default binary name is looked up in PATH.
        {"name": "h200", "module": "gpu_facts", "args": {}, "path": h200.parent},
        {"name": "load", "module": "gpu_facts", "args": {"binary": str(load), "required": True}},
        {"name": "load-check", "module": "gpu_facts", "args": {"binary": str(load), "required": True}, "check": True},
        {"name": "k80-no-extras", "module": "gpu_facts", "args": {"binary": str(k80), "collect": []}},
        {"name": "no-devices", "module": "gpu_facts", "args": {"binary": str(no_devices)}, "double": no_devices},
        {"name": "not-xml", "module": "gpu_facts", "args": {"binary": str(not_xml)}, "double": not_xml},
        {"name": "bad-topo", "module": "gpu_facts", "args": {"binary": str(bad_topo)}, "double": bad_topo},
        {"name": "gpu-absent", "module": "gpu_facts",
         "args": {"binary": str(absent / "nvidia-smi"), "hardware_globs": [str(no_dev / "nvidia[0-9]*")]}},
        {"name": "gpu-absent-with-devices", "module": "gpu_facts",
         "args": {"binary": str(absent / "nvidia-smi"), "hardware_globs": [str(dev / "nvidia[0-9]*")]},
         "device": dev / "nvidia0"},
        {"name": "gpu-absent-required", "module": "gpu_facts",
         "args": {"binary": str(absent / "nvidia-smi"), "required": True,
                  "hardware_globs": [str(no_dev / "nvidia[0-9]*")]}},
        {"name": "ibstat", "module": "ib_facts", "args": ib_args(ibstat, no_ib, required=True)},
        {"name": "ibpanic", "module": "ib_facts", "args": ib_args(ibpanic, no_ib), "double": ibpanic},
        {"name": "ib-not-ibstat", "module": "ib_facts", "args": ib_args(ibstatus, no_ib), "double": ibstatus},
        {"name": "ib-absent", "module": "ib_facts", "args": ib_args(absent / "ibstat", no_ib)},
        {"name": "ib-absent-required", "module": "ib_facts", "args": ib_args(absent / "ibstat", no_ib, required=True)},
        {"name": "ib-absent-with-adapter", "module": "ib_facts", "args": ib_args(absent / "ibstat", with_ib / "*"),
         "device": with_ib / "mlx5_0"},
        {"name": "cpu", "module": "cpu_facts", "args": {}},
        {"name": "cpu-empty-root", "module": "cpu_facts", "args": {"root": str(empty_root)}, "root": empty_root},
    ]


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory) -> dict:
    """Run every scenario in one ansible-playbook run; results by scenario name."""
    root = tmp_path_factory.mktemp("facts-modules")
    planned = build_scenarios(root)
    tasks = []
    for scenario in planned:
        task = {"name": scenario["name"], f"vllm_ops.cluster.{scenario['module']}": scenario["args"],
                "ignore_errors": True}
        if scenario.get("check"):
            task["check_mode"] = True
        if scenario.get("path"):
            task["environment"] = {"PATH": f"{scenario['path']}{os.pathsep}{os.environ.get('PATH', '')}"}
        tasks.append(task)
    playbook = root / "facts.yml"
    playbook.write_text(json.dumps([{"name": "Facts modules", "hosts": "localhost", "gather_facts": False,
                                     "tasks": tasks}]), encoding="utf-8")
    env = dict(os.environ)
    env.update(
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_CACHE_PLUGIN="memory",
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
        ANSIBLE_LOCAL_TEMP=str(root / "ansible-local"),
        ANSIBLE_HOME=str(root / "ansible-home"),
        ANSIBLE_NOCOLOR="1",
    )
    completed = subprocess.run(
        [str(ANSIBLE.with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={MODULE_PYTHON}", str(playbook)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    try:
        report = json.loads(completed.stdout)
    except json.JSONDecodeError as error:
        raise AssertionError(f"ansible-playbook printed no JSON (rc {completed.returncode}): {completed.stderr}") from error
    results = {task["task"]["name"]: task["hosts"]["localhost"] for task in report["plays"][0]["tasks"]}
    return {scenario["name"]: {**scenario, "result": results[scenario["name"]]} for scenario in planned}


def ok(scenarios: dict, name: str) -> dict:
    result = scenarios[name]["result"]
    assert not result.get("failed"), result.get("msg")
    assert result["changed"] is False
    return result["ansible_facts"]


def failed(scenarios: dict, name: str) -> str:
    result = scenarios[name]["result"]
    assert result["failed"] is True
    return result["msg"]


def device_tree(root: Path) -> Path:
    """Device nodes named as on the real H200 machine (h200x2-load/env.txt)."""
    listed = (LOAD / "env.txt").read_text(encoding="utf-8").splitlines()
    for name in (line.rsplit("/", 1)[1] for line in listed if line.startswith("/dev/nvidia")):
        (root / "dev").mkdir(parents=True, exist_ok=True)
        (root / "dev" / name).write_text("", encoding="utf-8")
    return root / "dev"


# ------------------------------------------------------------------ gpu_facts


def test_gpu_facts_on_the_2x_h200_capture(scenarios):
    facts = ok(scenarios, "h200")["vllm_gpu"]
    assert (facts["present"], facts["count"], facts["name"]) == (True, 2, "NVIDIA H200")
    assert facts["memory_total_mib"] == 143771
    assert (facts["driver_version"], facts["cuda_version"], facts["compute_capability"]) == ("580.159.04", "13.0", "9.0")
    assert facts["persistence_mode"] is True and facts["mig_mode"] is False
    assert facts["links"]["GPU0"]["GPU1"] == "NV18"
    assert (facts["nvlink"], facts["nvlink_links_per_pair"], facts["nvswitch"]) == (True, 18, True)
    assert [gpu["nvlink_active_links"] for gpu in facts["gpus"]] == [18, 18]
    assert facts["ecc_uncorrectable_volatile"] == 0
    assert facts["processes"] == [] and facts["warnings"] == []


def test_gpu_facts_under_load_same_in_check_mode(scenarios):
    facts = ok(scenarios, "load")["vllm_gpu"]
    assert ok(scenarios, "load-check")["vllm_gpu"] == facts
    assert [(p["gpu"], p["pid"], p["name"], p["used_memory_mib"]) for p in facts["processes"]] == [
        (0, 583, "python3", 6754), (1, 583, "python3", 6754),
    ]
    assert [gpu["uuid"] for gpu in facts["gpus"]] == [
        "GPU-5ca8532c-9041-29ce-72cc-27ab52815263", "GPU-5c8fa947-f3fa-cdcc-b5dd-8e2f93630a3e",
    ]


def test_gpu_facts_without_extra_queries_on_the_k80_capture(scenarios):
    facts = ok(scenarios, "k80-no-extras")["vllm_gpu"]
    assert (facts["count"], facts["name"], facts["compute_capability"]) == (4, "Tesla K80", "3.7")
    assert facts["nvlink"] is None and facts["links"] == {}
    assert facts["ecc_uncorrectable_aggregate"] == 11
    assert facts["cuda_version"] is None


def test_gpu_facts_fails_when_nvidia_smi_fails(scenarios):
    double = scenarios["no-devices"]["double"]
    assert failed(scenarios, "no-devices") == f"host {HOST}: '{double} -q -x' exited with 6: No devices were found"
    assert scenarios["no-devices"]["result"]["rc"] == 6


def test_gpu_facts_fails_on_output_it_cannot_parse(scenarios):
    double = scenarios["not-xml"]["double"]
    message = failed(scenarios, "not-xml")
    assert message.startswith(f"host {HOST}: cannot parse the output of '{double} -q -x' (exit code 0): ")
    assert "not XML" in message


def test_gpu_facts_fails_when_topology_query_fails(scenarios):
    double = scenarios["bad-topo"]["double"]
    assert failed(scenarios, "bad-topo") == (
        f"host {HOST}: '{double} topo -m' exited with 2: Option \"-q\" is not recognized."
    )


def test_gpu_facts_missing_tool_without_gpus_is_not_a_failure(scenarios):
    facts = ok(scenarios, "gpu-absent")["vllm_gpu"]
    assert (facts["present"], facts["count"], facts["gpus"], facts["nvlink"]) == (False, 0, [], False)


def test_gpu_facts_missing_tool_with_gpus_fails(scenarios):
    binary = scenarios["gpu-absent-with-devices"]["args"]["binary"]
    device = scenarios["gpu-absent-with-devices"]["device"]
    assert failed(scenarios, "gpu-absent-with-devices").startswith(
        f"host {HOST}: NVIDIA GPU devices exist ({device}) but '{binary}' was not found"
    )


def test_gpu_facts_required_without_gpus_fails(scenarios):
    message = failed(scenarios, "gpu-absent-required")
    assert message.startswith(f"host {HOST}: no NVIDIA GPU and no ") and "required=true" in message


# ------------------------------------------------------------------ ib_facts


def test_ib_facts_on_the_h100_capture_with_down_ports(scenarios):
    facts = ok(scenarios, "ibstat")["vllm_ib"]
    assert (facts["present"], facts["ca_count"], facts["active_count"]) == (True, 12, 9)
    assert facts["down_ports"] == ["mlx5_2/1", "mlx5_7/1", "mlx5_8/1"]
    assert facts["link_layers"] == {"InfiniBand": 8, "Ethernet": 4}
    assert facts["rates_gbps"] == [100, 400]
    assert len(facts["infiniband_active"]) == 8
    assert all(port["netdev"] is None for port in facts["ports"])


def test_ib_facts_fails_on_ibpanic(scenarios):
    assert "exit-255" in (IB / "gpud-ibstat-a100-8hca-ibpanic.source.txt").read_text(encoding="utf-8")
    double = scenarios["ibpanic"]["double"]
    assert failed(scenarios, "ibpanic") == (
        f"host {HOST}: '{double}' exited with 255: "
        "ibpanic: [1400444] main: stat of IB device 'mlx5_8' failed: No such file or directory"
    )


def test_ib_facts_fails_on_output_it_cannot_parse(scenarios):
    double = scenarios["ib-not-ibstat"]["double"]
    assert failed(scenarios, "ib-not-ibstat").startswith(
        f"host {HOST}: cannot parse the output of '{double}' (exit code 0): "
    )


def test_ib_facts_missing_tool(scenarios):
    assert ok(scenarios, "ib-absent")["vllm_ib"]["present"] is False
    assert "required=true" in failed(scenarios, "ib-absent-required")
    binary = scenarios["ib-absent-with-adapter"]["args"]["binary"]
    adapter = scenarios["ib-absent-with-adapter"]["device"]
    assert failed(scenarios, "ib-absent-with-adapter").startswith(
        f"host {HOST}: InfiniBand/RoCE adapters exist ({adapter}) but '{binary}' was not found"
    )


# ------------------------------------------------------------------ cpu_facts


def test_cpu_facts_reads_the_same_as_the_parser(scenarios):
    facts = ok(scenarios, "cpu")["vllm_cpu"]
    direct = summarize_cpu(read_cpu_sources("/"))
    for key in ("logical_cpus", "physical_cores", "sockets", "threads_per_core", "numa_node_count", "model_name",
                "flags", "memory_total_mib"):
        assert facts[key] == direct[key]
    assert facts["present"] is True


def test_cpu_facts_fails_without_kernel_files(scenarios):
    empty = scenarios["cpu-empty-root"]["root"]
    assert failed(scenarios, "cpu-empty-root") == (
        f"host {HOST}: cannot read CPU facts under {empty}: /proc/cpuinfo could not be read"
    )


def test_module_documentation_renders():
    modules = [f"vllm_ops.cluster.{name}" for name in ("gpu_facts", "ib_facts", "cpu_facts")]
    completed = subprocess.run(
        [str(ANSIBLE.with_name("ansible-doc")), "--json", *modules],
        cwd=REPO, env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg")),
        capture_output=True, text=True, timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    docs = json.loads(completed.stdout)
    for module in modules:
        assert docs[module]["doc"]["attributes"]["check_mode"]["support"] == "full"
        assert docs[module]["examples"].strip() and docs[module]["return"]["ansible_facts"]
