"""Facts: parsers of nvidia-smi, ibstat, /proc/cpuinfo and the runtime venv, and the tools that run them."""
