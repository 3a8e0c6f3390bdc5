"""deploy.yml's stages, in order: the one table that deploy.yml, the converged check, stage_stamp and the docs read.

Each row names the stage (its tag and its stamp's name), the playbook that runs
it, the role that does the work and what a skipped stage re-checks (the role's
``__<role>_stage_evidence``: files, units, probes). ``launch`` is the launch
mode's own bring-up: the row takes its name and role from the plan's mode
(ray: stage ``ray``, role ``ray_cluster``; mp has none, so a mp plan skips it).

tests/unit/test_stages.py checks deploy.yml's imports, the stage playbooks and
docs/architecture.md's stage table against this one.

Pure Python, no Ansible import.
"""

from __future__ import annotations

from dataclasses import dataclass

from ansible_collections.vllm_ops.cluster.plugins.module_utils import launch

LAUNCH = "launch"


@dataclass(frozen=True)
class Stage:
    name: str  # the tag, the stamp's name (/etc/vllm-cluster/stages/<name>.json)
    playbook: str  # relative to the collection's root
    role: str | None  # the role that does the work (None for the launch slot: the mode's role)
    does: str  # what it owns on the node (and what it only checks) (the docs' table)
    evidence: str  # how its stamp sees that: what a skipped stage re-checks (the docs' table)


STAGES = (
    Stage("preflight", "playbooks/preflight.yml", "gpu_preflight",
          "nothing (reads only): GPU count, model, driver/CUDA parity, no foreign GPU processes",
          "the output of `nvidia-smi --query-gpu=index,uuid,name,driver_version,memory.total,persistence_mode,"
          "ecc.mode.current` and `ibstat`"),
    Stage("network", "playbooks/network.yml", "nccl_network",
          "`/etc/vllm-cluster/env` (NCCL/Gloo/Ray interface variables); checks the fabric NIC, MTU, IB ports, "
          "reachability; optional all-reduce probe",
          "`/etc/vllm-cluster/env` (owner, mode, content), the fabric interface's `mtu`, `operstate`, "
          "`ip -br addr` and its routes (`ip route show dev`)"),
    Stage("firewall", "playbooks/firewall.yml", "node_firewall",
          "one nftables table per node (internal ports only from the cluster, the API port from a CIDR list): "
          "`firewall.nft`, its unit",
          "`firewall.nft`, its unit file and unit, `nft --stateless list table inet vllm_cluster` "
          "(rules without their counters)"),
    Stage("runtime", "playbooks/runtime.yml", "vllm_runtime",
          "one pinned venv per node (index or wheelhouse), the service user, its home and the cache directories "
          "vLLM writes (owner, mode), the staged model; checks version parity",
          "the venv's `pyvenv.cfg`, `bin/vllm` and its `*.dist-info` names, `id vllm`, the model directory "
          "(owner, mode, entries); the home, `tmp`, `.cache`, `.cache/vllm`, `.cache/huggingface`, `.triton` "
          "(owner and mode)"),
    Stage(LAUNCH, "playbooks/launch.yml", None,
          "the launch mode's own bring-up (ray: `ray-head`/`ray-worker` units, wait until Ray reports every "
          "node and GPU; mp: none)",
          "ray: the unit file, its drop-in directory and the `ray-head`/`ray-worker` unit (state, invocation)"),
    Stage("vllm", "playbooks/vllm.yml", "vllm_service",
          "each node's argv checked by vLLM's own parser; env file, API key file, `vllm.service` and its drop-in "
          "directory per node from the plan, and the running vLLM: coordinated restarts (stop every node, then "
          "start every node; behind the router one server at a time, docs/router.md), `/health`, smoke "
          "completion, rollback on failure",
          "`vllm.service`, its drop-in directory, `vllm.env`, `api-key.env`, `plan.json`, `vllm-head-watch`, "
          "the network env (owner, mode, content); the unit (state, invocation)"),
    Stage("verify", "playbooks/verify.yml", "vllm_verify",
          "nothing (reads only): world_size, every rank once, ranks per node, DP/PP/TP/EP, KV tokens, GPU "
          "memory balance",
          "the vLLM unit: the same invocation that verify saw"),
)
#: Every stage name a stamp may carry: the fixed stages and every launch mode's own.
# The stages a launch mode may put in the launch slot (ray's; mp has none).
LAUNCH_STAGES = tuple(mode.stage for mode in launch.MODES.values() if mode.stage)
ALL_NAMES = tuple(name for stage in STAGES for name in (LAUNCH_STAGES if stage.name == LAUNCH else [stage.name]))


def for_plan(plan):
    """This plan's stages in order, as dicts {name, playbook, role}; the launch slot only when its mode has one."""
    mode = launch.of_plan(plan)
    rows = []
    for stage in STAGES:
        if stage.name == LAUNCH:
            if mode.stage:
                rows.append({"name": mode.stage, "playbook": stage.playbook, "role": mode.stage_role})
            continue
        rows.append({"name": stage.name, "playbook": stage.playbook, "role": stage.role})
    return rows


def names_for_plan(plan):
    return [row["name"] for row in for_plan(plan)]


def row(name, plan=None):
    """The row of one stage by name (a launch mode's stage resolves with the plan's mode, or any mode)."""
    for stage in STAGES:
        if stage.name == name and stage.name != LAUNCH:
            return {"name": stage.name, "playbook": stage.playbook, "role": stage.role}
    modes = [launch.of_plan(plan)] if plan else list(launch.MODES.values())
    for mode in modes:
        if mode.stage == name:
            launch_stage = next(stage for stage in STAGES if stage.name == LAUNCH)
            return {"name": name, "playbook": launch_stage.playbook, "role": mode.stage_role}
    raise KeyError(f"unknown stage {name!r}; the stages are {', '.join(ALL_NAMES)}")
