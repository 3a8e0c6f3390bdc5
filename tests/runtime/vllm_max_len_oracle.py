"""vLLM's own max_model_len check for given model configs: the planner's oracle for RoPE scaling.

Run by the runtime venv's Python (vLLM 0.32 and transformers installed); reads a JSON list
of cases {config, max_model_len} on stdin and writes, per case, whether vLLM accepts that
max_model_len (false: its "User-specified max_model_len ... is greater than the derived
max_model_len" ValueError). The config is read through
transformers' own config class and vLLM's patch_rope_parameters (what vLLM's get_config
does), and checked by vllm/config/model.py ``_get_and_verify_max_len`` with the derived
length taken from max_position_embeddings (the key every planned config has).
"""

import json
import sys
from types import SimpleNamespace

from transformers import AutoConfig
from vllm.config.model import _get_and_verify_max_len
from vllm.transformers_utils.config import patch_rope_parameters


def text_config(raw):
    fields = {key: value for key, value in raw.items() if key != "model_type"}
    config = AutoConfig.for_model(raw["model_type"], **fields).get_text_config()
    patch_rope_parameters(config)
    return config


def accepts(case):
    config = text_config(case["config"])
    arch = SimpleNamespace(derived_max_model_len_and_key=(config.max_position_embeddings, "max_position_embeddings"))
    try:
        _get_and_verify_max_len(config, arch, None, case["max_model_len"], False, None)
    except ValueError as exc:
        if "is greater than the derived max_model_len" not in str(exc):
            raise
        return False
    return True


def main():
    print(json.dumps([accepts(case) for case in json.load(sys.stdin)]))


if __name__ == "__main__":
    main()
