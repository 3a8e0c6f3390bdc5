"""From a plan node to the ``vllm.service`` command line: the rollout stage and systemd quoting.

The plan holds each node's exact ``vllm serve`` argv (``nodes[i].argv``, starting
with ``vllm``). Two things change on the way into the unit:

- the rollout stage (the seed's one-variable discipline): stage ``eager`` is the
  plan's argv with ``--enforce-eager`` (CUDA graphs and torch.compile off: the
  functional check); stage ``final`` is the plan's argv as it is. Where an eager
  start is known to break, the eager stage is refused (``StageError``):
  pipeline parallel on the CPU platform crashes on the first request with
  ``--enforce-eager`` (research/vllm-internals.md §6);
- systemd's own quoting, so that every argument reaches vLLM unchanged
  (systemd.service(5), "Command lines": whitespace splits words, quotes and C
  escapes are interpreted, ``%`` starts a specifier and ``$`` a variable).

Pure Python (3.11+); imports nothing from Ansible.
"""

from __future__ import annotations

import re

STAGES = ("eager", "final")
EAGER_FLAG = "--enforce-eager"
# Characters that need no quoting in a systemd command line.
_BARE = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")


class StageError(ValueError):
    """A rollout stage that must not run for this plan."""


def eager_stage_unsafe(plan):
    """Why an ``--enforce-eager`` start must not run for ``plan``, or None when it may."""
    device = (plan.get("cluster") or {}).get("device", "cuda")
    if device == "cpu" and int(plan.get("pp", 1)) > 1:
        return (
            f"PP={plan['pp']} on the CPU platform crashes on the first request with --enforce-eager "
            "(intermediate tensors are never allocated; research/vllm-internals.md section 6)"
        )
    return None


def stage_argv(plan, node, stage="final"):
    """The node's argv (``vllm serve ...``) for ``stage``; raises StageError for an unsafe eager stage."""
    if stage not in STAGES:
        raise StageError(f"unknown rollout stage {stage!r}: expected one of {', '.join(STAGES)}")
    argv = list(node.get("argv") or [])
    if not argv:
        raise StageError(f"node {node.get('host')} runs no vLLM in this plan (runs_vllm: false): no command line")
    if argv[0] != "vllm" or len(argv) < 2 or argv[1] != "serve":
        raise StageError(f"node {node.get('host')}: the plan's argv must start with 'vllm serve', got {argv[:2]}")
    if stage == "final":
        return argv
    reason = eager_stage_unsafe(plan)
    if reason:
        raise StageError(f"node {node.get('host')}: refusing the --enforce-eager stage: {reason}")
    return argv if EAGER_FLAG in argv else [*argv, EAGER_FLAG]


def systemd_quote(word):
    """One argument as a systemd command-line word that systemd turns back into ``word``."""
    text = str(word)
    escaped = text.replace("%", "%%").replace("$", "$$")
    if text and _BARE.match(text):
        return escaped
    out = []
    for char in escaped:
        if char == "\\":
            out.append("\\\\")
        elif char == '"':
            out.append('\\"')
        elif char == "\n":
            out.append("\\n")
        elif char == "\t":
            out.append("\\t")
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def env_file_line(name, value):
    """``NAME="value"`` for a systemd EnvironmentFile: double quotes; backslash, quote, dollar, backtick escaped."""
    if not _ENV_NAME.match(str(name)):
        raise StageError(f"environment variable name {name!r} is not valid for systemd (letters, digits, _)")
    text = str(value)
    if "\n" in text or "\r" in text:
        raise StageError(f"environment variable {name}: a value with a line break cannot go into an env file")
    for char in ("\\", '"', "$", "`"):
        text = text.replace(char, "\\" + char)
    return f'{name}="{text}"'


def exec_start(binary, argv):
    """``ExecStart=`` value: the venv's ``vllm`` binary, then ``argv[1:]`` (the plan's argv after ``vllm``)."""
    if not str(binary).startswith("/"):
        raise StageError(f"the vllm binary must be an absolute path for systemd, got {binary!r}")
    return " ".join(systemd_quote(word) for word in [binary, *argv[1:]])


def api_probe_host(argv, default="127.0.0.1"):
    """Where a probe reaches the API: ``--host`` when it names one address, else default (loopback on the node)."""
    host = None
    for index, word in enumerate(argv):
        if word == "--host" and index + 1 < len(argv):
            host = argv[index + 1]
        elif word.startswith("--host="):
            host = word.split("=", 1)[1]
    if host in (None, "", "0.0.0.0", "::", "[::]"):
        host = default
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def served_model_name(argv):
    """The model name the OpenAI API serves: ``--served-model-name`` or the model argument (argv[2])."""
    for index, word in enumerate(argv):
        if word == "--served-model-name" and index + 1 < len(argv):
            return argv[index + 1]
        if word.startswith("--served-model-name="):
            return word.split("=", 1)[1]
    return argv[2] if len(argv) > 2 else None
