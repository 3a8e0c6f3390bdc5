"""deploy.yml's fast path: stage stamps, what invalidates them, and which stages a run skips."""

import json
import os
import subprocess

from ansible_collections.vllm_ops.cluster.plugins.filter.stage_stamp import stages_to_run as stages_filter
from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy import stage_stamp as stamps
from test_facts_modules import REPO, run_local_tasks


def run(argv):
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def record(paths=(), units=(), probes=()):
    return stamps.stamp_document("vllm", "d1", stamps.collect_evidence(list(paths), list(units), list(probes), run),
                                 "2026-11-30T00:00:00Z")


def again(stamp):
    return stamps.collect_again(stamp, run)


def test_a_stamp_holds_until_a_file_probe_or_input_changes(tmp_path):
    env = tmp_path / "vllm.env"
    env.write_text("VLLM_HOST_IP=10.0.0.1\n")
    drop_ins = tmp_path / "vllm.service.d"
    drop_ins.mkdir()
    stamp = record([str(env), str(drop_ins), str(tmp_path / "never")], probes=[["cat", str(env)]])
    assert stamps.differences(stamp, "d1", again(stamp)) == []
    assert stamps.differences(stamp, "d2", again(stamp)) == [
        "the inputs changed (plan, inventory variables or vllm-cluster's code)"]

    (drop_ins / "override.conf").write_text("[Service]\nExecStart=\n")
    assert stamps.differences(stamp, "d1", again(stamp)) == [f"{drop_ins}: override.conf changed"]
    (drop_ins / "override.conf").unlink()

    env.write_text("VLLM_HOST_IP=10.0.0.2\n")
    assert stamps.differences(stamp, "d1", again(stamp)) == [f"{env} changed", f"`cat {env}` answers differently"]
    env.unlink()
    assert stamps.differences(stamp, "d1", again(stamp))[0] == f"{env} is gone"
    (tmp_path / "never").write_text("")
    assert f"{tmp_path / 'never'} appeared" in stamps.differences(stamp, "d1", again(stamp))


def test_a_mode_change_counts_and_large_files_are_fingerprinted_without_reading(tmp_path):
    small, large = tmp_path / "config.json", tmp_path / "model.safetensors"
    small.write_text("{}")
    with open(large, "wb") as handle:
        handle.truncate(stamps.HASH_LIMIT + 1)
    stamp = record([str(small), str(large)])
    assert "sha256=" in stamp["evidence"]["paths"][str(small)]
    assert f"size={stamps.HASH_LIMIT + 1}" in stamp["evidence"]["paths"][str(large)]
    os.chmod(small, 0o600)
    os.utime(large, ns=(1, 1))
    assert stamps.differences(stamp, "d1", again(stamp)) == [f"{small} changed", f"{large} changed"]


def test_a_unit_that_stopped_or_restarted_is_named():
    shown = "ActiveState=active\nSubState=running\nInvocationID=0a1b2c3d4e5f\n"
    was = stamps.unit_evidence(shown)
    assert was == {"active_state": "active", "sub_state": "running", "invocation": "0a1b2c3d4e5f"}
    stamp = {"format": stamps.FORMAT, "digest": "d", "evidence": {"units": {"vllm.service": was}}}
    restarted = {"units": {"vllm.service": dict(was, invocation="99887766aabb")}}
    stopped = {"units": {"vllm.service": dict(was, active_state="failed", invocation="")}}
    assert stamps.differences(stamp, "d", {"units": {"vllm.service": was}}) == []
    assert stamps.differences(stamp, "d", restarted) == ["vllm.service restarted since (invocation 0a1b2c3d -> 99887766)"]
    assert stamps.differences(stamp, "d", stopped) == ["vllm.service is failed (was active)"]
    assert stamps.differences(None, "d", None) == ["no record of a completed run"]
    assert stamps.differences({"format": "unreadable"}, "d", None)[0].startswith("stamp format unreadable")


def test_only_a_converged_prefix_of_stages_is_skipped_and_every_node_must_agree():
    converged = {stage: [] for stage in stamps.STAGES}
    both = {"node1": dict(converged), "node2": dict(converged)}
    assert stamps.stages_to_run(both) == {"skip": list(stamps.STAGES), "run": [], "reasons": {}, "unhealthy": []}
    # vllm.env gone on node2: vllm and everything after it run, even though verify still holds there.
    both["node2"] = dict(converged, vllm=["/etc/vllm-cluster/vllm.env is gone"])
    decision = stamps.stages_to_run(both)
    assert decision["skip"] == ["preflight", "network", "firewall", "runtime", "ray"]
    assert decision["run"] == ["vllm", "verify"]
    assert decision["reasons"] == {"vllm": ["node2: /etc/vllm-cluster/vllm.env is gone"]}
    # An earlier stage that does not hold runs every later stage too.
    both["node1"] = dict(converged, network=["/etc/vllm-cluster/env changed"])
    assert stamps.stages_to_run(both)["skip"] == ["preflight"]
    assert stamps.stages_to_run({"node1": converged}, force=True)["skip"] == []
    # --tags vllm,verify clears (runs) only those; other tags clear every stage.
    assert stamps.stages_to_run({"node1": converged}, force=True, tags=["verify", "vllm"])["run"] == ["vllm", "verify"]
    assert stamps.stages_to_run({"node1": converged}, force=True, tags=["vllm_service_configure"])["run"] == list(
        stamps.STAGES)
    assert stamps.stages_to_run({})["skip"] == []


def test_the_filter_reads_the_module_results_and_says_what_runs_and_why():
    held = {stage: {"reasons": [], "recorded_at": "t1"} for stage in stamps.STAGES}
    converged = stages_filter({"node1": held, "node2": held})
    assert converged["run"] == []
    assert converged["summary"] == ["converged on every node, skipped: " + ", ".join(stamps.STAGES),
                                    "nothing to do: every stage holds on every node",
                                    "vLLM runs the processes verified at t1 (node1), t1 (node2)"]
    gone = dict(held, vllm={"reasons": ["/etc/vllm-cluster/vllm.env is gone"], "recorded_at": "t0"})
    partial = stages_filter({"node1": held, "node2": gone})
    assert partial["summary"] == ["converged on every node, skipped: preflight, network, firewall, runtime, ray",
                                  "runs: vllm, verify", "  vllm because node2: /etc/vllm-cluster/vllm.env is gone"]
    assert stages_filter({"node1": held, "node2": {}})["skip"] == []
    # The mp backend has no ray stage: a missing ray stamp does not stop the fast path there.
    mp = [stage for stage in stamps.STAGES if stage != "ray"]
    no_ray = {stage: entry for stage, entry in held.items() if stage != "ray"}
    assert stages_filter({"node1": no_ray}, stages=mp) == dict(stages_filter({"node1": held}), skip=mp, summary=[
        "converged on every node, skipped: " + ", ".join(mp), "nothing to do: every stage holds on every node",
        "vLLM runs the processes verified at t1 (node1)"])
    forced = stages_filter({"node1": held}, forced_by="-e vllm_cluster_full_run=true")
    assert forced["run"] == list(stamps.STAGES)
    assert forced["summary"] == ["no stage skipped: -e vllm_cluster_full_run=true", "runs: " + ", ".join(stamps.STAGES)]


def test_the_input_digest_follows_the_plan_the_variables_and_the_code(tmp_path):
    plan = {"tp": 2, "nodes": [{"host": "node1"}]}
    base = stamps.inputs_digest(plan, {"a": 1, "b": [1, 2]}, "c")
    assert base == stamps.inputs_digest(dict(reversed(list(plan.items()))), {"b": [1, 2], "a": 1}, "c")
    assert base != stamps.inputs_digest(dict(plan, tp=1), {"a": 1, "b": [1, 2]}, "c")
    assert base != stamps.inputs_digest(plan, {"a": 2, "b": [1, 2]}, "c")
    assert base != stamps.inputs_digest(plan, {"a": 1, "b": [1, 2]}, "d")

    for part in ("roles/r/tasks", "plugins", "playbooks"):
        (tmp_path / part).mkdir(parents=True)
    (tmp_path / "deploy.yml").write_text("---\n")
    (tmp_path / "roles/r/tasks/main.yml").write_text("---\n")
    code = stamps.code_digest(tmp_path)
    (tmp_path / "plugins/__pycache__").mkdir()
    (tmp_path / "plugins/__pycache__/x.pyc").write_bytes(b"\0")
    assert stamps.code_digest(tmp_path) == code
    (tmp_path / "roles/r/tasks/main.yml").write_text("---\n- name: new\n")
    changed = stamps.code_digest(tmp_path)
    assert changed != code
    # A checkout's deploy.yml does not ship: the collection built from the checkout has the same digest.
    (tmp_path / "deploy.yml").write_text("---\n- name: a checkout's entry point only\n")
    (tmp_path / "MANIFEST.json").write_text("{}\n")
    assert stamps.code_digest(tmp_path) == changed
    assert stamps.code_digest(REPO) == stamps.code_digest(REPO)


def test_the_module_records_checks_and_clears_through_ansible(tmp_path):
    env = tmp_path / "vllm.env"
    env.write_text("A=1\n")
    stamp_dir = tmp_path / "stages"
    common = {"dir": str(stamp_dir)}
    tasks = [
        {"name": "record in check mode", "check_mode": True, "vllm_ops.cluster.stage_stamp": dict(
            common, state="record", stage="vllm", digest="d1", paths=[str(env)], probes=[["cat", str(env)]])},
        {"name": "record", "vllm_ops.cluster.stage_stamp": dict(
            common, state="record", stage="vllm", digest="d1", paths=[str(env)], probes=[["cat", str(env)]])},
        {"name": "record again", "vllm_ops.cluster.stage_stamp": dict(
            common, state="record", stage="vllm", digest="d1", paths=[str(env)], probes=[["cat", str(env)]])},
        {"name": "check", "vllm_ops.cluster.stage_stamp": dict(common, stages=["runtime", "vllm"], digest="d1")},
        {"name": "edit", "ansible.builtin.copy": {"content": "A=2\n", "dest": str(env)}},
        {"name": "check after edit", "vllm_ops.cluster.stage_stamp": dict(common, stages=["vllm"], digest="d1")},
        {"name": "clear", "vllm_ops.cluster.stage_stamp": dict(common, state="absent", stages=["vllm", "verify"])},
        {"name": "unknown stage", "vllm_ops.cluster.stage_stamp": dict(common, stages=["vllmm"], digest="d1"),
         "ignore_errors": True},
        {"name": "record after the clear", "vllm_ops.cluster.stage_stamp": dict(
            common, state="record", stage="vllm", digest="d2", paths=[str(env)])},
    ]
    result = run_local_tasks(tmp_path, tasks)
    assert result["record in check mode"]["changed"] and result["record"]["changed"]
    assert not result["record again"]["changed"]
    assert result["check"]["stages"]["vllm"]["reasons"] == []
    assert result["check"]["stages"]["runtime"]["reasons"] == ["no record of a completed run"]
    assert result["check after edit"]["stages"]["vllm"]["reasons"] == [
        f"{env} changed", f"`cat {env}` answers differently"]
    assert result["clear"]["removed"] == [str(stamp_dir / "vllm.json")]
    # Root only: the digest covers the inventory's variables.
    assert oct(stamp_dir.stat().st_mode & 0o777) == "0o700"
    assert oct((stamp_dir / "vllm.json").stat().st_mode & 0o777) == "0o600"
    recorded = json.loads((stamp_dir / "vllm.json").read_text())
    assert recorded["stage"] == "vllm" and recorded["digest"] == "d2" and str(env) in recorded["evidence"]["paths"]
    assert result["unknown stage"]["failed"] and "unknown stage(s) vllmm" in result["unknown stage"]["msg"]



def test_a_directory_owner_or_mode_change_is_named_and_a_cache_dir_counts_only_by_its_owner(tmp_path):
    home = tmp_path / "home"
    (home / ".cache").mkdir(parents=True)
    os.chmod(home, 0o750)
    os.chmod(home / ".cache", 0o750)
    stamp = stamps.stamp_document("runtime", "d1", stamps.collect_evidence(
        [str(home)], [], [], run, dirs=[str(home / ".cache")]), "2026-11-30T00:00:00Z")
    uid, gid = os.getuid(), os.getgid()
    assert stamp["evidence"]["paths"][str(home)] == {"dir": {".cache": f"dir:750:{uid}:{gid}"},
                                                     "owner": f"750:{uid}:{gid}"}
    assert stamp["evidence"]["dirs"] == {str(home / ".cache"): f"750:{uid}:{gid}"}
    # What vLLM writes inside a cache directory changes nothing.
    (home / ".cache" / "vllm").mkdir()
    assert stamps.differences(stamp, "d1", again(stamp)) == []
    # The home's own mode, a child directory's mode, the cache directory's mode: each one is named.
    os.chmod(home, 0o755)
    assert stamps.differences(stamp, "d1", again(stamp)) == [f"{home}: mode:uid:gid 750:{uid}:{gid} -> 755:{uid}:{gid}"]
    os.chmod(home, 0o750)
    os.chmod(home / ".cache", 0o700)
    assert stamps.differences(stamp, "d1", again(stamp)) == [
        f"{home}: .cache changed", f"{home / '.cache'}: mode:uid:gid 750:{uid}:{gid} -> 700:{uid}:{gid}"]
    os.chmod(home / ".cache", 0o750)
    (home / ".cache" / "vllm").rmdir()
    (home / ".cache").rmdir()
    assert stamps.differences(stamp, "d1", again(stamp)) == [
        f"{home}: .cache changed", f"{home / '.cache'} is gone (was a directory, mode:uid:gid 750:{uid}:{gid})"]
    (home / ".cache").write_text("")
    assert stamps.differences(stamp, "d1", again(stamp))[-1].startswith(f"{home / '.cache'} is not a directory")
    # A stamp written before dirs were recorded still reads.
    old = {"format": stamps.FORMAT, "digest": "d1", "evidence": {"paths": {}, "units": {}, "probes": {}}}
    assert stamps.differences(old, "d1", again(old)) == []


def test_an_unhealthy_deployment_skips_nothing_and_the_summary_names_each_finding():
    held = {stage: {"reasons": [], "recorded_at": "t1"} for stage in stamps.STAGES}
    healthy = stages_filter({"node1": held, "node2": held}, health={"node1": [], "node2": []})
    # The stamps would skip every stage: the controller's completion is still wanted.
    assert healthy["skip"] == list(stamps.STAGES) and healthy["probe"] is True
    after_probe = stages_filter({"node1": held, "node2": held}, health={"node1": [], "node2": []}, client=[])
    assert after_probe["skip"] == list(stamps.STAGES) and after_probe["probe"] is False
    stopped = stages_filter({"node1": held, "node2": held},
                            health={"node1": [], "node2": ["vllm.service processes stopped (pids 123, 456 in state T)"]})
    assert stopped["skip"] == [] and stopped["run"] == list(stamps.STAGES) and stopped["probe"] is False
    assert stopped["summary"] == [
        "no stage skipped: the deployment is not healthy",
        "  node2: vllm.service processes stopped (pids 123, 456 in state T)",
        "runs: " + ", ".join(stamps.STAGES)]
    timed_out = stages_filter({"node1": held}, health={"node1": []},
                              client=["controller: POST http://10.0.0.1:8000/v1/completions timed out after 10 s"])
    assert timed_out["skip"] == []
    assert timed_out["unhealthy"] == ["controller: POST http://10.0.0.1:8000/v1/completions timed out after 10 s"]
    assert timed_out["summary"][:2] == [
        "no stage skipped: the deployment is not healthy",
        "  controller: POST http://10.0.0.1:8000/v1/completions timed out after 10 s"]
    # A stage that runs anyway needs no completion: nothing more to ask.
    gone = dict(held, preflight={"reasons": ["no record of a completed run"], "recorded_at": None})
    assert stages_filter({"node1": gone}, health={"node1": []})["probe"] is False


def test_the_check_removes_only_stamps_that_no_longer_hold_and_reads_the_files_asked(tmp_path):
    env, plan = tmp_path / "vllm.env", tmp_path / "plan.json"
    env.write_text("A=1\n")
    plan.write_text('{"tp": 2}\n')
    stamp_dir = tmp_path / "stages"
    common = {"dir": str(stamp_dir)}
    check = dict(common, stages=["runtime", "vllm", "verify"], digest="d1", remove_stale=True,
                 read=[str(plan), str(tmp_path / "missing.json")])
    result = run_local_tasks(tmp_path, [
        {"name": "record vllm", "vllm_ops.cluster.stage_stamp": dict(
            common, state="record", stage="vllm", digest="d1", paths=[str(env)])},
        {"name": "record runtime", "vllm_ops.cluster.stage_stamp": dict(
            common, state="record", stage="runtime", digest="d1", paths=[str(plan)])},
        {"name": "edit", "ansible.builtin.copy": {"content": "A=2\n", "dest": str(env)}},
        {"name": "check in check mode", "check_mode": True, "vllm_ops.cluster.stage_stamp": check},
        {"name": "stale kept in check mode", "ansible.builtin.stat": {"path": str(stamp_dir / "vllm.json")}},
        {"name": "check", "vllm_ops.cluster.stage_stamp": check},
        {"name": "check again", "vllm_ops.cluster.stage_stamp": check},
    ])
    assert result["check in check mode"]["removed"] == [] and result["stale kept in check mode"]["stat"]["exists"]
    # vllm's stamp no longer holds (its file changed): removed; runtime's holds: kept; verify never had one.
    assert result["check"]["stages"]["vllm"]["reasons"] == [f"{env} changed"]
    assert result["check"]["removed"] == [str(stamp_dir / "vllm.json")] and not result["check"]["changed"]
    assert sorted(p.name for p in stamp_dir.iterdir()) == ["runtime.json"]
    assert result["check"]["stages"]["runtime"]["reasons"] == []
    assert result["check again"]["stages"]["vllm"]["reasons"] == ["no record of a completed run"]
    assert result["check again"]["removed"] == []
    assert result["check"]["files"] == {str(plan): '{"tp": 2}\n', str(tmp_path / "missing.json"): None}


def test_a_file_changed_in_a_child_directory_is_seen_and_a_hidden_one_counts_by_its_owner_only(tmp_path):
    model = tmp_path / "model"
    (model / "original").mkdir(parents=True)
    (model / ".fetch").mkdir()
    (model / "config.json").write_text("{}")
    (model / "original" / "consolidated.00.pth").write_bytes(b"x" * 100)
    stamp = stamps.stamp_document("runtime", "d1", stamps.collect_evidence([str(model)], [], [], run),
                                  "2026-11-30T00:00:00Z")
    (model / ".fetch" / "part").write_bytes(b"y")  # a transfer's part: not the model
    assert stamps.differences(stamp, "d1", again(stamp)) == []
    (model / "original" / "consolidated.00.pth").unlink()
    assert stamps.differences(stamp, "d1", again(stamp)) == [f"{model}: original changed"]
