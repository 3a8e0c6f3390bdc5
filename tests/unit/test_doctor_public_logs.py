"""The doctor on real log excerpts from public issues: the signatures the lab cannot produce.

Each case takes a deployment as the planner would lay it out (a real plan of the
seed's TP=8 x PP=2 layout over two 8 x H100 nodes, mp or Ray backend), the nodes
healthy as planned (units active with the plan's argv, env files holding the
plan's env), then puts one real excerpt (tests/fixtures/doctor/public, each with
its .source.txt) into the journal of the unit that printed it, with that unit
failing, and checks the doctor's top finding. Some cases add the state that a
real node shows with that failure (an env variable, a GPU process), from real
captures where one exists.
"""

import copy
from pathlib import Path

import pytest
import yaml
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.catalog import (
    load_catalog,
    load_catalog_file,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.diagnosis import diagnose
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts import (
    ibstat,
    nvidia_smi,
    nvidia_smi_query,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers import systemd
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import build_plan

REPO = Path(__file__).resolve().parents[2]
PUBLIC = REPO / "tests" / "fixtures" / "doctor" / "public"
CATALOG = load_catalog_file(REPO / "roles" / "doctor" / "files" / "signatures.yml")
H100 = ("NVIDIA H100 80GB HBM3", 81559)  # memory.total of the captured H100 (tests/fixtures/gpu/public)
ALL_ACTIVE_IBSTAT = (REPO / "tests/fixtures/ib/public/gpud-ibstat-h100-9hca-all-active.txt").read_text()


def plan_for(backend, ib=True, hcas=("mlx5_0", "mlx5_1")):
    nodes = [
        {
            "name": f"node{index + 1}",
            "address": f"10.232.9.{11 + index}",
            "fabric_interface": "eth1",
            "ib_hcas": list(hcas) if ib else None,
            "gpus": {"count": 8, "name": H100[0], "memory_total_mib": H100[1], "nvlink": True},
        }
        for index in range(2)
    ]
    for node in nodes:
        if node["ib_hcas"] is None:
            del node["ib_hcas"]
    return build_plan("llama-3.1-405b", nodes, {"max_model_len": 8192}, {"backend": backend},
                      model_path="/srv/models/llama-3.1-405b")


def exec_start(argv):
    """systemctl show's rendering of ExecStart for an argv."""
    return f"{{ path={argv[0]} ; argv[]={' '.join(argv)} ; ignore_errors=no ; start_time=[n/a] ; pid=0 ; code=(null) }}"


def healthy_node(plan, node):
    """A node as the deployment would leave it: its units active with the plan's command, env files from the plan."""
    units = {}
    pids = {}
    if node["runs_vllm"]:
        argv = ["/opt/vllm-cluster/venv/bin/vllm", *node["argv"][1:]]
        units["vllm.service"] = {"LoadState": "loaded", "ActiveState": "active", "SubState": "running",
                                 "Result": "success", "UnitFileState": "enabled", "ExecStart": exec_start(argv),
                                 "LimitMEMLOCK": "infinity", "NRestarts": "0"}
        pids["vllm.service"] = [4100 + node["node_rank"]]
    if node.get("ray_start_argv"):
        unit = "ray-head.service" if node["node_rank"] == 0 else "ray-worker.service"
        argv = ["/opt/vllm-cluster/venv/bin/ray", *node["ray_start_argv"][1:]]
        units[unit] = {"LoadState": "loaded", "ActiveState": "active", "SubState": "running", "Result": "success",
                       "UnitFileState": "enabled", "ExecStart": exec_start(argv), "LimitMEMLOCK": "infinity"}
        pids[unit] = [3100 + node["node_rank"]]
    env_text = "\n".join(f"{key}={value}" for key, value in sorted(node["env"].items()))
    gather = {
        "units": units,
        "journal": {name: [] for name in units},
        "unit_pids": pids,
        "listening": [],
        "env_files": {"/etc/vllm-cluster/env": {"exists": True, **systemd.parse_env_file(env_text)}},
        "env_file_order": ["/etc/vllm-cluster/env"],
        "interfaces": {"eth1": {"state": "UP", "mtu": 9000, "addresses": [f"{node['address']}/24"]}},
        "routes": {plan["nodes"][0]["address"]: "eth1"},
        "shm": {"total_bytes": 64 * 1024**3, "available_bytes": 64 * 1024**3},
        "venv": {"path": "/opt/vllm-cluster/venv", "exists": True, "python_version": "3.11.2",
                 "packages": {"vllm": "0.32.0", "ray": "2.60.0", "torch": "2.9.0"}},
        "model": {"path": plan["model"]["path"], "exists": True, "config_json": True, "entries": 200},
        "probes": [],
        "firewall": {"tool": "nft list ruleset", "rules": []},
        "ray": {},
    }
    ib = ibstat.absent_summary()
    if "NCCL_IB_HCA" in node["env"]:
        # A real ibstat of an H100 node with every port Active (gpud capture, tests/fixtures/ib/public).
        ib = ibstat.summarize_ib(ibstat.parse_ibstat(ALL_ACTIVE_IBSTAT))
    return {"reachable": True, "gather": gather, "gpu": {"present": True, "count": 8, "processes": []}, "ib": ib}


def healthy_cluster(backend="mp", ib=True, hcas=("mlx5_0", "mlx5_1")):
    plan = plan_for(backend, ib, hcas)
    nodes = {node["host"]: healthy_node(plan, node) for node in plan["nodes"]}
    if backend == "ray":
        nodes["node1"]["gather"]["ray"] = {"nodes": [
            {"node_ip": node["address"], "state": "ALIVE", "resources_total": {"GPU": 8.0}} for node in plan["nodes"]
        ]}
    return {"plan": plan, "nodes": nodes}


def with_log(evidence, fixture, node="node1", unit="vllm.service", failing=True):
    evidence = copy.deepcopy(evidence)
    lines = (PUBLIC / fixture).read_text(encoding="utf-8").splitlines()
    gather = evidence["nodes"][node]["gather"]
    gather["journal"][unit] = lines
    if failing:
        gather["units"][unit].update(ActiveState="activating", SubState="auto-restart", Result="exit-code",
                                     ExecMainStatus="1", NRestarts="3")
        gather["unit_pids"][unit] = []
    return evidence


def set_env(evidence, node, **values):
    gather = evidence["nodes"][node]["gather"]
    text = "\n".join(f"{key}={value}" for key, value in {**gather["env_files"]["/etc/vllm-cluster/env"]["vars"],
                                                          **values}.items())
    gather["env_files"]["/etc/vllm-cluster/env"] = {"exists": True, **systemd.parse_env_file(text)}


def top(evidence):
    report = diagnose(CATALOG, evidence)
    assert report["findings"], "the doctor found nothing"
    return report["findings"][0], report


def ids(report):
    return [finding["id"] for finding in report["findings"]]


def test_every_public_fixture_has_its_source():
    logs = sorted(PUBLIC.glob("*.log"))
    assert len(logs) >= 37
    for log in logs:
        source = log.with_suffix(".source.txt")
        assert source.exists(), f"{log.name} has no {source.name}"
        text = source.read_text(encoding="utf-8")
        assert "source: https://github.com/" in text and f"file: {log.name}" in text


def test_the_healthy_plan_evidence_has_no_fault():
    for backend in ("mp", "ray"):
        report = diagnose(CATALOG, healthy_cluster(backend))
        assert report["faults"] == 0, [f["id"] for f in report["findings"]]


# Issue 23, item 7: excerpts of the start-up failures operators hit most, each with the cause its thread confirms
# (the .source.txt's 'confirmed cause:'), and the signature that must name it first.
NEW_EXCERPTS = {
    "bonito7-kv-cache-below-max-seq-len.log": "kv_cache_too_small",
    "tpuinference223-kv-cache-needed-above-available.log": "kv_cache_too_small",
    "longvt9-max-model-len-above-derived.log": "max_model_len_exceeds_model",
    "vllm-pr19660-max-model-len-above-derived.log": "max_model_len_exceeds_model",
    "vlmr1-289-tcpstore-port-in-use.log": "port_in_use",
    "pipelinerl27-tcpstore-port-race.log": "port_in_use",
    "vllm9531-trust-remote-code.log": "trust_remote_code_required",
    "vllm5244-trust-remote-code-local-path.log": "trust_remote_code_required",
    "transformers13472-cache-permission-denied.log": "path_permission_denied",
    "vllm1772-nvidia-driver-too-old.log": "cuda_driver_too_old",
    "chatglm3-100-nvidia-driver-too-old.log": "cuda_driver_too_old",
    "echomimic100-safetensors-header-too-large.log": "model_weights_corrupt",
    "omniparser34-safetensors-header-too-large.log": "model_weights_corrupt",
    "exllama242-safetensors-header-too-large.log": "model_weights_corrupt",
    "llamafactory4960-bf16-v100.log": "gpu_compute_capability_unsupported",
    "vllm1284-bf16-p100-compute-capability.log": "gpu_compute_capability_unsupported",
    "gpustack1640-ray-version-mismatch.log": "ray_version_mismatch",
    "awsdoeks50-gloo-loopback-connectfullmesh.log": "gloo_connect_failed",
    "vllm19793-transformers-unknown-model-type.log": "runtime_too_old_for_model",
    "vllm1986-hub-unreachable-offline.log": "model_fetched_from_hub",
    "vllm1432-hub-unreachable-offline.log": "model_fetched_from_hub",
}
# Classes with a single public excerpt so far (a second source with a confirmed cause was not found).
ONE_SOURCE = {"path_permission_denied", "runtime_too_old_for_model"}


def test_the_new_excerpts_say_which_cause_their_thread_confirmed():
    assert len(NEW_EXCERPTS) >= 20
    for name in NEW_EXCERPTS:
        text = (PUBLIC / name).with_suffix(".source.txt").read_text(encoding="utf-8")
        confirmed = [line for line in text.splitlines() if line.startswith("confirmed cause: ")]
        assert confirmed and len(confirmed[0]) > len("confirmed cause: ") + 20, name


def test_every_class_of_the_new_excerpts_is_tested_on_two_sources():
    # the earlier excerpts of the classes that were known before
    earlier = {"logicrl30-ray-python-version-mismatch.log": "ray_version_mismatch",
               "vllm7074-gloo-wrong-nic-connectfullmesh.log": "gloo_connect_failed"}
    sources = {}
    for name, expected in {**NEW_EXCERPTS, **earlier}.items():
        text = (PUBLIC / name).with_suffix(".source.txt").read_text(encoding="utf-8")
        sources.setdefault(expected, set()).add(next(line for line in text.splitlines() if line.startswith("source: ")))
    for expected, found in sources.items():
        if expected not in ONE_SOURCE:
            assert len(found) >= 2, (expected, found)


@pytest.mark.parametrize(
    ("fixture", "backend", "node", "unit", "expected"),
    [
        ("vllm6042-nccl-watchdog-timeout.log", "mp", "node2", "vllm.service", "nccl_watchdog_timeout"),
        ("gpustack1254-vllm-cuda-error-802.log", "mp", "node1", "vllm.service", "fabric_manager_down"),
        ("vllm7074-gloo-wrong-nic-connectfullmesh.log", "ray", "node1", "vllm.service", "gloo_connect_failed"),
        ("vllm14111-no-available-node-types-placement-group.log", "ray", "node1", "vllm.service",
         "vllm_host_ip_mismatch"),
        ("gpustack5509-placement-group-pending.log", "ray", "node1", "vllm.service", "placement_group_unsatisfiable"),
        ("vllm-pr43095-unique-ip.log", "ray", "node1", "vllm.service", "vllm_host_ip_mismatch"),
        ("logicrl30-ray-python-version-mismatch.log", "ray", "node2", "ray-worker.service", "ray_version_mismatch"),
        ("vllm4383-nccl-shm-segment.log", "mp", "node1", "vllm.service", "shm_too_small"),
        ("nccl1466-vllm-unhandled-system-error.log", "mp", "node1", "vllm.service", "nccl_system_error"),
        ("vllm33297-free-memory-gpu-busy.log", "mp", "node1", "vllm.service", "gpu_memory_busy"),
        ("vllm19670-tcpstore-client-timeout.log", "mp", "node2", "vllm.service", "rendezvous_port_blocked"),
        ("dynamo4934-tp-larger-than-gpus.log", "mp", "node1", "vllm.service", "world_size_exceeds_gpus"),
        ("dynamo4941-model-missing-on-ray-worker.log", "ray", "node1", "vllm.service", "model_missing"),
        ("gpustack5056-ray-tp-exceeds-gpus.log", "ray", "node1", "vllm.service", "world_size_exceeds_gpus"),
        ("pytorch111424-nccl-ib-no-device-socket.log", "mp", "node1", "vllm.service", "nccl_socket_where_ib_declared"),
        ("areal639-nccl-net-socket-bond.log", "mp", "node2", "vllm.service", "nccl_socket_where_ib_declared"),
        # issue 23, item 7: the start-up failures operators hit most, each class from two sources where they exist
        ("bonito7-kv-cache-below-max-seq-len.log", "mp", "node1", "vllm.service", "kv_cache_too_small"),
        ("tpuinference223-kv-cache-needed-above-available.log", "mp", "node1", "vllm.service", "kv_cache_too_small"),
        ("longvt9-max-model-len-above-derived.log", "mp", "node1", "vllm.service", "max_model_len_exceeds_model"),
        ("vllm-pr19660-max-model-len-above-derived.log", "mp", "node1", "vllm.service", "max_model_len_exceeds_model"),
        ("vlmr1-289-tcpstore-port-in-use.log", "mp", "node1", "vllm.service", "port_in_use"),
        ("pipelinerl27-tcpstore-port-race.log", "mp", "node1", "vllm.service", "port_in_use"),
        ("vllm9531-trust-remote-code.log", "mp", "node1", "vllm.service", "trust_remote_code_required"),
        ("vllm5244-trust-remote-code-local-path.log", "mp", "node1", "vllm.service", "trust_remote_code_required"),
        ("transformers13472-cache-permission-denied.log", "mp", "node2", "vllm.service", "path_permission_denied"),
        ("vllm1772-nvidia-driver-too-old.log", "mp", "node1", "vllm.service", "cuda_driver_too_old"),
        ("chatglm3-100-nvidia-driver-too-old.log", "mp", "node2", "vllm.service", "cuda_driver_too_old"),
        ("echomimic100-safetensors-header-too-large.log", "mp", "node1", "vllm.service", "model_weights_corrupt"),
        ("omniparser34-safetensors-header-too-large.log", "mp", "node2", "vllm.service", "model_weights_corrupt"),
        ("exllama242-safetensors-header-too-large.log", "ray", "node1", "vllm.service", "model_weights_corrupt"),
        ("llamafactory4960-bf16-v100.log", "mp", "node1", "vllm.service", "gpu_compute_capability_unsupported"),
        ("vllm1284-bf16-p100-compute-capability.log", "mp", "node1", "vllm.service",
         "gpu_compute_capability_unsupported"),
        ("gpustack1640-ray-version-mismatch.log", "ray", "node1", "vllm.service", "ray_version_mismatch"),
        ("awsdoeks50-gloo-loopback-connectfullmesh.log", "ray", "node1", "vllm.service", "gloo_connect_failed"),
        ("vllm19793-transformers-unknown-model-type.log", "mp", "node1", "vllm.service", "runtime_too_old_for_model"),
        ("vllm1986-hub-unreachable-offline.log", "mp", "node1", "vllm.service", "model_fetched_from_hub"),
        ("vllm1432-hub-unreachable-offline.log", "ray", "node1", "vllm.service", "model_fetched_from_hub"),
    ],
)
def test_public_log_is_diagnosed_as_the_top_finding(fixture, backend, node, unit, expected):
    evidence = with_log(healthy_cluster(backend), fixture, node=node, unit=unit)
    finding, report = top(evidence)
    assert finding["id"] == expected, ids(report)
    assert finding["severity"] == "fault"
    assert node in finding["nodes"]
    quoted = " || ".join(item["line"] for item in finding["evidence"])
    fixture_lines = [line.strip() for line in (PUBLIC / fixture).read_text(encoding="utf-8").splitlines() if line.strip()]
    assert any(line in quoted for line in fixture_lines), "the finding quotes no line of the log"
    assert "{" not in finding["title"] and "{" not in finding["fix"], finding
    assert finding["verify"] and "{" not in finding["verify"] and "{" not in finding["cause"], finding


def test_the_version_mismatch_quotes_both_versions():
    evidence = with_log(healthy_cluster("ray"), "logicrl30-ray-python-version-mismatch.log", node="node2",
                        unit="ray-worker.service")
    finding, _ = top(evidence)
    quoted = finding["evidence"][0]["line"]
    assert quoted.startswith("RuntimeError: Version mismatch: The cluster was started with:")
    assert "Ray: 2.12.0 | Python: 3.11.11 | This process on node 10.123.3.87 was started with: | Ray: 2.42.0" in quoted


def test_unit_failure_is_a_consequence_not_the_cause():
    evidence = with_log(healthy_cluster(), "vllm6042-nccl-watchdog-timeout.log", node="node2")
    report = diagnose(CATALOG, evidence)
    assert ids(report)[:2] == ["nccl_watchdog_timeout", "unit_failed"]
    assert report["findings"][1]["explained_by"] == ["nccl_watchdog_timeout"]


def test_watchdog_names_the_timeout_line_first():
    evidence = with_log(healthy_cluster(), "vllm6042-nccl-watchdog-timeout.log", node="node2")
    finding, _ = top(evidence)
    assert "Watchdog caught collective operation timeout" in finding["evidence"][0]["line"]
    assert finding["evidence"][0]["source"] == "journal vllm.service"


def test_gloo_on_the_management_nic_ranks_the_env_above_the_gloo_error():
    evidence = with_log(healthy_cluster("ray"), "vllm7074-gloo-wrong-nic-connectfullmesh.log")
    for node in ("node1", "node2"):
        set_env(evidence, node, GLOO_SOCKET_IFNAME="eth0", NCCL_SOCKET_IFNAME="eth0", TP_SOCKET_IFNAME="eth0")
        evidence["nodes"][node]["gather"]["interfaces"]["eth0"] = {"state": "UP", "mtu": 1500,
                                                                  "addresses": ["10.231.9.11/24"]}
    finding, report = top(evidence)
    assert finding["id"] == "socket_ifname_wrong_nic"
    assert finding["nodes"] == ["node1", "node2"]
    assert "GLOO_SOCKET_IFNAME=eth0" in " ".join(item["line"] for item in finding["evidence"])
    assert "eth1" in finding["cause"]
    gloo = next(f for f in report["findings"] if f["id"] == "gloo_connect_failed")
    assert gloo["explained_by"] == ["socket_ifname_wrong_nic"]


def test_a_foreign_gpu_process_explains_the_free_memory_error():
    evidence = with_log(healthy_cluster(), "vllm33297-free-memory-gpu-busy.log")
    # What nvidia-smi -q -x shows on a loaded GPU (real capture, h200x2-load), as gpu_facts summarizes it.
    xml = (REPO / "tests/fixtures/gpu/h200x2-load/nvidia-smi-q-load.xml").read_text(encoding="utf-8")
    facts = nvidia_smi.summarize_gpus(nvidia_smi_query.parse_query_xml(xml))
    assert facts["processes"], "the capture shows processes"
    evidence["nodes"]["node1"]["gpu"] = facts
    finding, report = top(evidence)
    assert finding["id"] == "gpu_held_by_foreign_process"
    assert ids(report).index("gpu_memory_busy") > 0
    assert str(facts["processes"][0]["pid"]) in finding["evidence"][0]["line"]


def test_socket_transport_is_a_fault_only_where_ib_is_declared():
    evidence = with_log(healthy_cluster("mp", ib=False), "areal639-nccl-net-socket-bond.log", failing=False)
    report = diagnose(CATALOG, evidence)
    assert "nccl_socket_where_ib_declared" not in ids(report)


def test_nccl_debug_socket_paths_from_nccl_issue_with_ib_declared():
    # A real NCCL_DEBUG=INFO run whose inter-node links go 'via NET/Socket/0' (tests/fixtures/nccl/public).
    evidence = healthy_cluster("mp", ib=True)
    lines = (REPO / "tests/fixtures/nccl/public/nccl1232-2node-socket-shm-excerpt.log").read_text().splitlines()
    evidence["nodes"]["node2"]["gather"]["journal"]["vllm.service"] = lines
    finding, _ = top(evidence)
    assert finding["id"] == "nccl_socket_where_ib_declared"
    assert any("via NET/Socket" in item["line"] for item in finding["evidence"])


def test_a_down_ib_port_explains_the_socket_fallback():
    # A real ibstat with ports down (gpud, H100 12 HCAs, 3 down/disabled); the inventory declares two of them.
    text = (REPO / "tests/fixtures/ib/public/gpud-ibstat-h100-12hca-3-down-disabled.txt").read_text()
    facts = ibstat.summarize_ib(ibstat.parse_ibstat(text))
    down = {port["ca"] for port in facts["ports"] if port["state"] != "Active"}
    declared = sorted(down)[:2]
    evidence = with_log(healthy_cluster("mp", ib=True, hcas=declared), "pytorch111424-nccl-ib-no-device-socket.log",
                        failing=False)
    evidence["nodes"]["node1"]["ib"] = facts
    finding, report = top(evidence)
    assert finding["id"] == "ib_port_down"
    assert declared[0] in finding["evidence"][0]["line"]
    assert ids(report).index("nccl_socket_where_ib_declared") > ids(report).index("ib_port_down")


def test_a_failing_nvidia_smi_on_a_cuda_node_is_a_fault():
    evidence = healthy_cluster("mp")
    # A real nvidia-smi failure (h200x2-load: `nvidia-smi -i 7 -q -x` exited 6), in gpu_facts' failure message.
    error = (REPO / "tests/fixtures/gpu/h200x2-load/error-bad-index.txt").read_text().strip()
    evidence["nodes"]["node2"]["gpu"] = {"error": f"host node2: 'nvidia-smi -q -x' exited with 6: {error}"}
    finding, _ = top(evidence)
    assert finding["id"] == "nvidia_smi_fails" and finding["nodes"] == ["node2"]
    assert "No devices were found" in finding["cause"]


RAW_CATALOG = yaml.safe_load((REPO / "roles" / "doctor" / "files" / "signatures.yml").read_text(encoding="utf-8"))


def catalog_without(*names):
    """The catalog less some signatures (and every 'explains' that names them)."""
    data = copy.deepcopy(RAW_CATALOG)
    data["signatures"] = [sig for sig in data["signatures"] if sig["id"] not in names]
    for sig in data["signatures"]:
        sig["explains"] = [name for name in sig.get("explains", []) if name not in names]
    return load_catalog(data)


@pytest.mark.parametrize("fixture", sorted(NEW_EXCERPTS))
def test_without_its_signature_another_finding_comes_first(fixture):
    """The top-finding check can fail: without the signature that names the cause, something else ranks first."""
    expected = NEW_EXCERPTS[fixture]
    backend = "ray" if fixture.startswith(("gpustack1640", "awsdoeks50", "exllama242", "vllm1432")) else "mp"
    evidence = with_log(healthy_cluster(backend), fixture)
    report = diagnose(catalog_without(expected), evidence)
    assert report["findings"] and report["findings"][0]["id"] != expected


@pytest.mark.parametrize(
    ("fixture", "signature", "first_exception"),
    [
        # a traceback chained to the API server's: the generic finding quotes the first exception, not the last frame
        ("vllm5244-trust-remote-code-local-path.log", "trust_remote_code_required",
         "ValueError: Loading /models/huggingface/Phi-3-small-128k-instruct/ requires you to execute"),
        # "During handling of the above exception, another exception occurred:" and a caller's traceback after it
        ("echomimic100-safetensors-header-too-large.log", "model_weights_corrupt",
         "safetensors_rust.SafetensorError: Error while deserializing header: HeaderTooLarge"),
    ],
)
def test_the_generic_fallback_quotes_the_first_exception_of_the_chain(fixture, signature, first_exception):
    evidence = with_log(healthy_cluster("mp"), fixture)
    report = diagnose(catalog_without(signature), evidence)
    finding = report["findings"][0]
    assert finding["id"] == "unit_failed", ids(report)
    assert f"last error: {first_exception}" in finding["evidence"][0]["line"]
    assert any(item["line"].startswith(("raise ValueError( | " + first_exception, "with safe_open"))
               and first_exception in item["line"] for item in finding["evidence"][1:])
    assert "Traceback" not in finding["evidence"][0]["line"] and "File \"" not in finding["evidence"][0]["line"]


def test_a_finding_carries_the_command_that_checks_the_fix():
    evidence = with_log(healthy_cluster("mp"), "longvt9-max-model-len-above-derived.log")
    finding, _ = top(evidence)
    assert finding["id"] == "max_model_len_exceeds_model"
    assert "32768" in finding["title"] and "131072" in finding["title"]
    assert "systemctl show -p ExecStart vllm.service" in finding["verify"] and "node1" in finding["verify"]


def test_the_tcpstore_bind_failure_names_its_port():
    evidence = with_log(healthy_cluster("mp"), "vlmr1-289-tcpstore-port-in-use.log")
    finding, _ = top(evidence)
    assert finding["id"] == "port_in_use"
    assert "port 29500" in finding["cause"] and ":29500" in finding["verify"]
