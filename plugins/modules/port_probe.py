#!/usr/bin/python
"""Ansible module port_probe: bounded TCP/UDP listeners and all-pairs connection probes."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: port_probe
short_description: Prove TCP reachability and the path MTU between nodes with short-lived listeners
version_added: 0.1.0
description:
  - V(listen) starts one detached listener process on the node that binds every
    port of O(ports) on O(address) (TCP, answering each connection with a
    one-line banner that names O(identity)) and, with O(udp_port), a UDP echo
    socket for path-MTU probes. It returns once every socket is bound. The
    listener stops by itself after O(lifetime) seconds, so a crashed play
    leaves nothing behind for long; V(stop) ends it at once.
  - A port that something else already listens on is reported in C(in_use)
    and not bound; a probe then reaches that service instead, which still
    proves the path.
  - V(connect) opens a TCP connection to every port of O(ports) on every peer
    of O(peers) from O(address) (so the probe leaves through the fabric
    interface), in parallel, each bounded by O(timeout); with O(mtu), it also
    sends two datagrams with Don't Fragment set to each peer's O(udp_port) (64
    bytes, then C(mtu - 28) bytes) and waits for their echoes.
  - V(stop) ends every listener this module started on the node (found by
    their command line), waits until they are gone, and reports their pids.
  - Nothing persists; the module reports C(changed=false) and runs the same in check mode.
options:
  action:
    description: What to do.
    type: str
    choices: [listen, connect, stop]
    required: true
  address:
    description:
      - V(listen) the address to bind (the node's fabric address); V(connect)
        the source address of the probes (optional).
    type: str
  identity:
    description: Name the V(listen) banner carries, normally the inventory hostname.
    type: str
  ports:
    description:
      - "TCP ports, as a list of numbers or as the plan's C(ports) dict (C({api: 8000, master: 29501, ...}));
        the names appear in the results. V(listen) binds them; V(connect) probes them on every peer."
    type: raw
    default: []
  udp_port:
    description:
      - UDP port of the echo socket for path-MTU probes; V(listen) binds it, V(connect) sends to it when
        O(mtu) is set.
    type: int
  lifetime:
    description: Seconds after which the listener exits by itself (V(listen)).
    type: int
    default: 300
  peers:
    description:
      - "Nodes to probe (V(connect)), C({inventory name: fabric address}); the node's own O(identity) is
        left out. A listener's banner must name the peer that was meant."
    type: dict
    default: {}
  mtu:
    description:
      - Path MTU to prove to every peer (V(connect), needs O(udp_port)) - a datagram of C(mtu - 28) bytes
        with Don't Fragment must come back.
    type: int
  timeout:
    description: Seconds each connection or echo may take.
    type: float
    default: 3.0
  run_id:
    description:
      - Name of the listener set, so that V(stop) (and the clean-up of a stale set at V(listen))
        ends only the listeners started with the same name, in the node's own PID namespace.
    type: str
    default: default
notes:
  - Needs only the Python standard library on the node.
  - The listener's command line is C(python3 -c ... vllm-cluster-port-probe RUN_ID CONFIG), which is how
    V(stop) finds it (C(pgrep -f vllm-cluster-port-probe) shows it too).
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
author:
  - vllm-cluster developers (@vllm-ops)
"""

EXAMPLES = r"""
- name: Listen on the deployment's ports on the fabric address, for at most 2 minutes
  vllm_ops.cluster.port_probe:
    action: listen
    address: 10.232.0.11
    identity: "{{ inventory_hostname }}"
    ports: {ray_gcs: 6379, api: 8000, master: 29501}
    udp_port: 29597
    lifetime: 120

- name: Connect to the other nodes on the same ports, and prove a 9000-byte path MTU
  vllm_ops.cluster.port_probe:
    action: connect
    identity: node1
    address: 10.232.0.11
    peers: {node2: 10.232.0.12, node3: 10.232.0.13}
    ports: {ray_gcs: 6379, api: 8000, master: 29501}
    udp_port: 29597
    mtu: 9000
  register: probe

- name: Stop the listeners
  vllm_ops.cluster.port_probe:
    action: stop
"""

RETURN = r"""
pid:
  description: Process id of the listener (V(listen)).
  returned: action is listen
  type: int
bound:
  description: TCP ports the listener bound (V(listen)).
  returned: action is listen
  type: list
  elements: int
in_use:
  description: TCP ports another process already listens on (V(listen)); not bound.
  returned: action is listen
  type: list
  elements: int
results:
  description:
    - One entry per target (V(connect)) - C(kind) (tcp or mtu), C(host), C(address), C(port),
      C(name), C(ok), C(error), C(seconds), and for tcp C(reached) (the banner's identity, or
      V(existing service) when the port was in use).
  returned: action is connect
  type: list
  elements: dict
stopped:
  description: Pids of the listeners that were ended (V(stop), and stale ones at V(listen)).
  returned: always
  type: list
  elements: int
"""

import errno  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import select  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify.reachability import (  # noqa: E402
    FabricError,
    probe_ports,
    tcp_targets,
)

MARKER = "vllm-cluster-port-probe"
BANNER_PREFIX = MARKER + " "
# Linux values; Python's socket module does not export them.
IP_MTU_DISCOVER = getattr(socket, "IP_MTU_DISCOVER", 10)
IP_PMTUDISC_DO = getattr(socket, "IP_PMTUDISC_DO", 2)

# The listener: runs detached as `python3 -c LISTENER MARKER CONFIG_JSON`.
LISTENER = r"""
import json, os, selectors, signal, socket, sys, time
config = json.loads(sys.argv[3])
deadline = time.monotonic() + config["lifetime"]
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
sel = selectors.DefaultSelector()
bound, in_use, errors = [], [], {}
for port in config["ports"]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config["address"], port))
        sock.listen(64)
    except OSError as exc:
        sock.close()
        (in_use.append(port) if exc.errno == 98 else errors.__setitem__(str(port), str(exc)))
        continue
    sock.setblocking(False)
    sel.register(sock, selectors.EVENT_READ, "tcp")
    bound.append(port)
udp_bound = None
if config.get("udp_port"):
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        udp.setsockopt(socket.IPPROTO_IP, config["mtu_discover"], config["pmtudisc_do"])
        udp.bind((config["address"], config["udp_port"]))
        udp.setblocking(False)
        sel.register(udp, selectors.EVENT_READ, "udp")
        udp_bound = config["udp_port"]
    except OSError as exc:
        errors["udp/" + str(config["udp_port"])] = str(exc)
report = json.dumps({"pid": os.getpid(), "bound": bound, "in_use": in_use, "udp_bound": udp_bound, "errors": errors})
os.write(config["ready_fd"], report.encode() + b"\n")
os.close(config["ready_fd"])
banner = (config["banner"] + "\n").encode()
while True:
    left = deadline - time.monotonic()
    if left <= 0:
        break
    for key, _ in sel.select(timeout=min(left, 1.0)):
        try:
            if key.data == "tcp":
                conn, _ = key.fileobj.accept()
                conn.settimeout(1.0)
                try:
                    conn.sendall(banner)
                finally:
                    conn.close()
            else:
                data, peer = key.fileobj.recvfrom(65535)
                key.fileobj.sendto(data, peer)
        except OSError:
            pass
"""


def _same_pid_namespace(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid") == os.readlink("/proc/self/ns/pid")
    except OSError:
        return False


def listener_pids(run_id: str) -> list[int]:
    """Pids of this module's listeners for run_id, in this PID namespace (a container host sees its guests')."""
    wanted = [MARKER.encode(), run_id.encode()]
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
        except OSError:
            continue
        if argv[3:5] == wanted and _same_pid_namespace(int(entry)):
            pids.append(int(entry))
    return sorted(pids)


def stop_listeners(run_id: str, wait_s: float = 5.0) -> list[int]:
    pids = listener_pids(run_id)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{pid}") for pid in pids):
        time.sleep(0.05)
    for pid in pids:
        if os.path.exists(f"/proc/{pid}"):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return pids


def start_listener(module, params, ports):
    read_fd, write_fd = os.pipe()
    config = {
        "address": params["address"],
        "ports": sorted(set(ports)),
        "udp_port": params["udp_port"],
        "lifetime": params["lifetime"],
        "banner": BANNER_PREFIX + (params["identity"] or socket.gethostname()),
        "ready_fd": write_fd,
        "mtu_discover": IP_MTU_DISCOVER,
        "pmtudisc_do": IP_PMTUDISC_DO,
    }
    with open(os.devnull, "r+b") as devnull:
        # Own session, no inherited stdio: the listener outlives this module and the SSH session.
        proc = subprocess.Popen([sys.executable, "-c", LISTENER, MARKER, params["run_id"], json.dumps(config)],
                                stdin=devnull, stdout=devnull, stderr=devnull, pass_fds=(write_fd,),
                                start_new_session=True, close_fds=True, cwd="/")
    os.close(write_fd)
    line = b""
    deadline = time.monotonic() + 15
    while not line.endswith(b"\n") and time.monotonic() < deadline:
        ready, _, _ = select.select([read_fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        line += chunk
    os.close(read_fd)
    if not line.endswith(b"\n"):
        stop_listeners(params["run_id"])
        module.fail_json(msg=f"{params['identity'] or socket.gethostname()}: the port listener on {params['address']} "
                             f"did not report ready within 15 s (exit code {proc.poll()})")
    return json.loads(line)


def probe_tcp(target, source, timeout):
    started = time.monotonic()
    result = {"kind": "tcp", "host": target["host"], "address": target["address"], "port": int(target["port"]),
              "name": target.get("name") or "", "ok": False, "error": None, "reached": None}
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        if source:
            sock.bind((source, 0))
        sock.connect((target["address"], int(target["port"])))
        banner = b""
        try:
            sock.settimeout(min(timeout, 1.0))
            while not banner.endswith(b"\n") and len(banner) < 512:
                chunk = sock.recv(512)
                if not chunk:
                    break
                banner += chunk
        except OSError:
            pass
        text = banner.decode("utf-8", "replace").strip()
        if text.startswith(BANNER_PREFIX):
            result["reached"] = text[len(BANNER_PREFIX):]
            if target.get("host") and result["reached"] != target["host"]:
                result["error"] = (f"reached the listener of {result['reached']} instead of {target['host']}: "
                                   f"is {target['address']} assigned to two nodes?")
            else:
                result["ok"] = True
        else:
            result["reached"] = "existing service"
            result["ok"] = True
    except TimeoutError:
        result["error"] = f"timed out after {timeout:g} s (packets dropped: firewall or no path)"
    except ConnectionRefusedError:
        result["error"] = "connection refused (nothing listens there, or a REJECT rule)"
    except OSError as exc:
        reason = {errno.EHOSTUNREACH: "no route to host", errno.ENETUNREACH: "network unreachable",
                  errno.EADDRNOTAVAIL: f"source address {source} is not on this node"}.get(exc.errno, str(exc))
        result["error"] = reason
    finally:
        sock.close()
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


def _echo(sock, address, port, payload, timeout, attempts=3):
    """Send payload and wait for the same bytes back; a few attempts, since UDP may drop one."""
    for _ in range(attempts):
        sock.sendto(payload, (address, port))
        deadline = time.monotonic() + timeout / attempts
        while time.monotonic() < deadline:
            ready, _, _ = select.select([sock], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            data, _ = sock.recvfrom(65535)
            if data == payload:
                return True
    return False


def probe_mtu(target, source, timeout):
    started = time.monotonic()
    size = int(target["size"])
    result = {"kind": "mtu", "host": target["host"], "address": target["address"], "port": int(target["port"]),
              "name": f"path MTU {size + 28}", "ok": False, "error": None, "size": size}
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
        if source:
            sock.bind((source, 0))
        nonce = os.urandom(8)
        small = _echo(sock, target["address"], int(target["port"]), nonce + b"s" * 56, timeout)
        try:
            large = _echo(sock, target["address"], int(target["port"]), nonce + b"L" * (size - 8), timeout)
        except OSError as exc:
            if exc.errno != errno.EMSGSIZE:
                raise
            large = False
            result["error"] = f"this node cannot send {size + 28}-byte packets: its own interface MTU is smaller"
        if small and large:
            result["ok"] = True
        elif result["error"]:
            pass
        elif small:
            result["error"] = (f"{size + 28}-byte packets with Don't Fragment get no echo while 64-byte ones do: "
                               "the path MTU is smaller (a switch port or the peer's interface)")
        else:
            result["error"] = (f"no echo even for 64-byte datagrams: UDP port {target['port']} is blocked, "
                               "so the path MTU was not verified")
    except OSError as exc:
        result["error"] = str(exc)
    finally:
        sock.close()
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


def main():
    module = AnsibleModule(
        argument_spec={
            "action": {"type": "str", "choices": ["listen", "connect", "stop"], "required": True},
            "address": {"type": "str"},
            "identity": {"type": "str"},
            "ports": {"type": "raw", "default": []},
            "udp_port": {"type": "int"},
            "lifetime": {"type": "int", "default": 300},
            "peers": {"type": "dict", "default": {}},
            "mtu": {"type": "int"},
            "timeout": {"type": "float", "default": 3.0},
            "run_id": {"type": "str", "default": "default"},
        },
        required_if=[("action", "listen", ("address",)), ("action", "connect", ("identity",))],
        supports_check_mode=True,
    )
    params = module.params
    host = params["identity"] or socket.gethostname()

    if params["action"] == "stop":
        stopped = stop_listeners(params["run_id"])
        left = listener_pids(params["run_id"])
        if left:
            module.fail_json(msg=f"{host}: port listeners {left} survived SIGKILL; expected none left", stopped=stopped)
        module.exit_json(changed=False, stopped=stopped)

    try:
        ports = probe_ports(params["ports"] if isinstance(params["ports"], dict) else
                            [int(p) for p in params["ports"]])
    except (FabricError, TypeError, ValueError) as error:
        module.fail_json(msg=f"{host}: ports {params['ports']!r}: {error}")
    if params["udp_port"] is not None and not 1 <= params["udp_port"] <= 65535:
        module.fail_json(msg=f"{host}: udp_port={params['udp_port']} is not a port number (1-65535)")

    if params["action"] == "listen":
        if not 1 <= params["lifetime"] <= 3600:
            module.fail_json(msg=f"{host}: lifetime={params['lifetime']} s; expected 1 to 3600")
        stale = stop_listeners(params["run_id"])  # a crashed earlier run may still hold the ports
        report = start_listener(module, params, [p["port"] for p in ports])
        if report["errors"]:
            stop_listeners(params["run_id"])
            module.fail_json(msg=f"{host}: the port listener could not bind on {params['address']}: "
                                 + "; ".join(f"port {p}: {e}" for p, e in report["errors"].items()),
                             **report)
        module.exit_json(changed=False, stopped=stale, **report)

    if params["mtu"] is not None and (params["udp_port"] is None or not 68 <= params["mtu"] <= 65535):
        module.fail_json(msg=f"{host}: mtu={params['mtu']} needs udp_port and a value of 68 to 65535")
    nodes = [{"host": str(name), "address": str(address)} for name, address in params["peers"].items()]
    if host not in params["peers"]:
        nodes.append({"host": host, "address": params["address"] or ""})
    targets = tcp_targets(nodes, host, ports)
    jobs = [(probe_tcp, target) for target in targets]
    if params["mtu"] is not None:
        jobs += [(probe_mtu, {"host": node["host"], "address": node["address"], "port": params["udp_port"],
                              "size": params["mtu"] - 28})
                 for node in nodes if node["host"] != host]
    results = []
    if jobs:
        with ThreadPoolExecutor(max_workers=min(64, len(jobs))) as pool:
            futures = [pool.submit(function, target, params["address"], params["timeout"])
                       for function, target in jobs]
            results = [future.result() for future in futures]
    module.exit_json(changed=False, results=results, stopped=[])


if __name__ == "__main__":
    main()
