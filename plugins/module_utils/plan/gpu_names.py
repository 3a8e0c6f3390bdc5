"""What a GPU's name says about NVLink, for a node whose GPU facts do not say it.

``NVLINK_BY_NAME`` is the one table: the first rule whose pattern is found in
the nvidia-smi name (upper case) decides. The name tells the form factor: SXM
modules sit on an NVLink (NVSwitch) board, PCIe cards share no NVLink unless
a bridge joins two of them, which only the gathered topology (``nvidia-smi
topo -m``) or a declared ``nvlink`` can tell. ``nvlink_from_name`` reads it;
plan/inputs.py uses it only when the node's ``gpus.nvlink`` is not known.

Pure Python, no Ansible import.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class NameRule:
    pattern: str  # a regular expression searched in the upper-cased nvidia-smi name
    nvlink: bool
    what: str  # shown in the plan: what the name says
    max_gpus: int | None = None  # NVLink bridges join this many cards at most; more GPUs share no NVLink


NVLINK_BY_NAME = (
    # nvidia.com/en-us/data-center/h100 and /a100: "H100 PCIe", "A100 80GB PCIe" (nvidia-smi: "NVIDIA H100 PCIe",
    # "NVIDIA A100-PCIE-40GB") are PCIe cards; an optional NVLink bridge joins two of them.
    NameRule(r"PCIE", False, "a PCIe card"),
    # nvidia.com/en-us/data-center/h100: H100 NVL is a PCIe card sold in pairs joined by NVLink bridges.
    NameRule(r"\bH100 NVL\b", True, "H100 NVL cards are bridged in pairs", max_gpus=2),
    # nvidia.com/en-us/data-center/h200: H200 NVL has a 2- or 4-way NVLink bridge.
    NameRule(r"\bH200 NVL\b", True, "H200 NVL cards are bridged by 2 or 4", max_gpus=4),
    # nvidia.com/en-us/data-center/gb200-nvl72 and /gb300-nvl72: every GPU of the rack on the NVLink Switch.
    NameRule(r"\bGB(200|300)\b", True, "a Grace Blackwell superchip on NVLink Switch"),
    # nvidia.com/en-us/data-center/hgx: HGX B200 and B300, SXM modules on NVLink Switch.
    NameRule(r"\bB(200|300)\b", True, "an HGX Blackwell SXM module"),
    # nvidia.com/en-us/data-center/h100 and /h200: the SXM form factor (HGX boards, NVLink 900 GB/s); nvidia-smi
    # names it without a form factor ("NVIDIA H100 80GB HBM3", "NVIDIA H200"), the PCIe and NVL cards with one.
    NameRule(r"\bH(100|200)\b", True, "an HGX Hopper SXM module"),
    # nvidia.com/en-us/data-center/a100 and /v100: the SXM forms (nvidia-smi: "NVIDIA A100-SXM4-80GB",
    # "Tesla V100-SXM2-32GB") sit on an NVLink board.
    NameRule(r"SXM", True, "an SXM module"),
    # nvidia.com/en-us/data-center/l4, /l40, /l40s: PCIe Gen4 cards without NVLink.
    NameRule(r"\bL(4|40|40S)\b", False, "a PCIe card without NVLink"),
    # nvidia.com/en-us/data-center/products/a10-gpu: a PCIe card without NVLink; A10G is AWS's A10 (g5 instances).
    NameRule(r"\bA10G?\b", False, "a PCIe card without NVLink"),
    # nvidia.com/en-us/data-center/tesla-t4: a PCIe card without NVLink.
    NameRule(r"\bT4\b", False, "a PCIe card without NVLink"),
    # nvidia.com/en-us/design-visualization (RTX 6000 Ada: "NVLink: No"; RTX A6000: a 2-card bridge at most) and
    # GeForce RTX cards: PCIe cards.
    NameRule(r"\bRTX\b", False, "an RTX PCIe card"),
)


def nvlink_from_name(name, gpus):
    """(nvlink, what the name says) for ``gpus`` GPUs called ``name``; (None, None) when no rule knows the name."""
    upper = name.upper()
    for rule in NVLINK_BY_NAME:
        if re.search(rule.pattern, upper):
            if rule.max_gpus is not None and gpus > rule.max_gpus:
                return False, f"{rule.what}, so NVLink does not join all {gpus}"
            return rule.nvlink, rule.what
    return None, None


# Which MXFP4 MoE kernel vLLM 0.32 runs gpt-oss on, by GPU name, and how it pads the expert matrices
# (vllm/model_executor/layers/fused_moe/oracle/mxfp4.py: the gpt-oss backend order, then
# mxfp4_round_up_hidden_size_and_intermediate_size on each rank's expert width). Hopper runs the OAI Triton
# kernels (SM90 to SM12x, but consumer Blackwell orders them after Marlin), which round the width to 64 only;
# Ampere, Ada and consumer Blackwell fall to Marlin, which rounds the width to 128 and the hidden size to 256.
# Other names (B200: FlashInfer's TRT-LLM kernel when FlashInfer is installed, else Triton) are not decided here.
MXFP4_KERNELS = (
    (r"\bH(100|200|20|800)\b|\bGH200\b", ("Triton", 64, 1)),
    (r"\bA(100|10G?|30|40)\b|\bL(4|40|40S)\b|\bT4\b|\bRTX\b", ("Marlin", 128, 256)),
)


def mxfp4_kernel(name):
    """(kernel, width multiple, hidden multiple) vLLM 0.32 uses for MXFP4 experts on ``name``; None if unknown."""
    upper = name.upper()
    for pattern, kernel in MXFP4_KERNELS:
        if re.search(pattern, upper):
            return kernel
    return None
