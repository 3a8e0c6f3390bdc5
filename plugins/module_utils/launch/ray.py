"""Launch mode ``ray``: the seed's path, a Ray cluster and one ``vllm serve`` on its head.

``ray-head``/``ray-worker`` units (role ``ray_cluster``, deploy.yml's ``ray``
stage) join every node of the replica with the plan's GPU counts; the head runs
``vllm serve ... --distributed-executor-backend ray`` and vLLM places its
workers as Ray actors. Their log lines are in the head's journal; their nodes
come from Ray's state API. Ray plans cover TP and PP (one replica). vLLM's CPU
platform has no Ray device key: on CPU only where the inventory says the runtime
gives it one (cpu_ray_support; the lab's platform plugin, docs/lab.md).
"""

from __future__ import annotations

from ansible_collections.vllm_ops.cluster.plugins.module_utils.launch.base import LaunchMode

WORKER_PORT_RANGE = ("ray_min_worker", "ray_max_worker")


class RayMode(LaunchMode):
    name = "ray"
    summary = "a Ray cluster (ray-head, ray-worker units) and one vllm serve on its head"
    default_ports = {
        "ray_gcs": 6379,
        "ray_dashboard": 8265,
        "ray_client": 10001,
        "ray_node_manager": 6380,
        "ray_object_manager": 6381,
        "ray_runtime_env_agent": 6382,
        "ray_dashboard_agent_grpc": 6383,
        "ray_dashboard_agent_listen": 52365,
        "ray_metrics_export": 6384,
        "ray_min_worker": 10002,
        "ray_max_worker": 10999,
    }
    ports = (*default_ports, "api")
    stage = "ray"
    stage_role = "ray_cluster"
    cluster_units = ("ray-head.service", "ray-worker.service")
    vllm_part_of_cluster_unit = True
    placement_from_cluster = True
    worker_lines_on_their_node = False
    worker_processes_named = False
    without_vllm = "ray start only"
    async_scheduling = False  # vLLM 0.32's Ray executor does not support it
    stage_suffix = "-ray"  # the seed's Ray path is a benchmark stage beside the same layout on mp: tp2-2nodes-ray
    layout_words = " over Ray"

    def refuse_device(self, device, cpu_ray_support=False):
        if device == "cpu" and not cpu_ray_support:
            return ("vLLM's CPU platform has no Ray device key (vLLM: current platform cpu does not support ray) "
                    "and the runtime is not said to give it one")
        return None

    def refuse_expert_parallel(self, setting):
        return f"{setting}: EP+DP is planned with backend mp only (the seed runs it as one mp launch)"

    def refuse_data_parallel(self, setting):
        return f"{setting} with backend ray: Ray plans cover TP/PP (the seed's Ray path); use backend mp for DP"

    def refuse_replicas(self, need_text):
        return f"{need_text}; backend ray plans one replica: use backend mp for DP replicas"

    def check_ports(self, opened):
        low, high = (opened[key] for key in WORKER_PORT_RANGE)
        if low > high:
            return f"ports.ray_min_worker ({low}) must not exceed ports.ray_max_worker ({high})"
        inside = sorted(key for key, value in opened.items() if key not in WORKER_PORT_RANGE and low <= value <= high)
        if inside:
            return f"ports {inside} fall inside the Ray worker port range {low}-{high}"
        return None

    def accepts_multi_node_shape(self, gpus_per_node, local, tp_across):
        # The Ray executor places whole nodes: every node of the replica gives all its GPUs.
        return local == gpus_per_node or tp_across

    def runs_vllm(self, node_index):
        return node_index == 0

    def executor_argv(self, nnodes, dp, node_rank, head_address, ports):
        return ["--distributed-executor-backend", "ray"]

    def node_extras(self, node, head, gpus, ports):
        argv = ["ray", "start", "--block", "--node-ip-address", node["address"], "--num-gpus", str(gpus)]
        if node["name"] == head["name"]:
            argv += [
                "--head",
                "--port",
                str(ports["ray_gcs"]),
                "--dashboard-host",
                node["address"],
                "--dashboard-port",
                str(ports["ray_dashboard"]),
                "--ray-client-server-port",
                str(ports["ray_client"]),
            ]
        else:
            argv += ["--address", f"{head['address']}:{ports['ray_gcs']}"]
        for flag, key in (
            ("--node-manager-port", "ray_node_manager"),
            ("--object-manager-port", "ray_object_manager"),
            ("--runtime-env-agent-port", "ray_runtime_env_agent"),
            ("--dashboard-agent-grpc-port", "ray_dashboard_agent_grpc"),
            ("--dashboard-agent-listen-port", "ray_dashboard_agent_listen"),
            ("--metrics-export-port", "ray_metrics_export"),
            ("--min-worker-port", "ray_min_worker"),
            ("--max-worker-port", "ray_max_worker"),
        ):
            argv += [flag, str(ports[key])]
        return {"ray_start_argv": argv}

    def vllm_env(self, head, ports):
        # vLLM's ray.init() finds a running cluster only through RAY_ADDRESS or the address file of Ray's
        # default temp directory; the units' --temp-dir and private /tmp hide that file, so without this vLLM
        # starts a Ray instance of its own (no GPUs, no other node) and its placement group never fits.
        # RAY_DEDUP_LOGS=0: Ray's driver folds log lines that differ only in numbers ("world_size=2 rank=0"
        # and "... rank=1", "[repeated 2x across cluster]"), so verify would miss every rank line but one.
        return {"RAY_ADDRESS": f"{head['address']}:{ports['ray_gcs']}", "RAY_DEDUP_LOGS": "0"}

    def engine_node(self, nodes, leader_node):
        return nodes[0]["host"]

    def executor(self, device, world, dp_shares_world):
        return "ray"

    def ranks_by_node_exact(self, node_count):
        # Ray places actors itself: with three or more nodes only the count per node is known.
        return node_count <= 2

    def decision_sentence(self, nnodes, head_address):
        sentence = (
            "Backend ray (the seed's path): a Ray cluster spans the nodes and one vllm serve on the head runs "
            "--distributed-executor-backend ray; the other nodes run only ray start."
        )
        if nnodes > 1:
            sentence += " The seed's --nnodes is not passed: vLLM rejects --nnodes > 1 unless the executor is mp."
        return sentence

    def warnings(self):
        return ["Ray needs the same Ray and Python versions on every node (Ray checks both at join)."]

    def cluster_units_on(self, node_rank):
        return [self.cluster_units[0] if node_rank == 0 else self.cluster_units[1]]


MODE = RayMode()
