"""The roles' variables a deployment's hosts set, checked by Ansible's own validator; the API key's presence.

``argument_problems`` validates every value the inventory gives a role variable
against that role's ``meta/argument_specs.yml`` with
``ansible.module_utils.common.arg_spec.ArgumentSpecValidator``, the validator a
role runs at its start, so that playbooks/plan.yml refuses on the controller what
the role would refuse on a node, stages later. Only the values the inventory sets
are checked: a role's defaults are its own (they are templates the role renders on
its node), and no option of a role is required. A value the controller cannot
render yet (a template of a node's facts) is left to the role. An option declared by several
entry points of a role is checked once, as its first entry point (``main``)
declares it. A value is checked as the validator converts it: a quoted integer
("900") is that integer, a quoted boolean ("true", "yes") that boolean.

``api_key_problems`` refuses hosts without the API key vLLM requires, the check
role vllm_service's preflight makes on the node, unless
``vllm_service_allow_no_api_key`` opts out.

Each problem is one line naming the hosts, the variable, the value (never a
secret's) and what was expected; the validator's own wording (Python type names,
Ansible's internal ones) is never shown.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.errors import ArgumentTypeError, ArgumentValueError, ElementError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import variables as declared

#: The keys of an option that the validator reads (a description, a default, version_added are not checked here).
VALIDATED_KEYS = ("type", "elements", "choices", "options")
EXPECTED = {
    "str": "a string", "path": "a path (a string)", "int": "an integer", "float": "a number",
    "bool": "true or false", "list": "a list", "dict": "a mapping", "raw": "any value", "bytes": "a size in bytes",
    "bits": "a size in bits", "jsonarg": "JSON text or a mapping", "json": "JSON text or a mapping",
}
EXPECTED_MANY = {
    "str": "strings", "path": "paths", "int": "integers", "float": "numbers", "bool": "booleans",
    "list": "lists", "dict": "mappings", "raw": "values", "bytes": "sizes in bytes", "bits": "sizes in bits",
}
API_KEY = "vllm_cluster_api_key"
SERVICE_KEY = "vllm_service_api_key"
ALLOW_NO_KEY = "vllm_service_allow_no_api_key"
KEY_TEXT = re.compile(r"^[!-~]+$")  # printable ASCII without spaces, as vllm_service's preflight requires


def _validated(option):
    """The part of one option the validator checks, nested options included (a default never)."""
    spec = {key: option[key] for key in VALIDATED_KEYS if key in (option or {})}
    if isinstance(spec.get("options"), dict):
        spec["options"] = {name: _validated(sub) for name, sub in spec["options"].items()}
    return spec


def role_options(root):
    """``{name: (role, spec file, option)}``: every option of every role's argument spec, the main entry point's first."""
    root = Path(root)
    options = {}
    for role, path in declared._role_specs(root):
        specs = (declared.safe_load(path.read_text()) or {}).get("argument_specs") or {}
        points = sorted(specs, key=lambda point: point != "main")  # main first, then in the file's order
        for point in points:
            for name, option in ((specs[point] or {}).get("options") or {}).items():
                options.setdefault(name, (role, str(path.relative_to(root)), option or {}))
    return options


def expected(option):
    """What an option takes, in words: ``an integer``, ``a list of strings``, ``one of nccl, gloo``."""
    kind = option.get("type", "str")
    text = EXPECTED.get(kind, kind)
    if kind == "list" and option.get("elements"):
        text = f"a list of {EXPECTED_MANY.get(option['elements'], option['elements'])}"
    if option.get("choices"):
        text = "one of " + ", ".join(str(choice) for choice in option["choices"])
    return text


def _plain(message):
    """The validator's message without type names (``<class 'str'>``, ``_AnsibleTaggedStr``) or their phrases."""
    message = re.sub(r" is of type [^ ]+( found in '[^']*'\.?)?", r"\1", message)
    message = re.sub(r"<class '[\w.]*'>", "the value", message)
    return re.sub(r"\b_?Ansible(?:Tagged|Lazy)?(Str|Int|Float|Bool|List|Dict)\w*", lambda m: m.group(1).lower(), message)


def _native(value):
    """``value`` as plain dicts and lists: the validator deep-copies what it checks, and a deep copy of Ansible's
    lazy containers templates them again (the check's slowest step)."""
    if isinstance(value, Mapping):
        return {key: _native(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_native(item) for item in value]
    return value


def option_problem(name, value, option):
    """What is wrong with ``value`` for the option (Ansible's validator decides), or None."""
    result = ArgumentSpecValidator({name: _validated(option)}).validate({name: _native(value)})
    if not result.error_messages:
        return None
    error = result.errors.errors[0]
    if isinstance(error, (ArgumentTypeError, ArgumentValueError, ElementError)):
        return f"expected {expected(option)}"
    return f"expected {expected(option)}: {_plain(error.msg)}"


def argument_problems(host_vars, root):
    """One line per (role variable, value) that its role's argument spec refuses, naming every host that sets it.

    ``host_vars`` is ``{host: {name: value}}`` (a name absent: not set there). A value that cannot be read
    on the controller before any node is contacted (a template of a node's facts) is left to the role, which
    validates it when it starts.
    """
    options = role_options(root)
    problems = []
    for name, (role, source, option) in options.items():
        by_value = {}
        for host, variables in host_vars.items():
            if name in variables:
                value = variables[name]
                by_value.setdefault(declared._canonical(value), (value, []))[1].append(host)
        hidden = bool(option.get("no_log")) or bool(declared.SECRET.search(name))
        for value, hosts in by_value.values():
            if declared.is_unreadable(value):
                continue  # a template of what the controller cannot know yet (a node's facts): the role checks it
            problem = option_problem(name, value, option)
            if problem:
                problems.append(f"{declared._hosts_text(hosts)}: {name}={declared.show(value, hidden)}: {problem} "
                                f"(role {role}, {source})")
    return problems


def _allowed_without_key(variables):
    if ALLOW_NO_KEY not in variables:
        return False
    value = variables[ALLOW_NO_KEY]
    try:
        return boolean(value, strict=True) if not declared.is_unreadable(value) else False
    except TypeError:
        return False  # argument_problems names the value


def api_key_problems(host_vars):
    """Hosts without the API key vLLM requires (vllm_cluster_api_key, or vllm_service_api_key where set).

    One line per kind of problem, naming the hosts: not set or empty, unreadable (its lookup failed), or not
    printable ASCII without spaces. The key's value is never shown.
    """
    missing, malformed, unreadable = {}, {}, {}
    for host, variables in host_vars.items():
        if _allowed_without_key(variables):
            continue
        name = SERVICE_KEY if SERVICE_KEY in variables else API_KEY
        value = variables[name] if name in variables else None
        if declared.is_unreadable(value):
            unreadable.setdefault((name, str(value)), []).append(host)
        elif value is None or str(value) == "":
            missing.setdefault(name, []).append(host)
        elif not KEY_TEXT.match(str(value)):
            malformed.setdefault(name, []).append(host)
    where = ("set it for the deployment's group from Ansible Vault or an environment lookup "
             "(inventories/prod.example/group_vars/vllm_nodes.yml shows both)")
    unsafe = (f"to serve without a key (UNSAFE: anyone who reaches the API port can use it) set {ALLOW_NO_KEY}: true")
    problems = []
    for name, hosts in missing.items():
        problems.append(f"{declared._hosts_text(hosts)}: {name} is not set (or empty): expected the API key vLLM "
                        f"requires on /v1; {where}; {unsafe}")
    for (name, error), hosts in unreadable.items():
        problems.append(f"{declared._hosts_text(hosts)}: {name}=<{error}>: expected the API key vLLM requires on "
                        f"/v1; {where}")
    for name, hosts in malformed.items():
        problems.append(f"{declared._hosts_text(hosts)}: {name}=<hidden> has spaces or characters outside printable "
                        f"ASCII: expected the API key vLLM requires on /v1 (printable ASCII, no spaces)")
    return problems
