"""The planner's max_model_len limit is vLLM's own: RoPE scaling applied the way vLLM applies it.

The oracle (tests/runtime/vllm_max_len_oracle.py, run by the runtime venv's Python) reads
each config through transformers and asks vLLM 0.32's ``_get_and_verify_max_len`` whether
it accepts a max_model_len. For every case the planner's limit (``max_model_len_limit``,
plan/rope.py ``rope_scaling``) must be accepted and one token more refused: a
factor applied where vLLM does not apply it (yarn, llama3, Gemma 3) or left out where it
does (linear, dynamic) fails here.
"""

import json
import subprocess
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import model_catalog
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import model_config as mc

pytestmark = pytest.mark.runtime

ORACLE = Path(__file__).with_name("vllm_max_len_oracle.py")
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128, "intermediate_size": 256,
         "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
         "vocab_size": 512, "max_position_embeddings": 4097, "torch_dtype": "bfloat16"}
ROPE = {
    "none": None,
    "linear (legacy type key)": {"type": "linear", "factor": 4.0},
    "linear 2.5 (a fractional limit)": {"rope_type": "linear", "factor": 2.5},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 1024},
}


def configs():
    """label -> (the config the planner reads, the language model's config vLLM checks)."""
    found = {}
    for label, rope in ROPE.items():
        config = dict(LLAMA, **({"rope_scaling": rope} if rope else {}))
        found[label] = (config, config)
    # Gemma 3: linear factor 8 in its config, never applied by vLLM (its length is scaled already).
    gemma = model_catalog.lookup("gemma-3-27b")[2]
    found["gemma-3-27b (linear 8, not applied)"] = (gemma, model_catalog.text_config(gemma))
    return found


def test_the_planner_limit_is_the_longest_max_model_len_vllm_accepts(runtime_python):
    cases, expected = [], []
    for label, (config, text) in configs().items():
        limit = mc.load_model({"name": label, "config": config}, "/m")["max_model_len_limit"]
        cases += [{"config": text, "max_model_len": limit}, {"config": text, "max_model_len": limit + 1}]
        expected += [(label, limit, True), (label, limit + 1, False)]
    result = subprocess.run([str(runtime_python), str(ORACLE)], input=json.dumps(cases), capture_output=True,
                            text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    verdicts = json.loads(result.stdout.splitlines()[-1])
    wrong = [f"{label}: max_model_len {length}: vLLM {'accepts' if got else 'refuses'} it"
             for (label, length, want), got in zip(expected, verdicts, strict=True) if got != want]
    assert not wrong, wrong
