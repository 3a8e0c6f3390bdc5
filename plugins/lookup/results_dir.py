"""Lookup results_dir: the controller's results directory, under the working directory unless configured."""

from __future__ import annotations

DOCUMENTATION = r"""
name: results_dir
author: vllm-cluster developers (@vllm-ops)
version_added: "0.6.0"
short_description: The controller's results directory (plan.json, benchmark stages, the doctor's report)
description:
  - Thin shell over C(plugins/module_utils/deploy/results.py). The term (the inventory's
    C(vllm_cluster_results_dir)) made absolute against ansible-playbook's working directory, C(~) expanded;
    without one, C(results/) under that working directory.
  - Never a directory of the collection itself, which an installed collection shares between its users.
options:
  _terms:
    description: The configured directory; empty or none for the default.
    type: list
    elements: str
    required: false
"""

EXAMPLES = r"""
- name: Where plan.json goes
  ansible.builtin.debug:
    msg: "{{ lookup('vllm_ops.cluster.results_dir', vllm_cluster_results_dir | default('')) }}/lab/plan.json"
"""

RETURN = r"""
_raw:
  description: One absolute path.
  type: list
  elements: str
"""

import os  # noqa: E402

from ansible.errors import AnsibleLookupError  # noqa: E402
from ansible.plugins.lookup import LookupBase  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy.results import results_dir  # noqa: E402


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        if len(terms) > 1:
            raise AnsibleLookupError(f"results_dir: expected at most one directory, got {len(terms)}: {terms!r}")
        return [results_dir(terms[0] if terms else None, os.getcwd())]
