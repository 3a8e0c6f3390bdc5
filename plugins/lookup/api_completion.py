"""Lookup api_completion: one completion from each API server, asked from the controller as a client would."""

from __future__ import annotations

DOCUMENTATION = r"""
name: api_completion
author: vllm-cluster developers (@vllm-ops)
version_added: "0.11.0"
short_description: Ask each of the deployment's API servers for one completion, from the controller
description:
  - deploy.yml's converged check (C(playbooks/converged.yml)) skips a stage only when the deployment answers a real
    completion from the controller. Each target gets C(POST /v1/completions) (C(max_tokens) 1, the API key as a
    bearer token), all at once, each bounded by O(timeout).
  - >-
    Returns the findings, one per target that did not answer a completion
    (C(controller: POST http://10.0.0.1:8000/v1/completions timed out after 10 s)); none when every one did.
    The wording is C(plugins/module_utils/deploy/health.py)'s.
options:
  _terms:
    description: The targets, C({host, url, model}) (filter C(vllm_ops.cluster.api_targets)).
    type: list
    elements: dict
    required: true
  api_key:
    description: The API key (C(vllm_cluster_api_key)); none sent when empty.
    type: str
    default: ""
  timeout:
    description: Seconds each request may take.
    type: float
    default: 10
"""

EXAMPLES = r"""
- name: What the controller finds
  ansible.builtin.debug:
    msg: >-
      {{ query('vllm_ops.cluster.api_completion', vllm_cluster_plan | vllm_ops.cluster.api_targets,
               api_key=vllm_cluster_api_key, timeout=10) }}
"""

RETURN = r"""
_raw:
  description: The findings, one string per target that did not answer a completion.
  type: list
  elements: str
"""

import urllib.error  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

from ansible.module_utils.urls import open_url  # noqa: E402
from ansible.plugins.lookup import LookupBase  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.deploy import health  # noqa: E402


def ask(target, api_key, timeout):
    """One probe -> its finding or None. The proxy settings of the environment apply, as for any client."""
    url, body, headers = health.completion_request(target, api_key)
    try:
        response = open_url(url, data=body, headers=headers, method="POST", timeout=timeout)
        with response:
            return health.completion_problem(target, timeout, status=response.status,
                                             body=response.read(65536).decode("utf-8", "replace"))
    except urllib.error.HTTPError as error:
        return health.completion_problem(target, timeout, status=error.code,
                                         body=error.read(4096).decode("utf-8", "replace"))
    except TimeoutError:
        return health.completion_problem(target, timeout, timed_out=True)
    except urllib.error.URLError as error:
        if isinstance(error.reason, TimeoutError):
            return health.completion_problem(target, timeout, timed_out=True)
        return health.completion_problem(target, timeout, error=str(error.reason))
    except (OSError, ValueError) as error:
        return health.completion_problem(target, timeout, error=str(error))


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        targets = [item for term in terms for item in (term if isinstance(term, list) else [term])]
        if not targets:
            return []
        api_key, timeout = self.get_option("api_key") or "", float(self.get_option("timeout"))
        with ThreadPoolExecutor(max_workers=min(len(targets), 16)) as pool:
            found = list(pool.map(lambda target: ask(target, api_key, timeout), targets))
        return [problem for problem in found if problem]
