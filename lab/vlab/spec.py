"""Names, addresses and paths of one lab. Pure: nothing here touches the host.

Every host-side name starts with "<lab name>-", so labs never share a name and
the leftovers check can find everything a lab made from its name alone. Linux
limits interface names to 15 characters, hence the 8-character lab names.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STATE_ROOT = Path("/var/lib/vllm-cluster-lab")
CACHE_ROOT = Path("/var/cache/vllm-cluster-lab")
CGROUP_ROOT_NAME = "vllm-cluster-lab"

DEFAULT_NAME = "vlab"
DEFAULT_NODES = 3
MAX_NODES = 32
DEFAULT_FABRIC_MTU = 9000
MANAGEMENT_MTU = 1500
MAX_INDEX = 250
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9]{0,7}$")

# 10.231.<index>.0/24 is the management network of lab <index>, 10.232.<index>.0/24 its fabric.
MANAGEMENT_PREFIX = (10, 231)
FABRIC_PREFIX = (10, 232)
FIRST_NODE_OCTET = 10  # node K is .(10 + K); .1 is the host's end of the management bridge


def check_name(name: str) -> str:
    if not NAME_PATTERN.match(name):
        raise ValueError(f"lab name {name!r} is invalid: expected 1-8 characters [a-z0-9], starting with a letter "
                         "(interface names like '<name>-mgmt' must fit Linux's 15-character limit)")
    return name


def default_inventory(name: str) -> Path:
    """inventories/lab/ for the default lab; a per-lab directory under .cache/ for any other."""
    if name == DEFAULT_NAME:
        return REPO / "inventories" / "lab"
    return REPO / ".cache" / "labs" / name / "inventory"


@dataclass(frozen=True)
class LabSpec:
    name: str
    index: int
    nodes: int
    fabric_mtu: int = DEFAULT_FABRIC_MTU
    inventory_dir: Path | None = None

    def __post_init__(self) -> None:
        check_name(self.name)
        if not 0 <= self.index <= MAX_INDEX:
            raise ValueError(f"lab index {self.index} is outside 0..{MAX_INDEX}")
        if not 1 <= self.nodes <= MAX_NODES:
            raise ValueError(f"--nodes {self.nodes} is outside 1..{MAX_NODES}")
        if not 1280 <= self.fabric_mtu <= 65535:
            raise ValueError(f"fabric MTU {self.fabric_mtu} is outside 1280..65535")

    # --- names -------------------------------------------------------------
    @property
    def node_names(self) -> list[str]:
        return [f"node{k}" for k in range(1, self.nodes + 1)]

    @property
    def bridge_management(self) -> str:
        return f"{self.name}-mgmt"

    @property
    def bridge_fabric(self) -> str:
        return f"{self.name}-fab"

    def veth_management(self, k: int) -> str:
        return f"{self.name}-{k}m"

    def veth_fabric(self, k: int) -> str:
        return f"{self.name}-{k}f"

    def netns(self, node: str) -> str:
        return f"{self.name}-{node}"

    def machine(self, node: str) -> str:
        return f"{self.name}-{node}"

    # --- addresses ---------------------------------------------------------
    @property
    def management_network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"{MANAGEMENT_PREFIX[0]}.{MANAGEMENT_PREFIX[1]}.{self.index}.0/24")

    @property
    def fabric_network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"{FABRIC_PREFIX[0]}.{FABRIC_PREFIX[1]}.{self.index}.0/24")

    @property
    def management_gateway(self) -> str:
        return str(self.management_network.network_address + 1)

    def management_address(self, k: int) -> str:
        return str(self.management_network.network_address + FIRST_NODE_OCTET + k)

    def fabric_address(self, k: int) -> str:
        return str(self.fabric_network.network_address + FIRST_NODE_OCTET + k)

    # --- paths -------------------------------------------------------------
    @property
    def state_dir(self) -> Path:
        return STATE_ROOT / self.name

    def node_dir(self, node: str) -> Path:
        return self.state_dir / node

    def node_root(self, node: str) -> Path:
        """The merged overlay the node boots from."""
        return self.node_dir(node) / "root"

    @property
    def shared_dir(self) -> Path:
        """A host directory every node mounts at /srv/shared: one filesystem the nodes share, as a cluster's
        NFS or CephFS mount (lab nodes cannot mount NFS themselves)."""
        return self.state_dir / "shared"

    @property
    def inventory(self) -> Path:
        return self.inventory_dir or default_inventory(self.name)

    def to_json(self) -> dict:
        return {"name": self.name, "index": self.index, "nodes": self.nodes,
                "fabric_mtu": self.fabric_mtu, "inventory_dir": str(self.inventory)}

    @classmethod
    def from_json(cls, data: dict) -> LabSpec:
        return cls(name=data["name"], index=int(data["index"]), nodes=int(data["nodes"]),
                   fabric_mtu=int(data["fabric_mtu"]), inventory_dir=Path(data["inventory_dir"]))


def node_number(node: str) -> int:
    match = re.fullmatch(r"node([1-9][0-9]*)", node)
    if not match:
        raise ValueError(f"node name {node!r} is invalid: expected node1, node2, ...")
    return int(match.group(1))
