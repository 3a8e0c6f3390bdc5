"""The CPU platform with Ray's GPU device key, and nothing else changed."""

from vllm.platforms.cpu import CpuPlatform


class CpuRayPlatform(CpuPlatform):
    # "CPU" is no use: Ray rejects it as a custom resource (num_cpus is its own keyword).
    ray_device_key = "GPU"
