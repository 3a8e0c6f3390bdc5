"""One stage table (plugins/module_utils/deploy/stages.py): deploy.yml, the stage playbooks, the roles' evidence
and docs/architecture.md follow it, and the skip and the record are written once (roles/deploy_stage)."""

import json
import os
import re
import subprocess

import pytest
import yaml
from ansible_collections.vllm_ops.cluster.plugins.filter.stage_stamp import deploy_stage, deploy_stages
from ansible_collections.vllm_ops.cluster.plugins.module_utils import launch
from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy import stage_stamp, stages
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import build_plan
from test_facts_modules import ANSIBLE, MODULE_PYTHON, REPO

ANSIBLE_PLAYBOOK = str(ANSIBLE.with_name("ansible-playbook"))

GPUS = {"count": 8, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "nvlink": True}
CLUSTER = [{"name": f"n{k}", "address": f"10.1.0.{k + 1}", "gpus": GPUS} for k in range(2)]
FIXED = [stage for stage in stages.STAGES if stage.name != stages.LAUNCH]


def load(path):
    return yaml.safe_load((REPO / path).read_text())


def plan_of(backend):
    return build_plan("llama-3.1-405b", CLUSTER, overrides={"backend": backend})


def test_every_plan_runs_the_fixed_stages_and_its_launch_modes_own():
    assert stages.names_for_plan(plan_of("mp")) == ["preflight", "network", "firewall", "runtime", "vllm", "verify"]
    rows = stages.for_plan(plan_of("ray"))
    assert [row["name"] for row in rows] == ["preflight", "network", "firewall", "runtime", "ray", "vllm", "verify"]
    assert rows[4] == {"name": "ray", "playbook": "playbooks/launch.yml", "role": "ray_cluster"}
    # A stamp may carry every stage of every mode; the module refuses others.
    assert stage_stamp.STAGES == stages.ALL_NAMES == ("preflight", "network", "firewall", "runtime", "ray", "vllm",
                                                      "verify")
    with pytest.raises(stage_stamp.StampError, match="unknown stage 'launch'"):
        stage_stamp.stamp_document("launch", "d", {}, "t")
    assert [row["role"] for row in deploy_stages(None, every=True)] == [
        "gpu_preflight", "nccl_network", "node_firewall", "vllm_runtime", "ray_cluster", "vllm_service", "vllm_verify"]
    assert deploy_stage("ray") == rows[4] and deploy_stage("verify", plan_of("mp"))["role"] == "vllm_verify"


def test_a_checkouts_deploy_yml_is_the_collections_playbook():
    # `ansible-playbook deploy.yml` from a checkout, `ansible-playbook vllm_ops.cluster.deploy` from an
    # installed collection (whose playbooks live in playbooks/): one list of imports, in playbooks/deploy.yml.
    (entry,) = load("deploy.yml")
    assert entry["ansible.builtin.import_playbook"] == "playbooks/deploy.yml" and set(entry) == {
        "name", "ansible.builtin.import_playbook"}, entry


def test_deploy_yml_imports_the_table_in_order_each_under_its_tag():
    # Imports are relative to playbooks/deploy.yml's directory; the table names paths from the collection's root.
    entries = load("playbooks/deploy.yml")
    assert all((REPO / "playbooks" / entry["ansible.builtin.import_playbook"]).is_file() for entry in entries)
    imports = [("playbooks/" + entry["ansible.builtin.import_playbook"], entry["tags"]) for entry in entries]
    assert imports[:2] == [("playbooks/plan.yml", ["plan", "always"]), ("playbooks/converged.yml", ["plan", "always"])]
    expected = []
    for stage in stages.STAGES:
        if stage.name == stages.LAUNCH:
            tags = [stages.LAUNCH] + [mode.stage for mode in launch.MODES.values() if mode.stage]
        else:
            tags = [stage.name]
        expected.append((stage.playbook, tags))
    assert imports[2:] == expected


def role_tags(role):
    """Every tag the role's main.yml puts on its phases, in order."""
    tags = []
    for task in load(f"roles/{role}/tasks/main.yml"):
        tags += [tag for tag in task.get("tags", []) if tag not in tags]
    return tags


def run_playbook(playbook, *args):
    """ansible-playbook with the project's config and the JSON callback: (exit status, the run's plays)."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json")
    result = subprocess.run([ANSIBLE_PLAYBOOK, str(playbook), *args], capture_output=True, text=True, timeout=120,
                            cwd=REPO, env=env, check=False)
    assert result.stdout.lstrip().startswith("{"), result.stdout[-3000:] + result.stderr[-2000:]
    return result.returncode, json.loads(result.stdout)["plays"]


def _plays_with_stage(playbook):
    return [play for play in load(playbook) if "deploy_stage_name" in (play.get("vars") or {})]


@pytest.mark.parametrize("stage", stages.STAGES, ids=[stage.name for stage in stages.STAGES])
def test_every_stage_playbook_skips_runs_its_role_and_records_the_same_way(stage):
    plays = _plays_with_stage(stage.playbook)
    assert plays, f"{stage.playbook} has no play with deploy_stage_name"
    for play in plays:
        name = play["vars"]["deploy_stage_name"]
        assert name == ("{{ __launch['stage'] }}" if stage.name == stages.LAUNCH else stage.name)
        skip = play["pre_tasks"][0]
        assert skip["ansible.builtin.import_role"] == {"name": "vllm_ops.cluster.deploy_stage", "tasks_from": "skip"}
        assert skip["tags"] == ["always"]
    final = plays[-1]
    assert final["post_tasks"][-1]["ansible.builtin.import_role"] == {"name": "vllm_ops.cluster.deploy_stage",
                                                                      "tasks_from": "record"}
    if stage.role:
        # Included in tasks, not listed under roles (a skipped stage costs no parse of its role), public so that
        # the record reads the role's evidence, and tagged with the role's own tags so --tags <role>_<phase> works.
        assert "roles" not in final, stage.playbook
        task = final["tasks"][-1]
        assert task["ansible.builtin.include_role"] == {"name": f"vllm_ops.cluster.{stage.role}", "public": True}
        assert task["tags"] == role_tags(stage.role), stage.playbook
    else:  # the launch slot: the mode's role, made public so that the record reads its evidence
        include = final["tasks"][0]["ansible.builtin.include_role"]
        assert include["name"] == "vllm_ops.cluster.{{ __launch['stage_role'] }}" and include["public"] is True


@pytest.mark.parametrize("role", sorted({row["role"] for row in deploy_stages(None, every=True)}))
def test_every_stage_role_declares_its_evidence_and_records_nothing_itself(role):
    evidence = load(f"roles/{role}/vars/main.yml")[f"__{role}_stage_evidence"]
    assert evidence and set(evidence) <= {"paths", "dirs", "units", "probes"}
    for tasks in (REPO / "roles" / role / "tasks").glob("*.yml"):
        text = tasks.read_text()
        assert "stage_stamp" not in text and "end_play" not in text and "end_batch" not in text, tasks


def test_the_skip_and_the_record_exist_once():
    users = []
    for path in list(REPO.glob("playbooks/*.yml")) + list(REPO.glob("roles/*/tasks/*.yml")) + [REPO / "deploy.yml"]:
        text = path.read_text()
        if re.search(r"ansible\.builtin\.meta: end_batch|vllm_ops\.cluster\.stage_stamp:\s*\n\s+state: record", text):
            users.append(str(path.relative_to(REPO)))
    assert sorted(users) == ["roles/deploy_stage/tasks/record.yml", "roles/deploy_stage/tasks/skip.yml"]


def test_the_architecture_page_lists_every_stage_of_the_table():
    text = (REPO / "docs" / "architecture.md").read_text()
    for stage in stages.STAGES:
        role = f"`{stage.role}`" if stage.role else "the launch mode's"
        row = next((line for line in text.splitlines() if line.startswith(f"| {stage.name} ")), None)
        assert row is not None, f"docs/architecture.md has no row for stage {stage.name}"
        assert f"`{stage.playbook}`" in row and role in row, row
        # What the stage owns, and how its stamp sees it: the table's last two columns are the stage table's.
        cells = [cell.strip() for cell in row.strip("|").split(" | ")]
        assert cells[-2:] == [stage.does, stage.evidence], row


def test_the_record_writes_the_evidence_the_stage_role_declares(tmp_path):
    # roles/deploy_stage's two task files through ansible-playbook, as a stage playbook runs them.
    probe = tmp_path / "probe.txt"
    probe.write_text("one\n")
    playbook = tmp_path / "stage.yml"
    stamps = tmp_path / "stamps"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False,
        # The plan's service section says where the deployment's stamps go (plan/build.py service).
        "vars": {"deploy_stage_name": "verify", "ansible_python_interpreter": MODULE_PYTHON,
                 "vllm_cluster_plan": {"service": {"stage_dir": str(stamps)}},
                 "__vllm_verify_stage_evidence": {"paths": [str(probe)], "probes": [["cat", str(probe)]]}},
        "pre_tasks": [{"ansible.builtin.import_role": {"name": "vllm_ops.cluster.deploy_stage", "tasks_from": "skip"}}],
        "tasks": [{"name": "The stage's role", "ansible.builtin.debug": {"msg": "ran"}}],
        "post_tasks": [{"ansible.builtin.import_role": {"name": "vllm_ops.cluster.deploy_stage",
                                                        "tasks_from": "record"}}],
    }]))

    def play(*extra):
        returncode, plays = run_playbook(playbook, "-i", "localhost,", "-c", "local", *extra)
        assert returncode == 0, plays
        return [task["task"]["name"] for entry in plays for task in entry["tasks"]
                if "localhost" in task["hosts"] and not task["hosts"]["localhost"].get("skipped")]

    # Outside deploy.yml (no digest) nothing is recorded.
    assert play() == ["The stage's role"]
    assert not stamps.exists()
    # Inside deploy.yml the stamp holds the declared evidence.
    assert play("-e", "vllm_cluster_stage_digest=d1")[-1].endswith("Record the stage on the node")
    written = json.loads((stamps / "verify.json").read_text())
    assert written["stage"] == "verify" and written["digest"] == "d1"
    assert list(written["evidence"]["paths"]) == [str(probe)]
    assert list(written["evidence"]["probes"]) == [f"cat {probe}"]
    # A stage converged.yml skipped ends its play before the role.
    assert play("-e", '{"vllm_cluster_stages_skipped": ["verify"]}') == []


def test_a_deployment_that_lost_a_node_stops_on_its_other_nodes_and_other_deployments_go_on(tmp_path):
    # Three local hosts: a and b form one deployment, c another; a fails in the first play. The stage play after
    # it runs one serial batch per deployment, as the fleet's stage plays do. Would fail if the skip let b run a
    # stage without a (a wait, then a second error), or ended c's deployment too.
    inventory = tmp_path / "hosts.yml"
    deployments = {"a": ["a", "b"], "b": ["a", "b"], "c": ["c"]}
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {
        name: {"ansible_connection": "local", "ansible_python_interpreter": MODULE_PYTHON,
               "vllm_cluster_deployment_hosts": hosts} for name, hosts in deployments.items()}}}))
    playbook = tmp_path / "stages.yml"
    playbook.write_text(yaml.safe_dump([
        {"hosts": "all", "gather_facts": False,
         "tasks": [{"name": "An earlier stage fails on a", "ansible.builtin.fail": {"msg": "broken"},
                    "when": "inventory_hostname == 'a'"}]},
        {"hosts": "all", "gather_facts": False, "serial": [2, 1], "vars": {"deploy_stage_name": "runtime"},
         "pre_tasks": [{"ansible.builtin.import_role": {"name": "vllm_ops.cluster.deploy_stage", "tasks_from": "skip"}}],
         "tasks": [{"name": "The stage's role", "ansible.builtin.debug": {"msg": "ran"}}]},
    ]))
    returncode, plays = run_playbook(playbook, "-i", str(inventory))
    assert returncode == 2, plays
    ran, said = [], []
    stage_tasks = [task for play in plays[1:] for task in play["tasks"]]  # a play per batch
    for task in stage_tasks:
        for host, outcome in task["hosts"].items():
            if task["task"]["name"] == "The stage's role":
                ran.append(host)
            elif outcome.get("msg") and not outcome.get("skipped"):
                said.append(outcome["msg"])
    assert ran == ["c"]
    assert said == ["runtime does not run on b: a of the same deployment failed or was unreachable earlier in this run "
                    "(its error above); fix that and run deploy.yml again"]


@pytest.mark.parametrize("role", ["gpu_preflight", "nccl_network", "node_firewall", "vllm_service"])
def test_a_phase_tag_alone_also_runs_the_preflight_whose_facts_it_reads(role):
    # `deploy.yml --tags node_firewall_verify` ran the verify phase alone, which failed on the policy the
    # preflight builds ('__node_firewall_policy' is undefined). The preflight carries every phase tag of its role.
    first = load(f"roles/{role}/tasks/main.yml")[0]
    assert f"{role}_preflight" in first["tags"], first
    assert first["tags"] == role_tags(role), first
    apply = (first.get("ansible.builtin.include_tasks") or {}).get("apply")
    if apply:
        assert apply["tags"] == role_tags(role), first
