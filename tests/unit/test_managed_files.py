"""vllm_service's one-run reads and writes: module_utils managed_files and host_state, and both modules through Ansible."""

import grp
import hashlib
import json
import os
import pwd
import stat
import subprocess

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy import host_state
from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy import managed_files as mf
from test_facts_modules import ANSIBLE, MODULE_PYTHON, REPO

OWNER = pwd.getpwuid(os.getuid()).pw_name
GROUP = grp.getgrgid(os.getgid()).gr_name


def entry(dest, **given):
    base = {"dest": str(dest), "state": "present", "content": None, "secret": False, "mode": "0644",
            "owner": OWNER, "group": GROUP, "backup": False, "diff": True}
    return {**base, **given}


def directory(path, mode="0755"):
    return {"path": str(path), "mode": mode, "owner": OWNER, "group": GROUP}


def apply(files, directories=(), check_mode=False, secrets=None):
    backups = []

    def backup(path):
        copy = f"{path}.bak{len(backups)}"
        with open(path, "rb") as old, open(copy, "wb") as new:
            new.write(old.read())
        backups.append(copy)
        return copy

    wanted_files, wanted_dirs = mf.normalize(list(files), list(directories), secrets)
    return mf.apply(wanted_files, wanted_dirs, check_mode, backup)


def test_files_are_created_then_left_alone_and_a_change_keeps_a_backup(tmp_path):
    conf = tmp_path / "etc" / "vllm-cluster"
    env, key = conf / "vllm.env", conf / "api-key.env"
    request = [entry(env, content="A=1\n", mode="0600", backup=True),
               entry(key, secret=True, mode="0600", backup=True)]
    secrets = {str(key): "VLLM_API_KEY=s3cret\n"}

    first = apply(request, [directory(conf)], secrets=secrets)
    assert first["changed"] and first["directories"][str(conf)]["changed"]
    assert first["files"][str(env)] == {"changed": True, "state": "present", "reasons": ["created"]}
    assert env.read_text() == "A=1\n" and stat.S_IMODE(env.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    # The env file's diff is shown, the key's content never.
    assert first["diff"][0] == {"before_header": str(env), "after_header": str(env), "before": "", "after": "A=1\n"}
    assert "s3cret" not in json.dumps(first) and "not shown" in first["diff"][1]["prepared"]

    again = apply(request, [directory(conf)], secrets=secrets)
    assert not again["changed"] and again["diff"] == []
    assert all(not f["changed"] for f in again["files"].values())

    changed = apply([entry(env, content="A=2\n", mode="0600", backup=True)])
    backup = changed["files"][str(env)]["backup_file"]
    assert changed["files"][str(env)]["reasons"] == ["content"]
    assert open(backup).read() == "A=1\n" and env.read_text() == "A=2\n"
    # Nothing but the file and its backup: the temporary file was renamed over the old one.
    assert sorted(p.name for p in conf.iterdir()) == sorted(["api-key.env", "vllm.env", os.path.basename(backup)])


def test_mode_only_changes_and_check_mode_writes_nothing(tmp_path):
    unit = tmp_path / "vllm.service"
    unit.write_text("[Unit]\n")
    unit.chmod(0o600)
    preview = apply([entry(unit, content="[Unit]\n", mode="0644")], check_mode=True)
    assert preview["files"][str(unit)]["reasons"] == ["mode 0600 -> 0644"] and preview["diff"] == []
    assert stat.S_IMODE(unit.stat().st_mode) == 0o600
    missing = tmp_path / "new.env"
    preview = apply([entry(missing, content="B=1\n")], [directory(tmp_path / "d")], check_mode=True)
    assert preview["changed"] and not missing.exists() and not (tmp_path / "d").exists()
    assert apply([entry(unit, content="[Unit]\n", mode="0644")])["files"][str(unit)]["changed"]
    assert stat.S_IMODE(unit.stat().st_mode) == 0o644


def test_absent_removes_a_file_and_a_missing_one_is_no_change(tmp_path):
    key = tmp_path / "api-key.env"
    key.write_text("VLLM_API_KEY=x\n")
    assert apply([entry(key, state="absent")])["files"][str(key)] == {"changed": True, "state": "absent",
                                                                        "reasons": ["removed"]}
    assert not key.exists()
    assert not apply([entry(key, state="absent")])["changed"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path):
    env = tmp_path / "vllm.env"
    env.write_text("A=1\n")

    def refuse(temporary, dest):
        raise OSError(13, "Permission denied", dest)

    wanted, _ = mf.normalize([entry(env, content="A=2\n")], [])
    with pytest.raises(OSError):
        mf.apply(wanted, [], False, lambda path: None, prepare=refuse)
    assert env.read_text() == "A=1\n" and [p.name for p in tmp_path.iterdir()] == ["vllm.env"]


@pytest.mark.parametrize("bad, message", [
    (entry("relative/vllm.env", content="x"), "file relative/vllm.env: expected an absolute path"),
    (entry("/etc/x.env", content="x", secret=True), "a secret file takes its text from secrets, not content"),
    (entry("/etc/x.env", secret=True), "marked secret, but secrets has no text for it"),
    (entry("/etc/x.env"), "no content (or secret: true with its text in secrets)"),
    (entry("/etc/x.env", content="x", mode="rw-r--r--"), "mode 'rw-r--r--' is not an octal number"),
    (entry("/etc/x.env", content="x", owner="no-such-user-here"), "owner 'no-such-user-here' does not exist"),
])
def test_a_bad_request_names_the_file_and_the_value(bad, message):
    with pytest.raises(mf.ManagedFilesError, match=message.replace("(", r"\(").replace(")", r"\)")):
        mf.normalize([bad], [])


def test_the_same_file_twice_and_a_directory_in_the_way_are_refused(tmp_path):
    with pytest.raises(mf.ManagedFilesError, match="listed twice"):
        mf.normalize([entry(tmp_path / "a", content="1"), entry(tmp_path / "a", content="2")], [])
    (tmp_path / "vllm.env").mkdir()
    with pytest.raises(mf.ManagedFilesError, match="exists and is not a regular file"):
        apply([entry(tmp_path / "vllm.env", content="A=1\n")])


def test_host_state_reads_paths_users_units_and_the_systemd_version(tmp_path):
    binary = tmp_path / "vllm"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    assert host_state.path_state(str(binary), checksum=True) == {
        "exists": True, "kind": "file", "executable": True,
        "sha256": hashlib.sha256(b"#!/bin/sh\n").hexdigest()}
    assert host_state.path_state(str(tmp_path / "gone"), checksum=True) == {
        "exists": False, "kind": None, "executable": False, "sha256": None}
    assert host_state.path_state(str(tmp_path), checksum=True)["kind"] == "directory"
    assert host_state.user_state("root")["uid"] == 0 and host_state.user_state("no-such-user-here") is None
    assert host_state.systemd_major("systemd 252 (252.33-1~deb12u1)\n+PAM +AUDIT") == 252
    assert host_state.systemd_major("") == 0
    show = "LoadState=loaded\nActiveState=failed\nSubState=failed\nUnitFileState=enabled\n" \
           "FragmentPath=/etc/systemd/system/vllm.service\n"
    assert host_state.unit_state(show) == {"load_state": "loaded", "active_state": "failed", "sub_state": "failed",
                                           "unit_file_state": "enabled",
                                           "fragment_path": "/etc/systemd/system/vllm.service", "stopped_pids": []}
    assert host_state.unit_state("LoadState=not-found\nActiveState=inactive\n")["active_state"] == "inactive"


def run_tasks(tmp_path, tasks, *args):
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    proc = subprocess.run(
        [str(ANSIBLE.with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={MODULE_PYTHON}", *args, str(playbook)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return proc.stdout, {t["task"]["name"]: t["hosts"]["localhost"] for t in json.loads(proc.stdout)["plays"][0]["tasks"]}


def test_both_modules_through_ansible_keep_the_secret_out_of_the_output(tmp_path):
    conf = tmp_path / "conf"
    env, key = conf / "vllm.env", conf / "api-key.env"
    write = {"directories": [{"path": str(conf), "owner": OWNER, "group": GROUP}],
             "files": [{"dest": str(env), "content": "A=1\n", "mode": "0600", "backup": True, "owner": OWNER,
                        "group": GROUP},
                       {"dest": str(key), "secret": True, "mode": "0600", "owner": OWNER, "group": GROUP}],
             "secrets": {str(key): 'VLLM_API_KEY="t0p-s3cret"\n'}}
    read = {"paths": [str(env), str(tmp_path / "absent")], "checksums": [str(env)], "users": ["root"]}
    tasks = [
        {"name": "preview", "check_mode": True, "vllm_ops.cluster.managed_files": write},
        {"name": "write", "vllm_ops.cluster.managed_files": write},
        {"name": "again", "vllm_ops.cluster.managed_files": write},
        {"name": "read", "vllm_ops.cluster.host_state": read},
        {"name": "read in check mode", "check_mode": True, "vllm_ops.cluster.host_state": read},
    ]
    output, result = run_tasks(tmp_path, tasks, "--diff")
    assert "t0p-s3cret" not in output
    assert result["preview"]["changed"] and result["write"]["changed"] and not result["again"]["changed"]
    assert result["write"]["files"][str(key)]["reasons"] == ["created"]
    assert key.read_text() == 'VLLM_API_KEY="t0p-s3cret"\n'
    assert result["read"]["paths"][str(env)]["sha256"] == hashlib.sha256(b"A=1\n").hexdigest()
    assert result["read"]["paths"][str(tmp_path / "absent")]["exists"] is False
    assert result["read"]["users"]["root"]["uid"] == 0 and result["read"]["systemd_version"] > 0
    assert result["read in check mode"]["paths"] == result["read"]["paths"]


def test_the_secret_is_not_in_the_invocation_the_module_logs_on_the_node(tmp_path, monkeypatch, capsys):
    """The "Invoked with ..." line AnsibleModule writes to the node's journal (a no_log suboption inside a
    list was still written there: the line holds the list's repr, where the quotes and newline are escaped)."""
    from ansible.module_utils import basic
    from ansible_collections.vllm_ops.cluster.plugins.modules import managed_files as module

    key = tmp_path / "api-key.env"
    args = {"files": [{"dest": str(key), "secret": True, "mode": "0600", "owner": OWNER, "group": GROUP}],
            "secrets": {str(key): 'VLLM_API_KEY="t0p-s3cret"\n'}, "_ansible_check_mode": False}
    monkeypatch.setattr(basic, "_ANSIBLE_ARGS", json.dumps({"ANSIBLE_MODULE_ARGS": args}).encode())
    monkeypatch.setattr(basic, "_ANSIBLE_PROFILE", "legacy")
    logged = []
    monkeypatch.setattr(basic.AnsibleModule, "log", lambda self, msg, log_args=None: logged.append(msg))
    with pytest.raises(SystemExit):
        module.main()
    result = json.loads(capsys.readouterr().out)
    assert result["changed"] and key.read_text() == 'VLLM_API_KEY="t0p-s3cret"\n'
    assert logged and logged[0].startswith("Invoked with") and "NOT_LOGGING_PARAMETER" in logged[0]
    assert not any("t0p-s3cret" in line for line in logged)
    assert "t0p-s3cret" not in json.dumps(result)
