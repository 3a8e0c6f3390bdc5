"""A node's ``vllm serve`` argv checked by vLLM's own argument parser, in the node's own runtime (module vllm_argv_check).

The plan's argv, with the operator's serve args appended, is what ``vllm.service``
will run. Before vllm_service writes a file or restarts a unit, the runtime venv
that will run it (``<venv>/bin/python``) builds the parser exactly as the
``vllm`` command does (the serve subcommand's ``make_arg_parser`` on a
``FlexibleArgumentParser``), parses the argv, runs the subcommand's own
validation (``validate_parsed_serve_args``: a chat template that must exist,
``--enable-auto-tool-choice`` without a parser, ...) and
``AsyncEngineArgs.from_cli_args``; nothing starts, no model is read.
``PARSER_SCRIPT`` is that program; the module passes it the argv as JSON on
stdin and reads one JSON object back (``verdict`` turns it into the operator's
message).

Importing vLLM imports torch (``vllm/__init__`` imports ``vllm.env_override``),
so one check costs several seconds (docs/roles/vllm_service.md). It is skipped
when the node's deployed plan (``plan.json``) holds the same argv for this host
and the runtime was not reinstalled since (``<venv>/bin/vllm`` is not newer than
``plan.json``): that argv was checked, or ran, on this runtime already.

An abbreviated flag (``--max-num-seq`` for ``--max-num-seqs``) is refused too:
argparse takes a prefix silently, and the same prefix becomes ambiguous, or
another flag, when a later vLLM adds one. ``FlexibleArgumentParser``'s own
spelling rules (``_`` for ``-``, ``--flag.key`` for a JSON field) are vLLM's
and stay accepted.

Pure Python (3.11+); imports nothing from Ansible.
"""

from __future__ import annotations

import json
import os
import re
import shlex

# Runs in the node's runtime venv (python 3.11 with vLLM). Reads {"argv": [...]} on stdin,
# writes one JSON object on its stdout; everything vLLM or torch print goes to stderr.
PARSER_SCRIPT = r'''
import contextlib, io, json, os, sys, time

def main():
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    argv = json.load(sys.stdin)["argv"]
    started = time.monotonic()
    result = {"ok": False, "stage": "import", "error": "", "options": [], "vllm_version": None}
    try:
        try:
            import vllm
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.entrypoints.cli import serve as serve_cli
            from vllm.utils.argparse_utils import FlexibleArgumentParser
            result["vllm_version"] = vllm.__version__
            result["import_s"] = round(time.monotonic() - started, 3)
            parser = FlexibleArgumentParser(prog="vllm")
            subparsers = parser.add_subparsers(required=True, dest="subparser")
            commands = {}
            for command in serve_cli.cmd_init():
                command.subparser_init(subparsers)
                commands[command.name] = command
            result["options"] = sorted(subparsers.choices["serve"]._option_string_actions)
        except Exception as exc:
            result["error"] = f"{type(exc).__name__}: {exc}"
            return
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                args = parser.parse_args(argv[1:])
        except SystemExit:
            result.update(stage="parse", error=stderr.getvalue())
            return
        except Exception as exc:
            result.update(stage="parse", error=f"{type(exc).__name__}: {exc}")
            return
        try:
            commands[args.subparser].validate(args)
            args.model = args.model_tag
            AsyncEngineArgs.from_cli_args(args)
        except Exception as exc:
            result.update(stage="validate", error=str(exc), error_type=type(exc).__name__)
            return
        result.update(ok=True, stage="done")
    finally:
        result["seconds"] = round(time.monotonic() - started, 3)
        json.dump(result, out)
        out.flush()

main()
'''

# What the parser's process gets: no usage report, quiet logs, no .pyc written into the venv.
PARSER_ENV = {
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_LOGGING_LEVEL": "ERROR",
    "PYTHONDONTWRITEBYTECODE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

# Left out of the parser's environment: with HF_HUB_OFFLINE, from_cli_args resolves the model path,
# which a check of flags must not need (a model not staged yet, a check-mode run).
PARSER_ENV_DROP = ("PYTHONPATH", "PYTHONHOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")

_ARGUMENT = re.compile(r"^argument ([^:]+): ")
_UNRECOGNIZED = "unrecognized arguments: "
_FLAG_IN_TEXT = re.compile(r"(?<![\w-])(--[A-Za-z0-9][A-Za-z0-9_.-]*)")
_PARAMETER = re.compile(r"\(parameter=([A-Za-z0-9_]+)\)")


def flag_name(token):
    """``--max_num_seqs=4`` -> ``--max-num-seqs``; ``--compilation-config.mode`` -> ``--compilation-config``."""
    name = token.split("=", 1)[0]
    return "--" + name[2:].split(".", 1)[0].replace("_", "-")


def deployed_argv(plan_text, host):
    """This host's argv in the node's deployed plan (plan.json's text), or None (no plan, no node, unreadable)."""
    try:
        plan = json.loads(plan_text)
    except (TypeError, ValueError):
        return None
    nodes = plan.get("nodes") if isinstance(plan, dict) else None
    for node in nodes if isinstance(nodes, list) else []:
        if isinstance(node, dict) and node.get("host") == host:
            argv = node.get("argv")
            return list(argv) if isinstance(argv, list) else None
    return None


def skip_reason(plan_argv, deployed, runtime_newer):
    """Why the check need not run (the node's plan.json holds this argv, the runtime unchanged), or None."""
    if deployed is None:
        return None
    if list(plan_argv) != list(deployed) or runtime_newer:
        return None
    return "the node's plan.json holds this argv and the runtime was not reinstalled since"


def runtime_newer_than(marker, plan_path):
    """Whether ``marker`` (the runtime's bin/vllm) changed after ``plan_path`` was written; True when unknown."""
    try:
        return os.stat(marker).st_mtime > os.stat(plan_path).st_mtime
    except OSError:
        return True


def flag_value(argv, flag):
    """The value given to ``flag`` in argv ('' for a flag without one), or None when it is not there."""
    for index, token in enumerate(argv):
        if not token.startswith("--") or flag_name(token) != flag:
            continue
        if "=" in token:
            return token.split("=", 1)[1]
        if index + 1 < len(argv) and not argv[index + 1].startswith("--"):
            return argv[index + 1]
        return ""
    return None


def inexact_flags(argv, options):
    """[(token, the flag vLLM took it for)] of every flag argv spells only as an abbreviation."""
    known = set(options)
    found = []
    for token in argv[2:]:
        if not token.startswith("--") or flag_name(token) in known:
            continue
        name = flag_name(token)
        matches = sorted(option for option in known if option.startswith(name))
        found.append((token.split("=", 1)[0], matches[0] if len(matches) == 1 else None))
    return found


def _vllm_message(stage, error):
    """argparse's 'vllm serve: error: <message>' -> <message>; an exception's text as it is."""
    text = (error or "").strip()
    if stage == "parse" and ": error: " in text:
        text = text.split(": error: ", 1)[1].strip()
    return " ".join(text.split()) or "(no message)"


def _blamed_flag(argv, stage, message):
    """The flag of argv that vLLM's message is about, or None."""
    present = {flag_name(token) for token in argv if token.startswith("--")}
    match = _ARGUMENT.match(message)
    if match:
        names = [flag_name(name) for name in match.group(1).split("/") if name.startswith("--")]
        return next((name for name in names if name in present), names[0] if names else None)
    if message.startswith(_UNRECOGNIZED):
        first = message[len(_UNRECOGNIZED):].split()[0] if message[len(_UNRECOGNIZED):].split() else ""
        if first.startswith("--"):
            return flag_name(first)
        # A stray value ('--enable-prefix-caching true'): the flag before it in argv.
        for index, token in enumerate(argv[1:], 1):
            if token == first and argv[index - 1].startswith("--"):
                return flag_name(argv[index - 1])
        return None
    candidates = [flag_name(name) for name in _FLAG_IN_TEXT.findall(message)]
    candidates += ["--" + name.replace("_", "-") for name in _PARAMETER.findall(message)]
    return next((name for name in candidates if name in present), None)


def verdict(host, argv, result):
    """The operator's one-line message when vLLM rejects the argv, else None.

    ``host <name>: vllm serve rejects <flag> <value>: <vLLM's message>``.
    """
    if not result.get("ok"):
        stage = result.get("stage")
        message = _vllm_message(stage, result.get("error"))
        if stage == "import":
            return (f"host {host}: cannot build vLLM's serve parser in the node's runtime "
                    f"(vllm {result.get('vllm_version') or 'not importable'}): {message}")
        if stage == "validate" and result.get("error_type"):
            message = f"{result['error_type']}: {message}" if not message.startswith("Error") else message
        flag = _blamed_flag(argv, stage, message)
        if flag is None:
            return f"host {host}: vllm serve rejects its argv {shlex.join(argv[2:])}: {message}"
        value = flag_value(argv, flag)
        shown = flag if not value else f"{flag} {shlex.quote(value)}"
        return f"host {host}: vllm serve rejects {shown}: {message}"
    inexact = inexact_flags(argv, result.get("options") or [])
    if inexact:
        token, meant = inexact[0]
        value = flag_value(argv, flag_name(token))
        shown = token if not value else f"{token} {shlex.quote(value)}"
        if meant:
            why = (f"vLLM takes {token} only as an abbreviation of {meant} (argparse's prefix match); "
                   f"spell the flag as vLLM defines it: {meant}")
        else:
            why = f"{token} is not the exact name of a vllm serve flag; spell the flag as vLLM defines it"
        return f"host {host}: vllm serve rejects {shown}: {why}"
    return None
