"""model_transfer's pure parts: the unit's name, the probe's parsing, the phases, the start line, the progress."""

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.model import transfer


def test_only_our_own_unit_names_are_accepted():
    assert transfer.unit_name("vllm-model-fetch") == "vllm-model-fetch.service"
    assert transfer.unit_name("vllm-model-copy.service") == "vllm-model-copy.service"
    for name in ("sshd", "vllm-model-", "vllm-model-a b", "vllm-model-x;reboot"):
        with pytest.raises(ValueError, match="must be named vllm-model-"):
            transfer.unit_name(name)


@pytest.mark.parametrize("show, expected", [
    ("LoadState=loaded\nActiveState=active\nSubState=running\nResult=success\nExecMainStatus=0", "running"),
    ("LoadState=loaded\nActiveState=active\nSubState=exited\nResult=success\nExecMainStatus=0", "done"),
    ("LoadState=loaded\nActiveState=failed\nSubState=failed\nResult=exit-code\nExecMainStatus=1", "failed"),
    ("LoadState=loaded\nActiveState=inactive\nSubState=dead\nResult=signal\nExecMainStatus=9", "failed"),
    ("LoadState=not-found\nActiveState=inactive\nSubState=dead\nResult=success\nExecMainStatus=0", "gone"),
])
def test_the_phase_is_read_from_systemctl_show(show, expected):
    state = transfer.parse_probe(show + "\nBYTES=123\n")
    assert transfer.phase(state) == expected and state["bytes"] == 123


def test_a_missing_directory_counts_zero_bytes_and_the_probe_quotes_its_paths():
    assert transfer.parse_probe("ActiveState=active\nBYTES=\n")["bytes"] == 0
    command = transfer.probe_command("vllm-model-copy.service", "/srv/models/a b")
    assert "du -sb '/srv/models/a b'" in command and "systemctl show -p LoadState" in command
    # On a terminal systemctl colours its values: read through.
    coloured = transfer.parse_probe("ActiveState=active\x1b[m\r\nSubState=exited\r\nResult=success\x1b[m\r\n")
    assert transfer.phase(coloured) == "done"


def test_the_transfer_starts_as_a_transient_unit_that_keeps_its_result():
    argv = transfer.start_command("vllm-model-fetch.service", ["python3", "f.py"], {"HF_ENDPOINT": "http://m:1"})
    assert argv[:4] == ["systemd-run", "--unit=vllm-model-fetch.service", "--quiet", "--property=RemainAfterExit=yes"]
    assert "--setenv=HF_ENDPOINT=http://m:1" in argv and argv[-3:] == ["--", "python3", "f.py"]


def test_the_progress_line_gives_bytes_share_rate_and_eta_of_this_run_only():
    gib = 1024 ** 3
    line = transfer.progress_line("node2", "copy from node1", 3 * gib, 4 * gib, 10.0, 2 * gib)
    assert line == "node2: copy from node1: 3.00 GiB of 4.00 GiB (75 %), 102.4 MiB/s, ETA 10 s"
    assert transfer.progress_line("n", "fetch", 0, 4 * gib, 0.0, 0) == "n: fetch: 0.0 MiB of 4.00 GiB (0 %), 0.0 MiB/s"
