#!/usr/bin/env python3
"""Does the plan fit the real GPUs? Plan on live facts, then hold the plan's bytes on every GPU.

    python3 bench/gpu/plan_fit.py --out OUT_DIR [--model llama-3.1-70b] [--max-model-len 32768] [--gpus N]
        [--activation-tokens 2048,8192,16384] [--activation-layers N] [--activation-tp N] [--sampled-positions N]

On a host with NVIDIA GPUs and PyTorch (no vLLM needed):
1. the live facts: `nvidia-smi -q -x`, `topo -m`, `nvlink -s`, parsed by
   plugins/module_utils/facts/nvidia_smi_query.py and nvidia_smi_topo.py and
   summarised by nvidia_smi.py exactly as the gpu_facts module does;
2. the plan: plugins/module_utils/plan/ (build_plan) on those facts (one node), for a
   model that does not fit one GPU;
3. the proof: on each GPU of the plan, the free memory before (cudaMemGetInfo),
   then the plan's per-GPU budget (weights + KV cache, plus the planner's reserve
   estimate) allocated for real with torch.empty, then released. The budget must
   fit the free memory and must stay within gpu_memory_utilization x total, as
   vLLM enforces at start-up. Skipped (and said so) when the plan needs more GPUs
   than the host has;
4. the part that can fail: the activation peak of vLLM's profiling forward pass,
   measured on GPU 0 for the plan's architecture as one TP rank holds it
   (activation_peak.py), against the planner's estimate (memory.inputs.profile_batch
   .forward_gib). The exit status is 1 when the estimate is more than 1% below the peak.
It changes no GPU setting. Writes OUT_DIR/plan_fit.json and the captures.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "collections"))

from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.nvidia_smi import summarize_gpus  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.nvidia_smi_query import parse_query_xml  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.facts.nvidia_smi_topo import (  # noqa: E402
    parse_nvlink_status,
    parse_topo_matrix,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import build_plan  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.memory import forward_activation_bytes  # noqa: E402
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.model_config import load_model  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import activation_peak  # noqa: E402

GIB = 1024**3
MIB = 1024**2
ROUNDING_MIB = 11


def capture(argv: list[str], out: Path) -> str:
    text = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True).stdout
    out.write_text(text)
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--model", default="llama-3.1-70b")
    parser.add_argument("--max-model-len", type=int, default=32768)
    parser.add_argument("--gpus", type=int, default=0, help="GPUs of the node to plan on (default: all)")
    parser.add_argument("--activation-tokens", default="",
                        help="token counts of the profiling pass, comma-separated (default: the plan's profile "
                             "batch); 'none' skips the measurement")
    parser.add_argument("--activation-layers", type=int, default=0,
                        help="decoder layers to build (default: all when the weights fit, else a few)")
    parser.add_argument("--activation-tp", type=int, default=0, help="measure one rank of this TP (default: the plan's)")
    parser.add_argument("--sampled-positions", type=int, default=1,
                        help="positions the LM head runs on (vLLM: one per sequence of the batch)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    xml = capture(["nvidia-smi", "-q", "-x"], args.out / "nvidia-smi-q-x.xml")
    topo = capture(["nvidia-smi", "topo", "-m"], args.out / "nvidia-smi-topo-m.txt")
    nvlink = capture(["nvidia-smi", "nvlink", "-s"], args.out / "nvidia-smi-nvlink-s.txt")
    facts = summarize_gpus(parse_query_xml(xml), parse_topo_matrix(topo), parse_nvlink_status(nvlink))
    count = args.gpus or facts["count"]
    gpus = {"count": count, "name": facts["name"], "memory_total_mib": facts["memory_total_mib"],
            "memory_cuda_total_mib": facts["memory_cuda_total_mib"], "nvlink": facts["nvlink"]}
    plan = build_plan(args.model, [{"name": "gpu-host", "address": "127.0.0.1", "gpus": gpus}],
                      {"max_model_len": args.max_model_len}, deployment="plan-fit")
    memory = plan["memory"]
    reserve_gib = memory["inputs"]["reserve_gib"]["total_gib"]
    budget_gib = memory["weights_gib_per_gpu"] + memory["kv_cache_gib_per_gpu"] + reserve_gib
    utilization = plan["targets"]["gpu_memory_utilization"]

    import torch  # the device machine's PyTorch

    per_gpu, plan_gpus, present = [], plan["tp"] * plan["pp"], torch.cuda.device_count()
    hold_skipped = f"the plan needs {plan_gpus} GPUs, this host has {present}" if plan_gpus > present else None
    for index in range(0 if hold_skipped else plan_gpus):
        torch.cuda.set_device(index)
        free, total = torch.cuda.mem_get_info(index)
        hold_bytes = int((memory["weights_gib_per_gpu"] + memory["kv_cache_gib_per_gpu"]) * GIB)
        held = torch.empty(hold_bytes, dtype=torch.uint8, device=f"cuda:{index}")
        held.fill_(1)  # touch it: the memory is really there
        torch.cuda.synchronize(index)
        free_while_held, _ = torch.cuda.mem_get_info(index)
        del held
        torch.cuda.empty_cache()
        per_gpu.append({
            "gpu": index, "total_gib": round(total / GIB, 3), "free_gib_before": round(free / GIB, 3),
            "held_gib": round(hold_bytes / GIB, 3), "free_gib_while_held": round(free_while_held / GIB, 3),
            "budget_gib": round(budget_gib, 3), "vllm_limit_gib": round(utilization * total / GIB, 3),
            "fits_free": budget_gib * GIB <= free,
            # the plan's figures are rounded to 0.01 GiB: up to 10.24 MiB over for the two of them
            "within_utilization": budget_gib * GIB <= utilization * total + ROUNDING_MIB * MIB,
        })
    result = {
        "model": args.model, "max_model_len": args.max_model_len, "facts": gpus,
        "plan": {key: plan[key] for key in ("strategy", "tp", "pp", "dp", "world_size", "decision")},
        "memory": {key: memory[key] for key in ("weights_gib_per_gpu", "kv_cache_gib_per_gpu", "kv_cache_tokens",
                                                "max_concurrency")},
        "reserve_gib": reserve_gib, "gpu_memory_utilization": utilization, "per_gpu": per_gpu,
        "hold_skipped": hold_skipped,
        "hold_ok": None if hold_skipped else all(g["fits_free"] and g["within_utilization"] for g in per_gpu),
    }
    if args.activation_tokens != "none":
        torch.cuda.set_device(0)
        batch = memory["inputs"]["profile_batch"]
        tokens = [int(t) for t in args.activation_tokens.split(",")] if args.activation_tokens else [
            batch["max_num_batched_tokens"]]
        tp = args.activation_tp or plan["tp"]
        # the forward term scales with 1/tp in its MLP part: ask the planner for the measured rank's tp
        forward_gib = batch["forward_gib"] if tp == plan["tp"] else round(forward_activation_bytes(
            load_model(args.model), tp, batch["max_num_batched_tokens"]) / GIB, 3)
        result["activation_peak"] = activation_peak.measure(
            plan["model"], tp, tokens, forward_gib, batch["max_num_batched_tokens"],
            layers=args.activation_layers, sampled_positions=args.sampled_positions)
    result["ok"] = result["hold_ok"] is not False and result.get("activation_peak", {}).get("ok", True)
    (args.out / "plan_fit.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
