"""Ray's authentication, pinned on every Ray node of a deployment (docs/security.md).

Ray 2.59 and later turn token authentication on by themselves where ``RAY_AUTH_MODE`` is unset and a token
exists (``~/.ray/auth_token``, which a local ``ray.init()`` leaves): nodes without it are refused and the
cluster splits with no change to its configuration. The plan therefore always names the mode.
"""

from __future__ import annotations

RAY_AUTH_MODES = ("token", "disabled")
# The deployment's token on each node: root-only (0600). The Ray units and vLLM read it through systemd's
# LoadCredential=, the roles' own `ray` commands (run as root) from here.
RAY_AUTH_TOKEN_PATH = "/etc/vllm-cluster/ray-auth-token"
# The credential's name in a unit (LoadCredential=NAME:PATH, read at %d/NAME).
RAY_AUTH_CREDENTIAL = "ray-auth-token"


def ray_auth_section(mode):
    """The plan's ``ray_auth``: the mode, where the token lives (or is removed from, when disabled), its
    credential's name in the units, and the environment a `ray` command run as root needs."""
    environment = {"RAY_AUTH_MODE": mode}
    if mode == "token":
        environment["RAY_AUTH_TOKEN_PATH"] = RAY_AUTH_TOKEN_PATH
    return {"mode": mode, "token_path": RAY_AUTH_TOKEN_PATH, "credential": RAY_AUTH_CREDENTIAL,
            "environment": environment}
