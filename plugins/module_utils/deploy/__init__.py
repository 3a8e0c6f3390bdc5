"""Bring-up on the nodes: one read of a node's state, one write of its files, stage stamps."""
