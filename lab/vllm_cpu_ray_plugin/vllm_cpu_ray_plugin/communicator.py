"""vLLM's CPU communicator, with its shared-memory path kept to groups whose ranks share one host."""

import socket

import torch
from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator


class CpuRayCommunicator(CpuCommunicator):
    # vLLM's CPU communicator takes its shared-memory all-reduce (/dev/shm) whenever the group's ranks agree
    # on one SHM group name. Ray copies the driver's VLLM_* environment into every worker, so ranks on two
    # nodes agree too, and the second node's join fails ("open shm in SHMManager failed. errno: 2"). Under
    # the mp executor the names differ across nodes and vLLM falls back to torch.distributed (Gloo) by
    # itself; this makes the Ray case do the same.
    def _all_group_ranks_share_shm_group_name(self) -> bool:
        hosts = [""] * self.world_size
        torch.distributed.all_gather_object(hosts, socket.gethostname(), group=self.device_group)
        return len(set(hosts)) == 1 and super()._all_group_ranks_share_shm_group_name()
