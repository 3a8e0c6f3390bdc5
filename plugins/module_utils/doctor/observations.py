"""The observations a signature's rules may name: ``OBSERVATIONS``, name -> function.

An observation is a generic, reusable check of the evidence, such as "a plan
port is held by a process outside the deployment's units". Each takes the
``evidence.Cluster`` and the rule's ``params`` and returns hits, made with
``evidence.make_hit``: {"node": name or None, "source": where the line comes
from, "line": the evidence quoted, "values": {placeholder: value}}.
Observations check; the catalog decides what a hit means.

To add one, write it in ``observations_node.py`` (what a node shows on its
own), ``observations_network.py`` (what lies between nodes) or
``observations_config.py`` (a gathered fact compared with the plan or the
other nodes: drop-ins, limits, process states, access, disk, the API key),
``observations_metrics.py`` (what Prometheus knows: trends, alerts),
``observations_router.py`` (the router's view of its workers), ``observations_ray.py``
(Ray's own start-up failures in its logs) and name it here.

Pure Python 3.11, no Ansible import.
"""

from __future__ import annotations

from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.observations_config import (
    obs_api_key_differs,
    obs_disk_low,
    obs_process_state,
    obs_service_user_access,
    obs_unit_limits_differ,
    obs_unit_overridden,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.observations_metrics import (
    obs_alert_firing,
    obs_kv_saturated,
    obs_metrics_unreadable,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.observations_network import (
    obs_address_missing,
    obs_api_unanswered_from_client,
    obs_chat_template_missing,
    obs_fabric_link_down,
    obs_fabric_mtu_differs,
    obs_firewall_drops_port,
    obs_host_ip_mismatch,
    obs_ib_declared,
    obs_ib_port_down,
    obs_memlock_limited,
    obs_ray_gpus_below_plan,
    obs_ray_node_not_alive,
    obs_rendezvous_probe,
    obs_route_to_peer_wrong,
    obs_socket_ifname_mismatch,
    obs_tp_across_nodes,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.observations_node import (
    obs_driver_mismatch,
    obs_env_differs,
    obs_env_flag,
    obs_fabric_manager_not_ready,
    obs_gpu_count_below_plan,
    obs_gpu_facts_failed,
    obs_gpu_held_by_foreign_process,
    obs_model_missing,
    obs_node_unreachable,
    obs_port_held_by_foreign_process,
    obs_shm_small,
    obs_unit_argv_differs,
    obs_unit_failed,
    obs_unit_missing,
    obs_unit_stopped,
    obs_version_mismatch,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.observations_ray import (
    obs_ray_gcs_unreachable,
    obs_ray_log_version_mismatch,
    obs_ray_node_ip_wrong,
    obs_ray_port_in_use,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.observations_router import (
    obs_router_unreachable,
    obs_router_worker_missing,
    obs_router_worker_unhealthy,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.startup import obs_startup_stalled

OBSERVATIONS = {
    "node_unreachable": obs_node_unreachable,
    "port_held_by_foreign_process": obs_port_held_by_foreign_process,
    "gpu_held_by_foreign_process": obs_gpu_held_by_foreign_process,
    "unit_failed": obs_unit_failed,
    "unit_stopped": obs_unit_stopped,
    "unit_missing": obs_unit_missing,
    "ray_node_not_alive": obs_ray_node_not_alive,
    "ray_gpus_below_plan": obs_ray_gpus_below_plan,
    "version_mismatch": obs_version_mismatch,
    "socket_ifname_mismatch": obs_socket_ifname_mismatch,
    "host_ip_mismatch": obs_host_ip_mismatch,
    "address_missing": obs_address_missing,
    "model_missing": obs_model_missing,
    "rendezvous_probe": obs_rendezvous_probe,
    "firewall_drops_port": obs_firewall_drops_port,
    "shm_small": obs_shm_small,
    "ib_declared": obs_ib_declared,
    "ib_port_down": obs_ib_port_down,
    "memlock_limited": obs_memlock_limited,
    "driver_mismatch": obs_driver_mismatch,
    "fabric_manager_not_ready": obs_fabric_manager_not_ready,
    "unit_argv_differs": obs_unit_argv_differs,
    "env_differs": obs_env_differs,
    "tp_across_nodes": obs_tp_across_nodes,
    "env_flag": obs_env_flag,
    "gpu_count_below_plan": obs_gpu_count_below_plan,
    "gpu_facts_failed": obs_gpu_facts_failed,
    "api_unanswered_from_client": obs_api_unanswered_from_client,
    "chat_template_missing": obs_chat_template_missing,
    # Compared facts
    "fabric_mtu_differs": obs_fabric_mtu_differs,
    "fabric_link_down": obs_fabric_link_down,
    "route_to_peer_wrong": obs_route_to_peer_wrong,
    "unit_overridden": obs_unit_overridden,
    "unit_limits_differ": obs_unit_limits_differ,
    "process_state": obs_process_state,
    "service_user_access": obs_service_user_access,
    "disk_low": obs_disk_low,
    "api_key_differs": obs_api_key_differs,
    # What Prometheus knows
    "kv_saturated": obs_kv_saturated,
    "alert_firing": obs_alert_firing,
    "metrics_unreadable": obs_metrics_unreadable,
    # Ray's own start-up failures, from its session logs and the Ray units' journals
    "ray_port_in_use": obs_ray_port_in_use,
    "ray_gcs_unreachable": obs_ray_gcs_unreachable,
    "ray_log_version_mismatch": obs_ray_log_version_mismatch,
    "ray_node_ip_wrong": obs_ray_node_ip_wrong,
    # The router's view of each worker
    "router_unreachable": obs_router_unreachable,
    "router_worker_missing": obs_router_worker_missing,
    "router_worker_unhealthy": obs_router_worker_unhealthy,
    # The start-up phase each rank reached (startup.py)
    "startup_stalled": obs_startup_stalled,
}
