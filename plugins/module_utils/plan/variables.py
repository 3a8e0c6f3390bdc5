"""The inventory variables vllm-cluster knows, and what is wrong with the ones a deployment sets.

The known names are read from specs, never listed here: the planner's inputs
(``request.VARIABLES``), every option of every entry point of every role's
``meta/argument_specs.yml``, and the collection's own ``meta/variables.yml`` (the
``vllm_cluster_*`` variables that are neither). Facts the roles and playbooks set
(``set_fact``, ``register``: read from their task files) are known too: a later
play of the same run sees them in hostvars. A name is checked when it starts
with ``vllm_cluster_`` or with the name of a role that has an argument spec
(``vllm_service_``, ...); names starting with ``_`` are internal, every other name
(Ansible's own, the inventory's) is not ours to judge.

``variable_problems`` returns one line per problem: a name no spec knows (with
``difflib`` suggestions), and a deployment-wide ``vllm_cluster_*`` variable whose
value differs between the deployment's hosts (the plan reads the head's alone).
Variables whose spec says ``per_host: true`` (a NIC, an address, the GPUs) or
``set_by`` (a fact the playbooks set) may differ. ``input_problems`` names a
planner input of the wrong kind (a word where an integer goes, an unknown
choice); the roles' variables are checked by Ansible's validator (arguments.py).

Pure Python (PyYAML, which Ansible brings, to read the specs); no Ansible import.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.checks import from_text, is_int, is_number
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.request import BY_KEY, INPUTS

COLLECTION = "vllm-cluster"
PREFIX = "vllm_cluster_"
COLLECTION_SPEC = "meta/variables.yml"
REQUEST_SPEC = "plugins/module_utils/plan/request.py"
#: A name that looks like a secret: its value is not shown even when no spec says no_log.
SECRET = re.compile(r"(key|token|secret|passw|credential)", re.I)
VALUE_WIDTH = 80
_NOT_SET = object()  # a host that does not set a compared variable


@dataclass(frozen=True)
class Known:
    """One declared variable: where it is declared and how the check treats it."""

    name: str
    owner: str  # COLLECTION, or the role whose argument spec declares it
    source: str  # the spec file, relative to the collection root
    per_host: bool = False
    set_by: str | None = None
    no_log: bool = False
    planning: bool = False  # a planner input (request.VARIABLES)

    @property
    def compared(self):
        """Must be equal on every host of a deployment: a collection variable (or a planner input such as
        vllm_runtime_vllm_version) that is neither per host nor a fact."""
        return (self.owner == COLLECTION and (self.planning or self.name.startswith(PREFIX)) and not self.per_host
                and not self.set_by)


def _role_specs(root):
    for path in sorted((root / "roles").glob("*/meta/argument_specs.yml")):
        yield path.parents[1].name, path


def _spec_files(root):
    """Every file _known_at reads."""
    files = [root / COLLECTION_SPEC] + [path for _role, path in _role_specs(root)]
    files += sorted(root.glob("roles/*/tasks/**/*.yml")) + sorted(root.glob("roles/*/handlers/*.yml"))
    return files + sorted(root.glob("playbooks/*.yml"))


def _known_at(root):
    """The known names and prefixes; read once per process while the files stay as they are (the variable check
    asks for both, and parsing every spec and task file is most of its time)."""
    root = Path(root)
    signature = []
    for path in _spec_files(root):
        try:
            info = path.stat()
        except OSError:
            continue
        signature.append((str(path), info.st_mtime_ns, info.st_size))
    return _known_read(str(root), tuple(signature))


def _cache_file(root, signature):
    """Where the known names of this collection, as its files are now, are kept between runs: each task of a
    playbook runs in a new process, and parsing every spec and task file is most of the check's time."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    key = hashlib.sha256(json.dumps([root, signature]).encode()).hexdigest()[:32]
    return Path(base) / "vllm-cluster" / f"known-variables-{key}.json"


@functools.lru_cache(maxsize=4)
def _known_read(root, signature):
    cache = _cache_file(root, signature)
    try:
        kept = json.loads(cache.read_text())
        return {name: Known(**entry) for name, entry in kept["known"].items()}, kept["prefixes"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none yet, or unreadable: read the files
    known, prefixes = _known_parse(root)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        temporary = cache.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps({"known": {name: asdict(entry) for name, entry in known.items()},
                                         "prefixes": prefixes}))
        os.replace(temporary, cache)
    except OSError:
        pass  # a read-only home: the next run parses again
    return known, prefixes


def _known_parse(root):
    root = Path(root)
    known = {}
    for spec in INPUTS:
        if spec.variable:
            known[spec.variable] = Known(spec.variable, COLLECTION, REQUEST_SPEC, planning=True)
    collection = safe_load((root / COLLECTION_SPEC).read_text()) or {}
    for name, entry in (collection.get("variables") or {}).items():
        entry = entry or {}
        known.setdefault(name, Known(name, COLLECTION, COLLECTION_SPEC, per_host=bool(entry.get("per_host")),
                                     set_by=entry.get("set_by"), no_log=bool(entry.get("no_log"))))
    for role, path in _role_specs(root):
        specs = (safe_load(path.read_text()) or {}).get("argument_specs") or {}
        for entry_point in specs.values():
            for name, option in ((entry_point or {}).get("options") or {}).items():
                known.setdefault(name, Known(name, role, str(path.relative_to(root)),
                                             no_log=bool((option or {}).get("no_log"))))
    for name, owner, source in _set_by_the_code(root):
        known.setdefault(name, Known(name, owner, source, set_by=source))
    prefixes = {PREFIX: COLLECTION} | {f"{role}_": role for role, _path in _role_specs(root)}
    return known, prefixes


def _yaml():
    """PyYAML, imported when the check runs: on the controller, which has it (a target host need not)."""
    import yaml

    return yaml


def _safe_loader():
    """libyaml's SafeLoader where PyYAML has it (the specs and task files parse several times faster), else PyYAML's."""
    yaml = _yaml()
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(text):
    """yaml.safe_load, with libyaml where available."""
    return _yaml().load(text, Loader=_safe_loader())


def _any_tag_loader():
    """A SafeLoader for task files whatever tags they hold (!unsafe, !vault): only the names matter here."""
    yaml = _yaml()

    class AnyTagLoader(_safe_loader()):
        pass

    AnyTagLoader.add_multi_constructor("!", lambda loader, _suffix, node: (
        loader.construct_scalar(node) if isinstance(node, yaml.ScalarNode) else None))
    return AnyTagLoader


def _set_by_the_code(root):
    """``(name, owner, file)`` of every fact a role's tasks or a playbook sets (set_fact) or registers.

    They are outputs, not inputs: a later play of the same run (molecule's runtime.yml, then ray.yml) sees them
    in hostvars, and the check must not call them unknown.
    """
    files = [(path.relative_to(root).parts[1], path) for path in sorted(root.glob("roles/*/tasks/**/*.yml"))]
    files += [(path.relative_to(root).parts[1], path) for path in sorted(root.glob("roles/*/handlers/*.yml"))]
    files += [(COLLECTION, path) for path in sorted(root.glob("playbooks/*.yml"))]
    yaml, loader = _yaml(), _any_tag_loader()
    for owner, path in files:
        source = str(path.relative_to(root))
        stack = [yaml.load(path.read_text(), Loader=loader)]  # a SafeLoader that keeps tagged values
        while stack:
            item = stack.pop()
            if isinstance(item, list):
                stack.extend(item)
                continue
            if not isinstance(item, dict):
                continue
            for action in ("ansible.builtin.set_fact", "set_fact"):
                if isinstance(item.get(action), dict):
                    yield from ((name, owner, source) for name in item[action] if name != "cacheable")
            if isinstance(item.get("register"), str):
                yield item["register"], owner, source
            stack.extend(item.values())


def known_variables(root):
    """``{name: Known}`` of every declared variable, read from the specs under the collection ``root``."""
    return dict(_known_at(str(root))[0])


def checked_prefixes(root):
    """``{prefix: owner}``: ``vllm_cluster_`` (the collection) and ``<role>_`` of every role with an argument spec."""
    return dict(_known_at(str(root))[1])


def _prefix_of(name, prefixes):
    """The checked prefix ``name`` starts with (the longest), or None: not ours to judge."""
    matches = [prefix for prefix in prefixes if name.startswith(prefix)]
    return max(matches, key=len) if matches else None


def _acronym_matches(suffix, candidates):
    """Known suffixes that abbreviate ``suffix`` (tensor_parallel -> tp) or that it abbreviates (gmu)."""
    words = [word for word in suffix.split("_") if word]
    acronyms = {"".join(word[0] for word in words[:count]) for count in range(2, len(words) + 1)}
    found = [candidate for candidate in candidates if candidate in acronyms]
    for candidate in candidates:
        parts = [word for word in candidate.split("_") if word]
        if len(parts) > 1 and "".join(word[0] for word in parts) == suffix and candidate not in found:
            found.append(candidate)
    return found


def suggestions(name, known, prefix):
    """Up to three known names of the same prefix that ``name`` probably meant, best first."""
    suffix = name[len(prefix):]
    suffixes = sorted(other[len(prefix):] for other in known if other.startswith(prefix))
    close = difflib.get_close_matches(suffix, suffixes, n=3, cutoff=0.6)
    ranked = _acronym_matches(suffix, suffixes) + close
    if not ranked:  # a longer or shorter name around a known one: vllm_cluster_model_name, vllm_cluster_gpu
        ranked = [other for other in suffixes if len(other) > 2 and (other in suffix or suffix in other)]
    unique = list(dict.fromkeys(ranked))[:3]
    return [prefix + match for match in unique]


def _flow(value):
    """A value in YAML's flow style with strings in single quotes: what Ansible's output shows without escapes."""
    if isinstance(value, str):
        return "'" + str(value).replace("'", "''") + "'"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_flow(item)}" for key, item in sorted(value.items(), key=lambda pair: str(pair[0]))) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_flow(item) for item in value) + "]"
    return _flow(str(value))


def show(value, hidden=False):
    """A value as a message shows it: YAML's flow style, strings in single quotes (Ansible's output escapes double
    ones), short, and never a secret."""
    if hidden:
        return "<hidden>"
    if isinstance(value, _Unreadable):
        return f"<{value}>"
    text = _flow(value)
    return text if len(text) <= VALUE_WIDTH else text[: VALUE_WIDTH - 3] + "..."


class _Unreadable(str):
    """A value that could not be read (its template failed); compared by its error, shown as <error>."""


def is_unreadable(value):
    """Whether ``value`` is what a caller recorded for a variable it could not read (``unreadable``)."""
    return isinstance(value, _Unreadable)


def unreadable(error):
    """What a caller records for a variable whose value it could not read (the error's text)."""
    return _Unreadable(f"cannot read it: {error}")


def _hosts_text(hosts):
    return ("host " if len(hosts) == 1 else "hosts ") + ", ".join(hosts)


def _canonical(value):
    if isinstance(value, _Unreadable):
        return ("unreadable", str(value))
    try:
        return json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return repr(value)


def unknown_problems(host_vars, known, prefixes):
    """One line per unknown (name, value): the hosts that set it, the value, whose variable it is not, suggestions."""
    found = {}
    for host, variables in host_vars.items():
        for name in variables:
            if name.startswith("_") or name in known:
                continue
            if _prefix_of(name, prefixes) is None:
                continue
            value = variables[name]
            found.setdefault(name, {}).setdefault(_canonical(value), (value, []))[1].append(host)
    problems = []
    for name in sorted(found):
        prefix = _prefix_of(name, prefixes)
        owner = prefixes[prefix]
        meant = suggestions(name, known, prefix)
        hidden = bool(SECRET.search(name)) or any(known[m].no_log for m in meant)
        whose = f"a variable of {COLLECTION}" if owner == COLLECTION else f"a variable of role {owner}"
        if meant:
            hint = "did you mean " + (meant[0] if len(meant) == 1 else ", ".join(meant[:-1]) + " or " + meant[-1]) + "?"
        elif owner == COLLECTION:
            hint = (f"the known ones are the planner's inputs ({REQUEST_SPEC}, INPUTS), {COLLECTION_SPEC} "
                    "and the roles' meta/argument_specs.yml")
        else:
            hint = f"the known ones are in roles/{owner}/meta/argument_specs.yml (ansible-doc -t role vllm_ops.cluster.{owner})"
        for value, hosts in found[name].values():
            problems.append(f"{_hosts_text(hosts)}: {name}={show(value, hidden)} is not {whose}; {hint}")
    return problems


def divergence_problems(host_vars, known, deployment):
    """One line per deployment-wide variable whose value is not the same on every host of the deployment."""
    hosts = list(host_vars)
    problems = []
    if len(hosts) < 2:
        return problems
    for name in sorted(known):
        spec = known[name]
        if not spec.compared or not any(name in host_vars[host] for host in hosts):
            continue
        groups = {}
        for host in hosts:
            variables = host_vars[host]
            value = variables[name] if name in variables else _NOT_SET
            groups.setdefault(_canonical(value), (value, []))[1].append(host)
        if len(groups) < 2:
            continue
        hidden = spec.no_log or bool(SECRET.search(name))
        shown, secrets = [], 0
        for value, group in groups.values():
            if value is _NOT_SET:
                text = "(not set)"
            elif hidden:
                secrets += 1
                text = f"<hidden value {secrets}>"
            else:
                text = show(value)
            shown.append(", ".join(group) + "=" + text)
        values = ", ".join(shown)
        reads = ("the plan reads the head's value alone" if spec.planning
                 else "every host must have the same value")
        problems.append(f"{name} differs between the hosts of deployment {deployment}: {values}; "
                        f"set it for the group (group_vars), not per host ({reads})")
    return problems


def _input_expected(spec, value):
    """What a planner input of a checked kind expects, when ``value`` is not it (None: the value is fine)."""
    value = from_text(value, spec.kind)
    if spec.kind == "int" and not is_int(value):
        return "an integer"
    if spec.kind == "number" and not is_number(value):
        return "a number"
    if spec.kind == "bool" and not isinstance(value, bool):
        return "true or false"
    if spec.kind == "choice" and value not in spec.choices:
        return "one of " + ", ".join(spec.choices)
    return None


HUB_SOURCE = "vllm_runtime_model_source"


def _hub_source(variables) -> bool:
    """The model comes from a hub's pinned commit (role vllm_runtime): plan.yml reads its config.json there."""
    try:
        source = variables[HUB_SOURCE] if HUB_SOURCE in variables else ""
    except KeyError:
        return False
    return isinstance(source, str) and source.startswith("hub:")


def input_problems(host_vars):
    """One line per planner input (request.py's INPUTS) of the wrong kind (a word for an integer, an unknown
    choice), and one when no host of the deployment sets the model.

    Quoted numbers and booleans are what the planner reads them as ("2" is 2, checks.from_text); ranges and the
    rules between inputs are the planner's, which names them when it plans.
    """
    problems = []
    model = BY_KEY["model"].variable
    if host_vars and not any(model in variables or _hub_source(variables) for variables in host_vars.values()):
        problems.append(f"{_hosts_text(list(host_vars))}: {model} is not set: expected the model to serve, a catalog "
                        "name, a hub id or a path on the controller, set for the deployment's group (or "
                        f"{HUB_SOURCE}: hub:<org>/<name>@<commit>, whose config.json plan.yml reads)")
    for spec in INPUTS:
        if not spec.variable or spec.kind not in ("int", "number", "bool", "choice"):
            continue
        by_value = {}
        for host, variables in host_vars.items():
            if spec.variable in variables and variables[spec.variable] is not None:
                value = variables[spec.variable]
                by_value.setdefault(_canonical(value), (value, []))[1].append(host)
        for value, hosts in by_value.values():
            if isinstance(value, _Unreadable):
                continue  # the planner reads it again, and names its error, once the facts are gathered
            wanted = _input_expected(spec, value)
            if wanted:
                problems.append(f"{_hosts_text(hosts)}: {spec.variable}={show(value)}: expected {wanted} "
                                f"(a planner input, {REQUEST_SPEC})")
    return problems


def deployment_name(host_vars):
    """The deployment's name as the plan will read it: the head's (the first host's) vllm_cluster_deployment."""
    spec = BY_KEY["deployment"]
    for variables in host_vars.values():
        value = variables.get(spec.variable) if hasattr(variables, "get") else None
        return value if isinstance(value, str) and value and not isinstance(value, _Unreadable) else spec.default
    return spec.default


def variable_problems(host_vars, root, deployment=None):
    """Every problem of a deployment's variables, as lines (empty: none).

    ``host_vars`` is ``{host: {name: value}}`` for the deployment's hosts, in node order; only names with a checked
    prefix need be present (and readable) - others are ignored. ``root`` is the collection's root directory.
    """
    known, prefixes = _known_at(str(root))
    deployment = deployment or deployment_name(host_vars)
    return unknown_problems(host_vars, known, prefixes) + divergence_problems(host_vars, known, deployment)
