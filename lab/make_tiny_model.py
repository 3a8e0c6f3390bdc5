#!/usr/bin/env python3
"""Build a tiny Llama, Mixtral, Qwen3-MoE or Gemma-3 model directory offline: config, tokenizer, optional weights.

Runs in the node runtime (.venv-runtime: tokenizers, transformers, torch). The
tokenizer is a byte-level BPE trained here on a fixed corpus, so nothing is
downloaded. Without --weights, serve it with ``--load-format dummy``; with
--weights it writes random bfloat16 safetensors, so real weight loading works.

    .venv-runtime/bin/python lab/make_tiny_model.py llama /tmp/tiny-llama
    .venv-runtime/bin/python lab/make_tiny_model.py mixtral /tmp/tiny-mixtral --weights
    .venv-runtime/bin/python lab/make_tiny_model.py qwen3_moe /tmp/tiny-qwen3-moe
    .venv-runtime/bin/python lab/make_tiny_model.py gemma3 /tmp/tiny-gemma3 --layers 7

The default shape passes vLLM's CPU rules: head_dim 32 (>= 32), hidden and
intermediate sizes divisible by 32 (the CPU MoE kernel), heads and KV heads
that TP=1 and TP=2 divide.

The kinds: ``llama`` (dense, full attention); ``mixtral`` (every layer MoE,
``--experts`` experts, top-2); ``qwen3_moe`` (Qwen3-MoE: ``--experts`` experts
of half the dense width, top-2, layer 0 dense through ``mlp_only_layers``);
``gemma3`` (Gemma-3 text: hybrid attention, ``layer_types`` with every
``--sliding-pattern``-th layer full attention and the others sliding-window of
``--sliding-window`` tokens, 8192 positions so the window is much shorter than
a request; vLLM's hybrid KV cache manager gives the sliding layers their own
groups).
"""

import argparse
import json
import os
import sys

VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]
# A ChatML-like template over the tokenizer's own special tokens: each message is "<s>ROLE\nCONTENT</s>\n".
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<s>' + message['role'] + '\\n' + message['content'] + '</s>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<s>assistant\\n' }}{% endif %}"
)


def make_tokenizer(out):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = [f"the quick brown fox jumps over the lazy dog {i}" for i in range(2000)]
    tokenizer.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(out)
    # The chat template lives in tokenizer_config.json, where instruct models ship it (transformers would write it to
    # chat_template.jinja): vLLM's /v1/chat/completions refuses a model without one.
    config_path = os.path.join(out, "tokenizer_config.json")
    with open(config_path, encoding="utf-8") as handle:
        config = json.load(handle)
    config["chat_template"] = CHAT_TEMPLATE
    with open(config_path, "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=2)
    template_file = os.path.join(out, "chat_template.jinja")
    if os.path.exists(template_file):
        os.remove(template_file)
    return len(fast)


def make_config(kind, layers, heads, kv_heads, head_dim, experts, sliding_window=256, sliding_pattern=3):
    hidden = heads * head_dim
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": 2048,
        "vocab_size": VOCAB_SIZE,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
    }
    if kind == "mixtral":
        config.update(
            {
                "architectures": ["MixtralForCausalLM"],
                "model_type": "mixtral",
                "num_local_experts": experts,
                "num_experts_per_tok": 2,
            }
        )
    elif kind == "qwen3_moe":
        config.update(
            {
                "architectures": ["Qwen3MoeForCausalLM"],
                "model_type": "qwen3_moe",
                "num_experts": experts,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": hidden,
                "decoder_sparse_step": 1,
                "mlp_only_layers": [0],
                "norm_topk_prob": True,
                "attention_bias": False,
                "use_sliding_window": False,
                "sliding_window": None,
            }
        )
    elif kind == "gemma3":
        config.update(
            {
                "architectures": ["Gemma3ForCausalLM"],
                "model_type": "gemma3_text",
                "max_position_embeddings": 8192,
                "hidden_activation": "gelu_pytorch_tanh",
                "query_pre_attn_scalar": head_dim,
                "rms_norm_eps": 1e-6,
                "rope_local_base_freq": 10000.0,
                "sliding_window": sliding_window,
                "layer_types": [
                    "full_attention" if (i + 1) % sliding_pattern == 0 else "sliding_attention"
                    for i in range(layers)
                ],
                "tie_word_embeddings": True,
                "attn_logit_softcapping": None,
                "final_logit_softcapping": None,
                "pad_token_id": 0,
            }
        )
        del config["hidden_act"]
    return config


def write_weights(out):
    """Random bfloat16 weights from the config, through transformers, as model.safetensors."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(out)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["llama", "mixtral", "qwen3_moe", "gemma3"])
    parser.add_argument("out", help="directory to create (or fill)")
    parser.add_argument("--weights", action="store_true", help="also write random bfloat16 safetensors")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--experts", type=int, default=4)
    parser.add_argument("--sliding-window", type=int, default=256, help="gemma3: the sliding layers' window")
    parser.add_argument("--sliding-pattern", type=int, default=3, help="gemma3: every Nth layer is full attention")
    args = parser.parse_args(argv)

    os.makedirs(args.out, exist_ok=True)
    vocab = make_tokenizer(args.out)
    config = make_config(args.kind, args.layers, args.heads, args.kv_heads, args.head_dim, args.experts,
                         args.sliding_window, args.sliding_pattern)
    with open(os.path.join(args.out, "config.json"), "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=1)
    summary = {"out": args.out, "kind": args.kind, "vocab": vocab}
    if args.weights:
        summary["params"] = write_weights(args.out)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
