"""The CPU platform with Ray's GPU device key, and a communicator that works across Ray's nodes."""

from vllm.platforms.cpu import CpuPlatform


class CpuRayPlatform(CpuPlatform):
    # "CPU" is no use: Ray rejects it as a custom resource (num_cpus is its own keyword).
    ray_device_key = "GPU"

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return "vllm_cpu_ray_plugin.communicator.CpuRayCommunicator"
