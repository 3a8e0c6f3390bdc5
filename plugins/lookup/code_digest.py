"""Lookup code_digest: sha256 over vllm-cluster's own playbooks, roles and plugins."""

from __future__ import annotations

DOCUMENTATION = r"""
name: code_digest
author: vllm-cluster developers (@vllm-ops)
version_added: "0.4.0"
short_description: sha256 over vllm-cluster's playbooks, roles and plugins
description:
  - Part of deploy.yml's input digest (C(stage_inputs_digest)), so a new vllm-cluster version
    runs every stage again. Computed once per run on the controller, over the collection the lookup
    belongs to (a checkout and the collection built from it have the same digest).
"""

EXAMPLES = r"""
- name: Print the code digest
  ansible.builtin.debug:
    msg: "{{ lookup('vllm_ops.cluster.code_digest') }}"
"""

RETURN = r"""
_raw:
  description: One sha256 hex digest.
  type: list
  elements: str
"""

from pathlib import Path  # noqa: E402

from ansible.plugins.lookup import LookupBase  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy.stage_stamp import code_digest  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
_CACHE: dict = {}


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        if "digest" not in _CACHE:
            _CACHE["digest"] = code_digest(ROOT)
        return [_CACHE["digest"]]
