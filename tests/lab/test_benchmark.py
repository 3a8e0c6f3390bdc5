"""benchmark.yml end to end on the lab: the seed's baseline, a TP=2 stage and a 2-node stage, then the report.

One 2-node lab; each layout is deployed in turn (deploy.yml, re-planned with -e),
then benchmarked with the lab's load profile (inventories/lab/group_vars):

1. TP=1 on node 1, recorded as the baseline (the single-GPU anchor; the first
   deploy also installs the runtime);
2. TP=2 on node 1 (2 CPU worker slots);
3. the lab's own 2-node mp TP=2 (one worker per node).

The results go to a directory of the test's own. vLLM runs for real on its CPU
platform: the figures cannot meet the seed's GPU targets, and the verdict must
say so (never pass) without crashing. Then: a run under another profile is
refused before it loads anything, and --check records nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

# Three vLLM start-ups and three bench runs (559 s in a clean-clone CI run): extended, outside CI's budget
# (docs/lab.md). The bound covers the module's first test, which builds every stage. It runs right after
# test_hardening, on the default deployment it hands on (tests/lab/lab_order.py).
pytestmark = [pytest.mark.lab, pytest.mark.lab_extended, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / ".cache" / "models" / "tiny-llama"
RUNTIME_PYTHON = REPO / ".venv-runtime" / "bin" / "python"
LAB_PROFILE = REPO / "inventories" / "lab" / "group_vars" / "vllm_nodes.yml"  # vllm_benchmark_profile
DEPLOYMENT = "lab-tiny-llama"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

TP1 = ["-e", json.dumps({"vllm_cluster_tp": 1})]
ONE_NODE_TP2 = ["-e", json.dumps({"vllm_cluster_gpus": {"count": 2, "name": "cpu", "memory_total_mib": 4096,
                                                        "nvlink": False}})]
TWO_NODE_TP2: list[str] = []  # inventories/lab/group_vars: 2-node mp TP=2
STAGES = (("tp1", TP1), ("tp2", ONE_NODE_TP2), ("tp2-2nodes", TWO_NODE_TP2))


@pytest.fixture(scope="module")
def lab(shared_lab):
    """The run's one deployed lab (tests/lab/conftest.py: shared_lab)."""
    return shared_lab


@pytest.fixture(scope="module")
def results_root(lab_results):
    return lab_results  # shared: tests/lab/test_doctor.py's checklist reads these stages


def bench(lab, results_root, *args, check=True):
    return lab.ansible_playbook("playbooks/benchmark.yml", "-e", f"vllm_benchmark_results_dir={results_root}", *args,
                                check=check, timeout=900)


@pytest.fixture(scope="module")
def stages(lab, tiny_model, results_root):
    """Deploy and benchmark the three stages in the seed's order; return each benchmark run's output."""
    runs = {}
    # vllm_verify's own checks are tests/lab/test_deploy.py's; the benchmark proves the served model and the
    # worker processes per node under load itself, so the deploys here skip verify (CI time).
    lab.ansible_playbook("deploy.yml", *TP1, "--skip-tags", "verify", timeout=2400)
    runs["tp1"] = bench(lab, results_root, *TP1, "-e", "vllm_benchmark_baseline=true")
    for name, overrides in STAGES[1:]:
        lab.ansible_playbook("deploy.yml", *overrides, "--tags", "vllm", timeout=1500)
        runs[name] = bench(lab, results_root, *overrides)
    return runs


def record(results_root, name):
    return json.loads((results_root / DEPLOYMENT / f"{name}.json").read_text())


def verdicts(output: str) -> list[str]:
    """The lines the role prints in 'Show the verdicts'."""
    block = output[output.rindex("TASK [vllm_ops.cluster.vllm_benchmark : Show the verdicts]"):]
    block = block[block.index("{"): block.index("\n}\n") + 2]
    return json.loads(block)["msg"]


def test_each_stage_is_recorded_with_its_plan_versions_and_samples(stages, results_root):
    profile = yaml.safe_load(LAB_PROFILE.read_text())["vllm_benchmark_profile"]
    expected = {"tp1": (1, 1, ["node1"]), "tp2": (2, 1, ["node1"]), "tp2-2nodes": (2, 2, ["node1", "node2"])}
    fingerprints = set()
    for name, (tp, nodes, hosts) in expected.items():
        rec = record(results_root, name)
        assert rec["stage"] == name and rec["baseline"] is (name == "tp1")
        assert (rec["plan"]["tp"], rec["plan"]["nodes_used"]) == (tp, nodes)
        assert rec["result"]["completed"] == profile["num_prompts"] and rec["result"]["failed"] == 0
        assert rec["profile"]["num_prompts"] == profile["num_prompts"]
        assert rec["argv"][:3] == ["/opt/vllm-cluster/venv/bin/vllm", "bench", "serve"]
        assert sorted(rec["samples"]) == hosts and sorted(rec["versions"]) == hosts
        assert all(v["vllm"] == "0.32.0" for v in rec["versions"].values())
        assert rec["window"]["load_end"] - rec["window"]["load_start"] == pytest.approx(rec["result"]["duration"])
        fingerprints.add(rec["profile_fingerprint"])
        # the sampler stopped at its stop file, on every node
        assert all(lines[-1]["reason"] == "stop-file" for lines in rec["samples"].values())
    assert len(fingerprints) == 1
    # the 2-node stage ran its second worker on node 2: the sampler saw it there, under load
    titles = {w["title"] for line in record(results_root, "tp2-2nodes")["samples"]["node2"] for w in line.get("workers", [])}
    assert "VLLM::Worker_TP1" in titles


def test_the_verdict_is_honest_on_cpu_and_the_report_is_written(stages, results_root):
    lines = verdicts(stages["tp2-2nodes"].stdout)
    assert lines[0] == "overall: warn (baseline tp1)"
    rows = [line for line in lines if line.startswith("| tp")]
    assert [row.split(" | ")[0] for row in rows] == ["| tp1", "| tp2", "| tp2-2nodes"]
    assert all("CPU: not comparable to GPU targets" in row for row in rows)
    assert not any("| PASS" in row for row in rows)
    directory = results_root / DEPLOYMENT
    report = (directory / "report.md").read_text()
    assert "**CPU platform.**" in report and "never passed" in report
    assert "### tp2-2nodes: WARN, CPU: not comparable to GPU targets" in report
    assert "TP=2, 2 CPU workers on 2 nodes" in report
    # the 2-node TP=2 crosses nodes: the communication step names it whenever the targets are missed
    section = report[report.index("### tp2-2nodes"):]
    if "Troubleshooting" in section:
        assert "TP=2 spans nodes" in section
    # measured, not replayed: the CPU workers from /proc, the worker layout proven on both nodes
    assert "measured CPU use of each vLLM worker process" in report
    assert "| node2/Worker_TP1 |" in report
    assert "layout PASS (worker processes under load match the plan on every node)" in section
    for name in ("latency.png", "throughput.png", "utilization.png"):
        assert (directory / name).read_bytes()[:8] == PNG_MAGIC


def test_another_profile_is_refused_before_any_load(stages, results_root, lab):
    before = (results_root / DEPLOYMENT / "tp2-2nodes.json").stat().st_mtime_ns
    result = bench(lab, results_root, "-e", '{"vllm_benchmark_profile": {"input_len": 64, "output_len": 32, '
                                             '"num_prompts": 24, "request_rate": "inf", "max_concurrency": 8, '
                                             '"seed": 0, "num_warmups": 4}}', check=False)
    assert result.returncode != 0
    assert ("refused: stage 'tp2-2nodes' was measured under a different load profile than 'tp1': "
            "num_prompts (tp1: 48, tp2-2nodes: 24)") in result.stdout
    assert "Run vllm bench serve on the head node" not in result.stdout
    assert (results_root / DEPLOYMENT / "tp2-2nodes.json").stat().st_mtime_ns == before


def test_check_mode_records_nothing(stages, results_root, lab):
    directory = results_root / DEPLOYMENT
    before = {p.name: p.stat().st_mtime_ns for p in directory.iterdir()}
    result = bench(lab, results_root, "--check")
    assert "Run vllm bench serve on the head node" not in result.stdout
    assert {p.name: p.stat().st_mtime_ns for p in directory.iterdir()} == before
