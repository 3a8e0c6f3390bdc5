"""Rendering the plan into node files: vLLM's unit and env lines, the firewall's rules."""
