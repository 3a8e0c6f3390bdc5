"""Running the tool a facts module reads (nvidia-smi, ibstat, ...) on a node.

Shared by the gpu_facts and ib_facts modules: find the tool, run it under
``timeout``, and fail the module with what an operator needs to act on (the
host, the command, its exit status and the first line of its error).

Every function takes the AnsibleModule it works for and only calls its
``get_bin_path``, ``run_command`` and ``fail_json``; nothing here imports Ansible.
"""

from __future__ import annotations

import os
import socket


def resolve_binary(module, binary, opt_dirs=None):
    """Executable path of ``binary``, or None when there is none.

    A value with a path separator is used as given when it is an executable
    file; a bare name is looked up in PATH and in ``opt_dirs``.
    """
    if os.sep in binary:
        return binary if os.path.isfile(binary) and os.access(binary, os.X_OK) else None
    return module.get_bin_path(binary, opt_dirs=opt_dirs)


def first_line(*texts):
    """The first non-blank line of the first text that has one, stripped; '(no output)' when none has."""
    for text in texts:
        for line in (text or "").splitlines():
            if line.strip():
                return line.strip()
    return "(no output)"


def run_tool(module, argv, timeout):
    """Run one command; fail the module with host, command, exit code and first error line.

    The command runs under ``timeout --kill-after=5 <timeout>`` when ``timeout``
    is installed, with LC_ALL=C; returns its stdout.
    """
    timeout_bin = module.get_bin_path("timeout")
    full = [timeout_bin, "--kill-after=5", str(timeout)] + argv if timeout_bin else argv
    rc, out, err = module.run_command(full, check_rc=False, environ_update={"LC_ALL": "C"})
    if rc != 0:
        reason = f"did not finish within {timeout}s" if timeout_bin and rc in (124, 137) else f"exited with {rc}"
        module.fail_json(
            msg=f"host {socket.gethostname()}: '{' '.join(argv)}' {reason}: {first_line(err, out)}",
            rc=rc,
            cmd=argv,
            stdout=out,
            stderr=err,
        )
    return out


def parse_or_fail(module, parser, argv, out, *, errors):
    """``parser(out)``; fail the module, naming host and command, when it raises one of ``errors``.

    ``errors`` is the parse error class of the parser's module (or a tuple of
    classes); any other exception is a bug and propagates.
    """
    try:
        return parser(out)
    except errors as error:
        module.fail_json(
            msg=f"host {socket.gethostname()}: cannot parse the output of '{' '.join(argv)}' (exit code 0): {error}",
            cmd=argv,
            stdout=out,
        )
    return None
