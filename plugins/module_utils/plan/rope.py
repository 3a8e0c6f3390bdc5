"""How far RoPE scaling stretches a model's max_model_len limit, as vLLM computes it.

Pure Python, no Ansible import.
"""

from __future__ import annotations


class RopeScalingError(ValueError):
    """A rope_scaling (or rope_parameters) entry vLLM could not use either."""


# RoPE types whose factor vLLM leaves out of the max_model_len limit: their max_position_embeddings is the scaled
# length already ("su" and "telechat3-yarn" are old names of longrope and yarn).
ROPE_TYPES_ALREADY_SCALED = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling",
                             "telechat3-yarn")


def rope_scaling(text, model_type):
    """(factor, RoPE type) by which vLLM multiplies max_position_embeddings into its max_model_len limit.

    vLLM's rule, vllm/config/model.py ``_get_and_verify_max_len`` (vLLM 0.32): the RoPE parameters
    (config.json's ``rope_scaling``, else ``rope_parameters``, as transformers reads them; one mapping per layer
    type when nested; ``type`` is the old name of ``rope_type``) scale the limit by their ``factor`` unless the
    type is in ROPE_TYPES_ALREADY_SCALED; the last layer type with a factor wins, a null factor counts as 1, and
    Gemma 3 (model type ``gemma3*``) is never scaled (its length is scaled already). (1.0, None): no scaling.
    """
    parameters = text.get("rope_scaling") or text.get("rope_parameters")
    if not isinstance(parameters, dict) or not parameters or "gemma3" in model_type:
        return 1.0, None
    nested = all(isinstance(value, dict) or value is None for value in parameters.values())
    factor, scaled_by = 1.0, None
    for entry in (parameters.values() if nested else [parameters]):
        if not entry:
            continue
        rope_type = entry.get("rope_type", entry.get("type", "default"))
        if rope_type in ROPE_TYPES_ALREADY_SCALED or "factor" not in entry:
            continue
        factor, scaled_by = entry["factor"], rope_type
        if factor is not None and (isinstance(factor, bool) or not isinstance(factor, int | float) or factor <= 0):
            raise RopeScalingError(f"model config field rope_scaling.factor must be a positive number, got {factor!r}")
    return (1.0, None) if factor is None or factor == 1 else (float(factor), scaled_by)
