"""Foreign drop-ins: the rule the deploy and the doctor share (deploy/unit_dropins.py) and the unit_dropins module."""

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy import unit_dropins as ud
from test_managed_files import run_tasks

UNIT = "vllm.service"


def test_only_the_units_own_directories_hold_foreign_drop_ins():
    paths = ["/etc/systemd/system/vllm.service.d/override.conf", "/run/systemd/system/vllm.service.d/cpu.conf",
             "/etc/systemd/system/service.d/10-all.conf", "/usr/lib/systemd/system/vllm.service.d/vendor.conf",
             "/etc/systemd/system/vllm-chat.service.d/x.conf", "/etc/systemd/system/vllm.service.d/sub/deep.conf"]
    assert ud.foreign_dropins(paths, UNIT) == paths[:2]


def test_wanted_by_name_or_path_and_ours_are_kept():
    paths = ["/etc/systemd/system/vllm.service.d/a.conf", "/etc/systemd/system/vllm.service.d/b.conf",
             "/run/systemd/system/vllm.service.d/a.conf", "/etc/systemd/system/vllm.service.d/c.conf"]
    assert ud.foreign_dropins(paths, UNIT, wanted=["a.conf"]) == [paths[1], paths[3]]
    assert ud.foreign_dropins(paths, UNIT, wanted=[paths[2]], ours=[paths[3]]) == paths[:2]


def test_the_message_names_host_file_settings_and_variable():
    text = "# made by hand\n[Service]\n\nCPUQuota=3%\n"
    assert ud.removal_message("node2", "/etc/systemd/system/vllm.service.d/override.conf", text,
                              "vllm_service_dropins_wanted") == (
        "node2: removed /etc/systemd/system/vllm.service.d/override.conf ([Service] CPUQuota=3%): "
        "not written by vllm-cluster and not in vllm_service_dropins_wanted")
    assert ud.removal_message("n", "/x", "", "v", check_mode=True) == (
        "n: would remove /x (empty): not written by vllm-cluster and not in v")


@pytest.fixture
def roots(tmp_path):
    etc, run = tmp_path / "etc", tmp_path / "run"
    (etc / "vllm.service.d").mkdir(parents=True)
    (run / "vllm.service.d").mkdir(parents=True)
    (etc / "service.d").mkdir()
    (etc / "vllm.service.d" / "override.conf").write_text("[Service]\nCPUQuota=3%\n")
    (etc / "vllm.service.d" / "keep.conf").write_text("[Service]\nNice=5\n")
    (run / "vllm.service.d" / "exec.conf").write_text("[Service]\nExecStart=\nExecStart=/bin/false\n")
    (etc / "service.d" / "all.conf").write_text("[Service]\nTimeoutSec=5\n")
    return etc, run


def test_check_mode_names_and_keeps_then_a_run_removes(roots):
    etc, run = roots
    preview = ud.remove_foreign_dropins(UNIT, ["keep.conf"], host="node2", variable="vllm_service_dropins_wanted",
                                        check_mode=True, roots=(str(etc), str(run)))
    assert preview["changed"] and (etc / "vllm.service.d" / "override.conf").exists()
    assert [e["path"] for e in preview["removed"]] == [str(etc / "vllm.service.d" / "override.conf"),
                                                       str(run / "vllm.service.d" / "exec.conf")]
    assert preview["diff"][0] == {"before": "[Service]\nCPUQuota=3%\n", "after": "",
                                  "before_header": str(etc / "vllm.service.d" / "override.conf"),
                                  "after_header": f"{etc / 'vllm.service.d' / 'override.conf'} (removed)"}
    assert "node2: would remove" in preview["msg"]
    done = ud.remove_foreign_dropins(UNIT, ["keep.conf"], host="node2", variable="vllm_service_dropins_wanted",
                                     roots=(str(etc), str(run)))
    assert done["changed"] and done["kept"] == [str(etc / "vllm.service.d" / "keep.conf")]
    assert sorted(p.name for p in etc.rglob("*.conf")) == ["all.conf", "keep.conf"]
    assert not (run / "vllm.service.d").exists()  # emptied: gone, as before the drop-in came
    again = ud.remove_foreign_dropins(UNIT, ["keep.conf"], host="node2", roots=(str(etc), str(run)))
    assert not again["changed"] and again["msg"] == "node2: vllm.service has no foreign drop-in"


def test_the_module_through_ansible_warns_diffs_and_is_idempotent(tmp_path, roots):
    etc, run = roots
    args = {"unit": UNIT, "wanted": ["keep.conf"], "variable": "vllm_service_dropins_wanted", "label": "node2",
            "roots": [str(etc), str(run)], "daemon_reload": False}
    tasks = [{"name": "preview", "check_mode": True, "vllm_ops.cluster.unit_dropins": args},
             {"name": "remove", "vllm_ops.cluster.unit_dropins": args},
             {"name": "again", "vllm_ops.cluster.unit_dropins": args}]
    _, result = run_tasks(tmp_path, tasks, "--diff")
    assert result["preview"]["changed"] and result["remove"]["changed"] and not result["again"]["changed"]
    message = (f"node2: removed {etc}/vllm.service.d/override.conf ([Service] CPUQuota=3%): "
               "not written by vllm-cluster and not in vllm_service_dropins_wanted")
    assert message in result["remove"]["warnings"]
    assert result["remove"]["diff"][0]["before"] == "[Service]\nCPUQuota=3%\n"
    assert not (etc / "vllm.service.d" / "override.conf").exists() and (etc / "vllm.service.d" / "keep.conf").exists()


def test_the_drop_ins_of_a_unit_are_listed_loaded_or_not(tmp_path):
    etc, run = tmp_path / "etc", tmp_path / "run"
    (etc / "vllm.service.d").mkdir(parents=True)
    (etc / "vllm.service.d" / "override.conf").write_text("[Service]\nCPUQuota=3%\n")
    (run / "vllm.service.d").mkdir(parents=True)
    (run / "vllm.service.d" / "10-runtime.conf").symlink_to(etc / "vllm.service.d" / "override.conf")
    (etc / "ray-head.service.d").mkdir()
    assert ud.present_dropins("vllm.service", (str(etc), str(run))) == [
        str(etc / "vllm.service.d" / "override.conf"), str(run / "vllm.service.d" / "10-runtime.conf")]
    # vllm_service's configure.yml runs the removal only where this list is not empty.
    assert ud.present_dropins("ray-head.service", (str(etc), str(run))) == []
    assert ud.present_dropins("other.service", (str(etc), str(run))) == []

