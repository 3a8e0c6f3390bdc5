"""Action model_transfer: run a model transfer on the node as a transient unit, print its progress, wait for it.

The documentation is plugins/modules/model_transfer.py; the logic plugins/module_utils/model/transfer.py.
"""

from __future__ import annotations

import json
import shlex
import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.vllm_ops.cluster.plugins.module_utils.model import transfer

display = Display()
TAIL_LINES = 20


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("argv", "dest", "total_bytes", "unit", "what", "env", "interval", "timeout",
                             "status_file"))

    def _shell(self, command: str) -> dict:
        return self._low_level_execute_command(command, sudoable=True)

    def _probe(self, unit: str, dest: str) -> dict:
        return transfer.parse_probe(self._shell(transfer.probe_command(unit, dest))["stdout"])

    def _clear(self, unit: str) -> None:
        self._shell(f"systemctl stop {shlex.quote(unit)} 2>/dev/null; systemctl reset-failed {shlex.quote(unit)} "
                    "2>/dev/null; true")

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        host = task_vars.get("inventory_hostname", "?")
        try:
            unit = transfer.unit_name(str(args.get("unit", "")))
        except ValueError as error:
            raise AnsibleActionFail(f"host {host}: {error}") from None
        argv, dest = args.get("argv"), args.get("dest")
        if not isinstance(argv, list) or not argv or not all(isinstance(part, str) for part in argv):
            raise AnsibleActionFail(f"host {host}: argv must be a non-empty list of strings, not {argv!r}")
        if not isinstance(dest, str) or not dest.startswith("/"):
            raise AnsibleActionFail(f"host {host}: dest must be an absolute path, not {dest!r}")
        total, interval = int(args.get("total_bytes", 0)), float(args.get("interval", 30))
        timeout, what = float(args.get("timeout", 86400)), str(args.get("what", " ".join(argv[:1])))
        env = {str(key): str(value) for key, value in (args.get("env") or {}).items()}
        status_file = args.get("status_file")
        result.update(unit=unit, dest=dest, total_bytes=total)
        if self._task.check_mode:
            result.update(changed=True, msg=f"host {host}: {what}: would run as {unit} (check mode)")
            return result

        state = self._probe(unit, dest)
        attached = transfer.phase(state) == "running"
        if attached:  # an earlier run's transfer, still going (that play was stopped): watched, not doubled
            display.display(f"{host}: {what}: a transfer is already running as {unit}; watching it")
        else:
            self._clear(unit)
            if status_file:
                self._shell(f"rm -f {shlex.quote(status_file)}")
            started = self._shell(shlex.join(transfer.start_command(unit, argv, env)))
            if started["rc"] != 0:
                raise AnsibleActionFail(f"host {host}: {what}: systemd-run could not start {unit}: "
                                        f"{(started['stderr'] or started['stdout']).strip()}")
        began, first = time.monotonic(), state["bytes"]
        shown = began
        while True:
            time.sleep(min(2.0, interval))
            state = self._probe(unit, dest)
            now, ended = time.monotonic(), transfer.phase(state)
            if ended != "running":
                break
            if now - shown >= interval:
                display.display(transfer.progress_line(host, what, state["bytes"], total, now - began, first))
                shown = now
            if now - began > timeout:
                self._clear(unit)
                raise AnsibleActionFail(f"host {host}: {what}: stopped after {timeout:.0f} s (timeout), "
                                        f"{state['bytes']} of {total} bytes there; run again to resume")
        elapsed = time.monotonic() - began
        status = None
        if status_file:
            text = self._shell(f"cat {shlex.quote(status_file)} 2>/dev/null")["stdout"]
            try:
                status = json.loads(text) if text.strip() else None
            except ValueError:
                status = None
        journal = self._shell(f"journalctl -u {shlex.quote(unit)} -n {TAIL_LINES} --no-pager -o cat "
                              f"--since=-{int(elapsed) + 60}s 2>/dev/null")["stdout"]
        self._clear(unit)
        result.update(changed=not attached or ended == "done", elapsed_s=round(elapsed, 1), bytes=state["bytes"],
                      status=status, attached=attached)
        if ended != "done":
            why = (status or {}).get("msg") if (status or {}).get("kind") == "error" else None
            how = {"failed": f"failed ({state['Result']}, exit status {state['ExecMainStatus']})",
                   "gone": "was stopped before it ended"}[ended]
            raise AnsibleActionFail(f"host {host}: {what}: {unit} {how}"
                                    + (f": {why}" if why else "")
                                    + "; what arrived is kept, run again to resume. Its last lines:\n" + journal)
        rate = (state["bytes"] - first) / elapsed if elapsed > 0 else 0.0
        result["msg"] = (f"host {host}: {what}: done in {elapsed:.1f} s, {transfer.gib(state['bytes'])} under {dest}, "
                         f"{rate / 1024 ** 2:.1f} MiB/s")
        return result
