"""The fleet's front door: vllm-router's workers from the plans (workers.py) and its argv (argv.py)."""
