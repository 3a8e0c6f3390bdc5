"""The README's main job as a newcomer runs it: `./scripts/demo` on a clean clone ends green.

The demo plans the seed's four examples, builds the tiny model, brings the README's lab up (lab/lab's default lab,
inventory inventories/lab/), runs deploy.yml on it, prints the verified topology, then sends a completion, a chat
completion and a streamed chat completion through the real `openai` client, by the served name in the plan it wrote.
This module runs it as it is, with no argument, when the shared lab is the README's lab (the default; another
VLLM_CLUSTER_SHARED_LAB passes `--lab NAME`). The lab stays up, deployed: it is the shared lab of the modules after
this one (conftest.shared_lab), and test_deploy reads the demo's deploy.yml as the lab's first deployment.

What could make it fail: the demo exiting non-zero anywhere (a plan, the lab, the deploy, any of the requests: it
runs with `set -e`), a request by a name vLLM does not serve (HTTP 404), a model without a chat template (HTTP 400
on chat), a stream that ends without its usage, or a demo that prints a served name other than the plan's.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from conftest import DEFAULT_LAB_NAME, Lab, claim_from_another_checkout, shared_lab_name

pytestmark = [pytest.mark.lab, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]
RUNTIME_PYTHON = REPO / ".venv-runtime" / "bin" / "python"
DEMO_TIMEOUT_S = 3000  # a fresh machine: the node image (about 2 min), the runtime install and vLLM's start
MAX_TOKENS = 8  # lab/openai_check.py's default, with ignore_eos
API_LINE = re.compile(r"^=== the API at (?P<url>\S+), model (?P<model>\S+) \(the served name in (?P<plan>\S+)\)", re.M)


def demo_argv(name: str) -> list[str]:
    """The README's command; another lab than the README's is named with --lab."""
    return [str(REPO / "scripts" / "demo")] + ([] if name == DEFAULT_LAB_NAME else ["--lab", name])


@pytest.fixture(scope="module")
def demo(request, tmp_path_factory) -> dict:
    name = shared_lab_name()
    claim_from_another_checkout(Lab(name, 3))  # a lab of this name left by another clone: down, start clean
    argv = demo_argv(name)
    log = tmp_path_factory.mktemp("demo") / "demo.log"
    with log.open("w") as sink:
        proc = subprocess.run(argv, stdout=sink, stderr=subprocess.STDOUT, text=True, timeout=DEMO_TIMEOUT_S,
                              check=False, cwd=REPO)
    output = log.read_text()
    print(f"{shlex.join(argv)} exited {proc.returncode}; its output: {log}")
    assert proc.returncode == 0, f"{shlex.join(argv)} exited {proc.returncode}:\n{output[-8000:]}"
    # The shared lab is the demo's, up and deployed; its deploy.yml is the lab's first of this run.
    lab = request.getfixturevalue("shared_lab")
    deploy_log = (REPO / ".cache" / "demo-deploy.log").read_text()
    lab.playbook_outputs.append((f"deploy.yml -i {lab.inventory} -e vllm_cluster_plan_output=true", deploy_log))
    return {"lab": lab, "output": output, "deploy": deploy_log}


def test_the_demo_ends_green_with_the_verified_topology(demo):
    output = demo["output"]
    for example in sorted(p.name for p in (REPO / "inventories" / "examples").iterdir() if p.is_dir()):
        assert f"=== plan {example}:" in output
    assert re.search(r"^  vLLM runs as planned: .* world_size=2 on node1, node2", output, re.M), output[-6000:]
    assert "MISMATCH" not in output
    assert "ok=" in demo["deploy"] and "failed=0" in demo["deploy"]


def test_every_request_uses_the_plans_served_name_and_gets_its_tokens(demo):
    output = demo["output"]
    api = API_LINE.search(output)
    assert api, output[-4000:]
    plan = json.loads((REPO / api["plan"]).read_text())
    assert api["model"] == plan["served_model_name"]
    assert api["url"].endswith(f":{plan['ports']['api']}/v1")
    assert f"served models: {plan['served_model_name']}" in output
    for request in ("completion", "chat completion", "streamed chat completion"):
        line = re.search(rf"^  {request} \((?P<tokens>\d+) tokens(?:, (?P<chunks>\d+) chunks)?, ", output, re.M)
        assert line, (request, output[-3000:])
        assert int(line["tokens"]) == MAX_TOKENS
        if request.startswith("streamed"):
            # The role, content deltas, the usage chunk; vLLM merges deltas when its API server falls behind.
            assert int(line["chunks"]) >= 3


def test_the_demos_last_step_fails_on_a_name_vllm_does_not_serve(demo):
    """The planted break: the demo's own client, the same head and key, a name that is not the plan's."""
    api = API_LINE.search(demo["output"])
    proc = subprocess.run([str(RUNTIME_PYTHON), str(REPO / "lab" / "openai_check.py"), "--base-url", api["url"],
                           "--model", "not-" + api["model"], "--api-key-file",
                           str(demo["lab"].inventory / "secrets" / "vllm-api-key")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "NotFoundError" in proc.stderr and f"not-{api['model']}" in proc.stderr, proc.stderr
