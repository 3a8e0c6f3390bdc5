"""vLLM platform plugin: the CPU platform with Ray's "GPU" device key.

vLLM's CPU platform has an empty ``ray_device_key``, so its Ray executor refuses
to start ("current platform cpu does not support ray"). This plugin gives the
CPU platform the key GPU platforms use; with Ray nodes started with logical GPUs
(``ray start --num-gpus N``) vLLM's real Ray executor places its workers as Ray
actors, one per logical GPU. It stands in for a GPU platform under Ray, as the
lab's nvidia-smi doubles stand in for GPUs: the executor, placement groups,
workers and collectives (Gloo) are vLLM's and Ray's own.

Ranks on two nodes also need the communicator of ``communicator.py``: vLLM's
CPU one would take its /dev/shm path across Ray's nodes (found on the lab).
"""

PLATFORM = "vllm_cpu_ray_plugin.platform.CpuRayPlatform"


def detect():
    """Entry point of ``vllm.platform_plugins``: the platform's qualified name where vLLM would pick its CPU one."""
    from vllm.platforms import cpu_platform_plugin

    return PLATFORM if cpu_platform_plugin() else None
