"""The catalog table of docs/planner.md: every catalog model on 1x H100, 1x H200 and 8x H100, as planned.

`python tests/unit/planner_table.py --write` rewrites the table between its markers in
docs/planner.md; test_planner_table.py requires the page to hold exactly what the planner
plans now, so a planner change that moves a model's layout shows in the docs diff.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "planner.md"
BEGIN = "<!-- catalog table: tests/unit/planner_table.py --write -->"
END = "<!-- end of the catalog table -->"
CLUSTERS = {
    "1x H100 80GB": {"count": 1, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "nvlink": False},
    "1x H200": {"count": 1, "name": "NVIDIA H200", "memory_total_mib": 143771, "nvlink": False},
    "8x H100 80GB (NVLink)": {"count": 8, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559,
                              "nvlink": True},
}


def _plan(name, gpus, overrides=None):
    from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import PlanError, build_plan

    try:
        return build_plan(name, [{"name": "node1", "address": "10.0.0.1", "gpus": dict(gpus)}], None, overrides)
    except PlanError:
        return None


def _reason(plan, one_gpu, gpus, weights):
    target = plan["targets"]["concurrency_target"]
    if one_gpu is None:
        fit = f"{weights:.1f} GiB of weights: not on one GPU"
    else:
        fit = f"fits one GPU with {one_gpu['memory']['max_concurrency']:.1f} requests"
    if plan["strategy"] == "single":
        if plan["memory"]["max_concurrency"] >= target:
            return f"fits one GPU with {plan['memory']['max_concurrency']:.1f} requests >= {target:g}"
        return f"{fit} < {target:g}; one GPU, no room for replicas (warning)"
    if plan["enable_expert_parallel"]:
        return f"{fit}; MoE: EP + DP over the node"
    if plan["tp"] == 1 and plan["dp"] > 1:
        return f"{fit} < {target:g}: DP replicas"
    if one_gpu is not None:
        return f"{fit} < {target:g}; NVLink: TP inside the node first"
    return f"{fit}; the smallest TP that holds {target:g} requests"


def rows():
    from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import model_catalog
    from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import model_config as mc

    lines = ["| model | GPUs | strategy | TP / PP / DP / EP | KV tokens per replica | why |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name in model_catalog.catalog_names():
        weights = mc.load_model(name)["weights_gib"]
        for label, gpus in CLUSTERS.items():
            plan = _plan(name, gpus)
            if plan is None:
                usable = gpus["count"] * gpus["memory_total_mib"] / 1024 * 0.92
                lines.append(f"| {name} | {label} | does not fit | - | - | {weights:.1f} GiB of weights, "
                             f"{usable:.1f} GiB usable in all |")
                continue
            one_gpu = _plan(name, {**gpus, "count": 1})
            sizes = f"{plan['tp']} / {plan['pp']} / {plan['dp']} / {plan['ep']}"
            lines.append(f"| {name} | {label} | {plan['strategy']} | {sizes} | "
                         f"{plan['memory']['kv_cache_tokens']:,} | {_reason(plan, one_gpu, gpus, weights)} |")
    return lines


def render(text):
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + "\n".join(rows()) + "\n" + text[end:]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the table in docs/planner.md")
    args = parser.parse_args(argv)
    text = DOC.read_text()
    new = render(text)
    if args.write:
        DOC.write_text(new)
    else:
        sys.stdout.write("\n".join(rows()) + "\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "collections"))
    sys.exit(main())
