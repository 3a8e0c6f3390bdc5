"""Every network variable of a node, derived from one fact: its fabric interface.

The most common multi-node failure is NIC incoherence: vLLM's ``get_ip()``,
Ray's node IP, NCCL and Gloo each pick an interface on their own. Deriving all
of them from the same interface and address removes that class of failure.
Shared by the planner (env per node) and the ``nccl_network`` role.
"""

from __future__ import annotations

import ipaddress
import re

# Linux interface names: at most 15 bytes, no '/' or whitespace.
_IFNAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")
# An HCA as NCCL_IB_HCA takes it: device name, optional ":port".
_HCA = re.compile(r"^[A-Za-z0-9_.-]{1,64}(:[0-9]{1,3})?$")


class NetworkEnvError(ValueError):
    """An interface, address or HCA name that cannot be used."""


def network_env(fabric_interface, fabric_address, ib_hcas=None):
    """Return the environment that pins vLLM, NCCL, Gloo and torch to one NIC.

    ``NCCL_IB_HCA`` is written with a leading ``=`` so NCCL matches the names
    exactly: without it ``mlx5_1`` would also select ``mlx5_10`` ... ``mlx5_17``.
    Without HCAs, ``NCCL_IB_DISABLE=1`` makes NCCL use sockets on the fabric
    interface instead of probing whatever RDMA devices exist.
    """
    if not isinstance(fabric_interface, str) or not _IFNAME.match(fabric_interface):
        raise NetworkEnvError(
            f"fabric interface {fabric_interface!r} is not a Linux interface name (1-15 characters, no '/')"
        )
    try:
        address = ipaddress.ip_address(fabric_address)
    except (TypeError, ValueError):
        raise NetworkEnvError(
            f"fabric address {fabric_address!r} of interface {fabric_interface} is not an IP address "
            "(VLLM_HOST_IP must be one)"
        ) from None
    env = {
        "VLLM_HOST_IP": str(address),
        "NCCL_SOCKET_IFNAME": fabric_interface,
        "GLOO_SOCKET_IFNAME": fabric_interface,
        "TP_SOCKET_IFNAME": fabric_interface,
    }
    if ib_hcas:
        if isinstance(ib_hcas, str) or not isinstance(ib_hcas, list | tuple):
            raise NetworkEnvError(f"ib_hcas must be a list of HCA names, got {ib_hcas!r}")
        for hca in ib_hcas:
            if not isinstance(hca, str) or not _HCA.match(hca):
                raise NetworkEnvError(f"HCA name {hca!r} is not a device name like mlx5_0 or mlx5_0:1")
        if len(set(ib_hcas)) != len(ib_hcas):
            raise NetworkEnvError(f"ib_hcas lists an HCA twice: {list(ib_hcas)}")
        env["NCCL_IB_HCA"] = "=" + ",".join(ib_hcas)
    else:
        env["NCCL_IB_DISABLE"] = "1"
    return env
