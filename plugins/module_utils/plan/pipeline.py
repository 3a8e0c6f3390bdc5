"""How vLLM splits a model's layers over pipeline stages.

Pure Python, no Ansible import.
"""

from __future__ import annotations


def pp_partition(layers, pp):
    """Layers per pipeline stage, exactly as vLLM's ``get_pp_indices`` splits them.

    The remainder goes to the stages before the last, from the second-to-last
    backwards (the last stage also holds the norm and the LM head).
    """
    partitions = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        partitions[-i] += 1
    return partitions
