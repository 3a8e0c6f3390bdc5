"""Where vllm-cluster writes on the controller: results/<deployment>/ under the operator's working directory.

Never under the collection: an installed collection is read-only code, shared by every user of the
controller. ``vllm_cluster_results_dir`` moves it; a relative value is taken from the working
directory of ansible-playbook (or of bin/vllm-cluster-report), like a path on its command line.

Pure Python, no Ansible import.
"""

from __future__ import annotations

import os

DEFAULT = "results"


def results_dir(configured: str | None, cwd: str) -> str:
    """The absolute results directory: ``configured`` (``~`` expanded; relative to ``cwd``) or ``<cwd>/results``."""
    value = os.path.expanduser(str(configured or "").strip()) or DEFAULT
    return os.path.normpath(os.path.join(cwd, value))
