"""The model's bytes on the nodes: a manifest per revision, the fan-out plan, the free-space check."""
