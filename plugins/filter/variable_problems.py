"""Filter ``vllm_ops.cluster.variable_problems``: unknown, divergent and wrongly typed variables, what the vLLM
release dropped, the API key.

Its documentation is variable_problems.yml beside this file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from ansible.errors import AnsibleFilterError
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import arguments, vllm_versions
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import variables as declared

# The collection's root (plugins/filter/ is two levels down): its roles' and meta/ specs ship with it.
ROOT = Path(__file__).resolve().parents[2]


class _Guarded(Mapping):
    """A host's variables (hostvars[host]: templated when read), with only our names, each read when asked for.

    The check reads the values it must show or compare and no other (a lookup in an API key's template runs only
    if that key is compared); a template that fails gives its error as the value, for the message.
    """

    def __init__(self, variables, prefixes):
        self._variables = variables
        self._names = [name for name in variables if isinstance(name, str) and name.startswith(tuple(prefixes))]

    def __getitem__(self, name):
        if name not in self._names:
            raise KeyError(name)
        try:
            value = self._variables[name]
            json.dumps(value, default=str)  # an undefined part (Ansible's marker) raises only when it is used
        except Exception as exc:  # noqa: BLE001 - a template that fails is reported by whoever reads it
            return declared.unreadable(exc)
        return value

    def __contains__(self, name):
        return name in self._names

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)


def variable_problems(host_vars, deployment=None, api_key=False):
    if not hasattr(host_vars, "items"):
        raise AnsibleFilterError(f"variable_problems: expected {{host: hostvars[host]}}, got {type(host_vars).__name__}")
    prefixes = declared.checked_prefixes(ROOT)
    guarded = {str(host): _Guarded(variables, prefixes) for host, variables in host_vars.items()}
    problems = declared.variable_problems(guarded, ROOT, deployment)
    problems += declared.input_problems(guarded)
    problems += arguments.argument_problems(guarded, ROOT)
    problems += vllm_versions.version_problems(guarded)
    if api_key:
        problems += arguments.api_key_problems(guarded)
    return problems


class FilterModule:
    """vllm_ops.cluster variable check (its documentation: variable_problems.yml beside this file)."""

    def filters(self):
        return {"variable_problems": variable_problems}
