"""What a launch mode is: the one place that knows how vLLM's ranks start across nodes.

A launch mode (``plan['backend']``: ``mp``, ``ray``) answers every question the
other parts would otherwise answer by comparing the backend with a string:

- the planner: which ports it opens, which layouts and devices it accepts, each
  node's role and ``vllm serve`` arguments, what verification must find;
- bring-up: the stage and role it needs before vLLM (Ray: ``ray_cluster``), the
  units each node runs, whether headless workers follow their head;
- verification, the doctor, the checklist and the firewall: where the workers'
  lines are, which units and ports a node must have.

Subclasses override the attributes and methods below; defaults suit a mode with
no cluster of its own. ``launch/__init__.py`` lists the modes. Pure Python, no
Ansible import.
"""

from __future__ import annotations

VLLM_UNIT = "vllm.service"


class LaunchMode:
    #: The plan's ``backend`` value and the inventory's ``vllm_cluster_backend``.
    name = ""
    #: One line for the docs and the CLI's help.
    summary = ""
    #: Port keys the mode opens, in the order duplicates are reported (plan['ports']).
    ports = ("api",)
    #: Default numbers of the mode's own ports (``api`` is common to every mode).
    default_ports: dict = {}
    #: The deploy.yml stage that brings up what the mode needs before vLLM (None: nothing).
    stage = None
    #: The role of that stage (``roles/<name>``).
    stage_role = None
    #: Units of the mode's own cluster, head first (the doctor looks for them on every node).
    cluster_units: tuple = ()
    #: Headless workers restart when their head goes away (vllm_service's vllm-head-watch).
    headless_follow_head = False
    #: vLLM's unit is part of the mode's cluster unit (restarted with it).
    vllm_part_of_cluster_unit = False
    #: Verification reads the workers' placement from the mode's cluster (Ray's state API).
    placement_from_cluster = False
    #: Every worker's log lines are in the journal of the node it runs on (mp); else the head's.
    worker_lines_on_their_node = True
    #: The journal names each worker's process (Worker_TPx_PPy prefixes), per node.
    worker_processes_named = True
    #: What a plan node that runs no ``vllm serve`` runs instead (the plan's table says it).
    without_vllm = "no vllm serve"
    #: vLLM's executor supports async scheduling, on by default on CUDA (one more batch in flight).
    async_scheduling = True
    #: The benchmark's stage name ends with it, so the same layout on two modes makes two stages ("" for mp).
    stage_suffix = ""
    #: Words the benchmark's layout line ends with ("" for mp).
    layout_words = ""

    # ------------------------------------------------------------------ planning

    def refuse_device(self, device, cpu_ray_support=False):
        """A sentence when the mode cannot run on ``device``; None when it can.

        ``cpu_ray_support``: the nodes' runtime gives vLLM's CPU platform a Ray device key (input cpu_ray_support).
        """
        return None

    def refuse_expert_parallel(self, setting):
        """A sentence when the mode cannot plan EP (``setting`` names the pin, e.g. ``ep=8``)."""
        return None

    def refuse_data_parallel(self, setting):
        """A sentence when the mode cannot plan DP replicas for a pin (``setting``: ``dp=2``)."""
        return None

    def refuse_replicas(self, need_text):
        """A sentence when a throughput need that asks for replicas cannot be planned."""
        return None

    @property
    def plans_expert_parallel(self):
        return self.refuse_expert_parallel("ep") is None

    def check_ports(self, opened):
        """A sentence when the opened ports break one of the mode's own rules."""
        return None

    def accepts_multi_node_shape(self, gpus_per_node, local, tp_across):
        """Whether a replica over several nodes with ``local`` ranks per node can be launched."""
        return True

    def runs_vllm(self, node_index):
        """Whether node ``node_index`` of the plan runs ``vllm serve``."""
        return True

    def headless(self, node_index):
        """Whether that node's ``vllm serve`` runs ``--headless`` (no API server)."""
        return False

    def executor_argv(self, nnodes, dp, node_rank, head_address, ports):
        """The ``vllm serve`` arguments that choose the executor and join the nodes."""
        return []

    def node_extras(self, node, head, gpus, ports):
        """Extra keys of a plan node (Ray: ``ray_start_argv``)."""
        return {}

    def vllm_env(self, head, ports):
        """Environment the mode adds to a node that runs ``vllm serve`` (Ray: which cluster to join)."""
        return {}

    def engine_node(self, nodes, leader_node):
        """The node whose journal holds an engine's KV line (its DP leader's, by default)."""
        return leader_node

    def executor(self, device, world, dp_shares_world):
        """vLLM's executor as its log names it."""
        return "mp" if device == "cpu" or world > 1 or dp_shares_world else "uni"

    def ranks_by_node_exact(self, node_count):
        """Whether verify can expect each rank on a given node (not only a count)."""
        return True

    def decision_sentence(self, nnodes, head_address):
        """The plan's sentence about how the nodes are launched."""
        raise NotImplementedError

    def warnings(self):
        """Warnings every plan of this mode carries."""
        return []

    # ------------------------------------------------------------------ what others ask of a plan

    def units_on(self, node_rank, runs_vllm):
        """The systemd units a node of the plan runs (bring-up, the doctor, stage evidence)."""
        units = [VLLM_UNIT] if runs_vllm else []
        return units + self.cluster_units_on(node_rank)

    def cluster_units_on(self, node_rank):
        """The mode's own cluster unit on that node, if any (Ray: ray-head on rank 0, ray-worker elsewhere)."""
        return []

    def readiness_workers(self, plan, node):
        """How many worker rank lines the journal of ``node`` must hold before verify reads it."""
        rows = plan["expect"]["rank_assignments"]
        if self.worker_lines_on_their_node:
            return sum(1 for row in rows if row["node"] == node["host"])
        return len(rows) if node["node_rank"] == 0 else 0

    def facts(self):
        """What the roles ask of the mode, as one JSON-able dict (filter ``launch_mode``)."""
        return {
            "name": self.name,
            "stage": self.stage,
            "stage_role": self.stage_role,
            "cluster_units": list(self.cluster_units),
            "headless_follow_head": self.headless_follow_head,
            "vllm_part_of_cluster_unit": self.vllm_part_of_cluster_unit,
            "placement_from_cluster": self.placement_from_cluster,
            "ports": list(self.ports),
        }
