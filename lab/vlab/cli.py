"""`lab`: bring a multi-node nspawn lab up, down, inspect it, reboot nodes, change their hardware."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import cgroups, inventory, layer, leftovers, machines, network, registry, rootfs
from .shell import LabError, file_lock
from .spec import (
    DEFAULT_FABRIC_MTU,
    DEFAULT_NAME,
    DEFAULT_NODES,
    STATE_ROOT,
    LabSpec,
    check_name,
    node_number,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doubles"))
import labhw  # noqa: E402  (lab/doubles/labhw.py: the doubles' own config rules)

REQUIRED_TOOLS = ("systemd-nspawn", "debootstrap", "ip", "nsenter", "mount", "ssh", "ssh-keygen")


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def lab_lock(name: str):
    return file_lock(STATE_ROOT / ".locks" / f"{name}.lock")


def require_root_and_tools() -> None:
    if os.geteuid() != 0:
        raise LabError("lab needs root (namespaces, mounts, systemd-nspawn); run it with sudo or as root")
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing:
        raise LabError(f"missing host tools: {', '.join(missing)} "
                       "(packages systemd-container, debootstrap, iproute2, util-linux, openssh-client)")


def existing_spec(name: str) -> tuple[LabSpec, dict]:
    record = registry.load(name)
    if record is None:
        raise LabError(f"lab {name} is not up (no {registry.record_path(name)}); start it with `lab up --name {name}`")
    return LabSpec.from_json(record), record


def images(record: dict) -> tuple[Path, Path]:
    rootfs_dir, layer_dir = Path(record["rootfs"]), Path(record["layer"])
    for image in (rootfs_dir, layer_dir):
        if not image.is_dir():
            raise LabError(f"lab {record['name']} boots from {image}, which is gone; "
                           f"run `lab down --name {record['name']}` and `lab up` again")
    return rootfs_dir, layer_dir


def default_hardware(spec: LabSpec) -> dict:
    return dict(labhw.DEFAULTS, fabric_mtu=spec.fabric_mtu)


def node_fixtures(record: dict) -> Path:
    return Path(record["layer"]) / layer.NODE_FIXTURES


# --------------------------------------------------------------------------- up

def cmd_up(args: argparse.Namespace) -> int:
    require_root_and_tools()
    name = check_name(args.name)
    started = time.monotonic()
    # Build images outside the locks (a first build takes minutes); a lab that exists
    # keeps booting from the images it was made with.
    fresh = (rootfs.ensure_rootfs(), layer.ensure_layer()) if registry.load(name) is None else None
    with lab_lock(name):
        with file_lock(registry.LOCK):
            record = registry.load(name)
            if record is not None:
                spec = LabSpec.from_json(record)
                if args.nodes is not None and args.nodes != spec.nodes:
                    raise LabError(f"lab {name} is up with {spec.nodes} nodes, not {args.nodes}; "
                                   f"run `lab down --name {name}` first to change its size")
                if args.inventory is not None and Path(args.inventory).resolve() != spec.inventory.resolve():
                    raise LabError(f"lab {name} is up with its inventory in {spec.inventory}, not {args.inventory}")
                rootfs_dir, layer_dir = images(record)
            else:
                rootfs_dir, layer_dir = fresh or (rootfs.ensure_rootfs(), layer.ensure_layer())
                spec = LabSpec(name=name, index=registry.allocate_index(name),
                               nodes=args.nodes or DEFAULT_NODES, fabric_mtu=args.fabric_mtu,
                               inventory_dir=Path(args.inventory).resolve() if args.inventory else None)
                network.check_subnets_free(spec)
                registry.save(spec, rootfs_dir, layer_dir)
        public_key = machines.ensure_ssh_key(spec).with_suffix(".pub").read_text()
        network.ensure_bridges(spec)
        for k, node in enumerate(spec.node_names, start=1):
            machines.mount_root(spec, node, rootfs_dir, layer_dir)
            machines.provision(spec, node, public_key, default_hardware(spec))
            hardware = machines.read_hardware(spec, node)
            network.ensure_node_links(spec, k, hardware["fabric_mtu"], hardware["fabric_link"])
            machines.start(spec, node)
        states = machines.wait_ready(spec, spec.node_names)
        inventory.write(spec)
    elapsed = time.monotonic() - started
    print(f"lab {spec.name}: {plural(spec.nodes, 'node')} up in {elapsed:.1f}s; inventory {spec.inventory}")
    for k, node in enumerate(spec.node_names, start=1):
        print(f"  {node:<7} {states[node]:<9} management {spec.management_address(k):<14} "
              f"fabric eth1 {spec.fabric_address(k)}")
    return 0


# --------------------------------------------------------------------------- down

def lab_nodes(name: str, spec: LabSpec | None) -> list[str]:
    """The nodes to take down: the record's, plus any node directory or namespace left by a crash."""
    nodes = set(spec.node_names if spec else [])
    state = STATE_ROOT / name
    if state.is_dir():
        nodes.update(p.name for p in state.iterdir() if p.is_dir() and p.name.startswith("node"))
    nodes.update(ns[len(name) + 1:] for ns in network.netns_list() if ns.startswith(f"{name}-node"))
    return sorted(nodes, key=lambda n: int(n[4:]) if n[4:].isdigit() else 0)


def cmd_down(args: argparse.Namespace) -> int:
    require_root_and_tools()
    name = check_name(args.name)
    started = time.monotonic()
    with lab_lock(name):
        spec = registry.load_spec(name)
        nodes = lab_nodes(name, spec)
        # Without a record (a crashed `up`), names and paths still follow from the lab's name alone.
        shape = spec or LabSpec(name=name, index=0, nodes=max([node_number(n) for n in nodes] + [1]),
                                inventory_dir=Path(args.inventory).resolve() if args.inventory else None)
        for node in nodes:  # all nodes power off at once
            machines.request_poweroff(shape, node)
        for node in nodes:
            machines.wait_stopped(shape, node)
            machines.unmount_root(shape, node)
            network.remove_node_links(shape, node, node_number(node))
        network.remove_bridges(shape)
        cgroups.remove(cgroups.lab_dirs(name))
        for parent in {d.parent for d in cgroups.lab_dirs(name)}:
            try:
                parent.rmdir()  # the shared vllm-cluster-lab/ level, once no lab uses it
            except OSError:
                pass
        state = STATE_ROOT / name
        if state.exists():
            if any(p.startswith(f"{state}/") for p in leftovers.find(name).get("mounts", [])):
                raise LabError(f"lab {name}: mounts remain under {state}; not deleting it")
            shutil.rmtree(state)
        inventory.remove(shape)
    remaining = leftovers.find(name)
    if remaining:
        print(f"lab {name}: down, but these remain:\n{leftovers.describe(remaining)}", file=sys.stderr)
        return 1
    print(f"lab {name}: down in {time.monotonic() - started:.1f}s; leftovers check: nothing remains")
    return 0


# --------------------------------------------------------------------------- status

def node_status(spec: LabSpec, node: str) -> dict:
    k = node_number(node)
    supervisor = machines.supervisor_pid(spec, node)
    state = "poweroff"
    if supervisor is not None:
        state = machines.system_state(spec, node, wait=False, timeout=10) if machines.port_open(
            spec.management_address(k)) else "booting"
    return {
        "node": node, "state": state, "supervisor_pid": supervisor,
        "nspawn_pid": machines.nspawn_pid(spec, node), "leader_pid": machines.leader_pid(spec, node),
        "management_address": spec.management_address(k), "fabric_address": spec.fabric_address(k),
        "links": network.node_addresses(spec, node) if spec.netns(node) in network.netns_list() else {},
        "memory": cgroups.memory_bytes(spec.name, node),
    }


def unexpected(spec: LabSpec, found: dict[str, list[str]]) -> dict[str, list[str]]:
    """Of what exists for a lab that is up, what does not belong to its current nodes."""
    netns = {spec.netns(n) for n in spec.node_names}
    links = {spec.bridge_management, spec.bridge_fabric}
    links |= {spec.veth_management(k) for k in range(1, spec.nodes + 1)}
    links |= {spec.veth_fabric(k) for k in range(1, spec.nodes + 1)}
    mounts = {str(spec.node_root(n)) for n in spec.node_names}
    extra = {"netns": [n for n in found.get("netns", []) if n not in netns],
             "links": [n for n in found.get("links", []) if n not in links],
             "mounts": [m for m in found.get("mounts", []) if m not in mounts]}
    return {kind: items for kind, items in extra.items() if items}


def cmd_status(args: argparse.Namespace) -> int:
    require_root_and_tools()
    name = check_name(args.name)
    spec = registry.load_spec(name)
    found = leftovers.find(name)
    if spec is None:
        report = {"name": name, "up": False, "leftovers": found}
        if args.json:
            print(json.dumps(report, indent=2))
        elif found:
            print(f"lab {name}: not up, but these remain (run `lab down --name {name}`):\n{leftovers.describe(found)}")
        else:
            print(f"lab {name}: not up; leftovers check: nothing remains")
        return 1 if found else 0
    with ThreadPoolExecutor(max_workers=8) as pool:  # one SSH round trip per node, side by side
        nodes = list(pool.map(lambda node: node_status(spec, node), spec.node_names))
    extra = unexpected(spec, found)
    healthy = all(n["state"] in ("running", "degraded") for n in nodes) and not extra
    report = {"name": name, "up": True, "healthy": healthy, "spec": spec.to_json(),
              "management_network": str(spec.management_network), "management_gateway": spec.management_gateway,
              "fabric_network": str(spec.fabric_network),
              "nodes": nodes, "leftovers": extra}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0 if healthy else 1
    print(f"lab {name} (index {spec.index}): {plural(spec.nodes, 'node')}, management {spec.management_network} "
          f"(host {spec.management_gateway}), fabric {spec.fabric_network} MTU {spec.fabric_mtu}, "
          f"inventory {spec.inventory}")
    print(f"  {'node':<7} {'state':<10} {'nspawn':>7} {'pid1':>7}  {'eth0':<18} {'eth1':<18} {'mtu':>5} "
          f"{'eth1':<5} {'mem MiB':>8}")
    for n in nodes:
        eth0, eth1 = n["links"].get("eth0", {}), n["links"].get("eth1", {})
        memory = n["memory"]["anon"] / 2**20 if n["memory"] else 0
        print(f"  {n['node']:<7} {n['state']:<10} {n['nspawn_pid'] or '-':>7} {n['leader_pid'] or '-':>7}  "
              f"{eth0.get('address') or '-':<18} {eth1.get('address') or '-':<18} {eth1.get('mtu') or '-':>5} "
              f"{(eth1.get('state') or '-').lower():<5} {memory:>8.0f}")
    if extra:
        print(f"leftovers check: FAILED, these do not belong to the lab's nodes:\n{leftovers.describe(extra)}")
    else:
        print("leftovers check: nothing stray")
    return 0 if healthy else 1


def cmd_list(args: argparse.Namespace) -> int:
    for record in registry.all_records():
        spec = LabSpec.from_json(record)
        print(f"{spec.name:<9} index {spec.index:<4} {plural(spec.nodes, 'node'):<9} management {spec.management_network}  "
              f"inventory {spec.inventory}")
    return 0


# --------------------------------------------------------------------------- node

def boot_node(spec: LabSpec, record: dict, node: str) -> str:
    rootfs_dir, layer_dir = images(record)
    public_key = machines.ssh_key(spec).with_suffix(".pub").read_text()
    machines.mount_root(spec, node, rootfs_dir, layer_dir)
    machines.provision(spec, node, public_key, default_hardware(spec))
    hardware = machines.read_hardware(spec, node)
    network.ensure_node_links(spec, node_number(node), hardware["fabric_mtu"], hardware["fabric_link"])
    machines.start(spec, node)
    return machines.wait_ready(spec, [node])[node]


def cmd_node(args: argparse.Namespace) -> int:
    require_root_and_tools()
    spec, record = existing_spec(check_name(args.name))
    if args.node not in spec.node_names:
        raise LabError(f"lab {spec.name} has nodes {', '.join(spec.node_names)}; there is no {args.node}")
    started = time.monotonic()
    with lab_lock(spec.name):
        if args.action in ("poweroff", "reboot"):
            machines.stop(spec, args.node)
            print(f"lab {spec.name}: {args.node} powered off ({time.monotonic() - started:.1f}s)")
        if args.action in ("start", "reboot"):
            state = boot_node(spec, record, args.node)
            print(f"lab {spec.name}: {args.node} {state} ({time.monotonic() - started:.1f}s)")
    return 0


# --------------------------------------------------------------------------- hw

def targets(spec: LabSpec, node: str) -> list[str]:
    if node == "all":
        return spec.node_names
    if node not in spec.node_names:
        raise LabError(f"lab {spec.name} has nodes {', '.join(spec.node_names)} (or 'all'); there is no {node}")
    return [node]


def apply_live(spec: LabSpec, node: str, config: dict) -> None:
    """Make the parts of a hardware change that live outside the doubles take effect now."""
    k = node_number(node)
    if spec.netns(node) in network.netns_list():
        network.apply_fabric(spec, k, config["fabric_mtu"], config["fabric_link"])
    if machines.leader_pid(spec, node) is not None:
        machines.in_node(spec, node, ["/usr/local/sbin/vlab-gpu-devices"])


def cmd_hw(args: argparse.Namespace) -> int:
    require_root_and_tools()
    spec, record = existing_spec(check_name(args.name))
    if args.action == "show":
        shown = {node: machines.read_hardware(spec, node) for node in targets(spec, args.node)}
        print(json.dumps(shown if args.node == "all" else shown[args.node], indent=2, sort_keys=True))
        return 0
    with lab_lock(spec.name):
        for node in targets(spec, args.node):
            current = machines.read_hardware(spec, node)
            if args.action == "set" and not args.assignments:
                raise LabError("lab hw set needs at least one key=value")
            try:
                if args.action == "reset":
                    config = dict(default_hardware(spec), gpu_uuid_seed=current["gpu_uuid_seed"])
                else:
                    config = current
                    for assignment in args.assignments:
                        config = labhw.apply_assignment(config, assignment)
                labhw.validate(config, node_fixtures(record))
            except labhw.DoubleError as exc:
                raise LabError(f"lab {spec.name} {node}: {exc}") from exc
            machines.write_hardware(spec, node, config)
            apply_live(spec, node, config)
            changed = {k: v for k, v in config.items() if current.get(k) != v}
            print(f"lab {spec.name} {node}: {json.dumps(changed, sort_keys=True) if changed else 'no change'}")
    return 0


# --------------------------------------------------------------------------- ssh

def cmd_ssh(args: argparse.Namespace) -> int:
    while args.command[:1] == ["--name"] and len(args.command) > 1:  # `lab ssh node1 --name x -- cmd`
        args.name, args.command = args.command[1], args.command[2:]
    spec, _ = existing_spec(check_name(args.name))
    if args.node not in spec.node_names:
        raise LabError(f"lab {spec.name} has nodes {', '.join(spec.node_names)}; there is no {args.node}")
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    argv = machines.ssh_argv(spec, args.node, tty=not command and sys.stdin.isatty())
    os.execvp(argv[0], argv + command)
    return 127


# --------------------------------------------------------------------------- main

def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="lab", description=__doc__,
                                  epilog="Details: docs/lab.md. VLLM_LAB_VERBOSE=1 prints every command run.")
    sub = top.add_subparsers(dest="command_name", required=True)

    def with_name(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--name", default=DEFAULT_NAME, help=f"lab name, 1-8 of [a-z0-9] (default {DEFAULT_NAME})")
        return p

    up = with_name(sub.add_parser("up", help="bring the lab up (idempotent)"))
    up.add_argument("--nodes", type=int, default=None, help=f"number of nodes (default {DEFAULT_NODES})")
    up.add_argument("--inventory", default=None,
                    help="where to write the inventory (default: inventories/lab/ for the default lab, "
                         ".cache/labs/<name>/inventory/ for any other)")
    up.add_argument("--fabric-mtu", type=int, default=DEFAULT_FABRIC_MTU, help="fabric MTU (default 9000)")
    up.set_defaults(func=cmd_up)

    down = with_name(sub.add_parser("down", help="remove everything the lab made, then check nothing remains"))
    down.add_argument("--inventory", default=None, help="inventory to clean when the lab's record is lost")
    down.set_defaults(func=cmd_down)

    status = with_name(sub.add_parser("status", help="nodes, pids, systemd state, addresses, leftovers check"))
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)

    sub.add_parser("list", help="labs on this host").set_defaults(func=cmd_list)

    node = with_name(sub.add_parser("node", help="power a node off, start it, or reboot it (its disk stays)"))
    node.add_argument("node", help="node1, node2, ...")
    node.add_argument("action", choices=("poweroff", "start", "reboot"))
    node.set_defaults(func=cmd_node)

    hw = with_name(sub.add_parser("hw", help="show or change a node's (replayed) hardware, live"))
    hw.add_argument("action", choices=("show", "set", "reset"))
    hw.add_argument("node", help="node1, node2, ... or all")
    hw.add_argument("assignments", nargs="*", metavar="key=value",
                    help=f"keys: {', '.join(labhw.SETTABLE)}, ib_port.<ca>[/<port>]; empty value = default")
    hw.set_defaults(func=cmd_hw)

    ssh = with_name(sub.add_parser("ssh", help="ssh to a node as root: lab ssh node1 -- CMD"))
    ssh.add_argument("node")
    ssh.add_argument("command", nargs=argparse.REMAINDER)
    ssh.set_defaults(func=cmd_ssh)
    return top


def main(argv: list[str] | None = None) -> int:
    top = parser()
    args, extra = top.parse_known_args(argv)
    if extra and args.command_name == "hw" and not any(word.startswith("-") for word in extra):
        args.assignments += extra  # `lab hw set node1 --name x k=v`: argparse leaves k=v over
    elif extra:
        top.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args)
    except (LabError, ValueError) as exc:
        print(f"lab: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("lab: interrupted; run `lab status` and `lab down` to clean up", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `lab status | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0

