"""The seed's deployment checklist (section 7.1) as automated checks.

Four phases, as the seed groups them: decision, single node, multi node, MoE.
Every item is ``pass``, ``fail`` or ``n/a`` (not applicable to this layout or
device), always with the evidence that decided it. Inputs are the doctor's
evidence (the plan plus what ``doctor_gather``, ``gpu_facts`` and ``ib_facts``
read on every node: journals since the last start, env files, Ray state) and
the results the other playbooks wrote under ``results/<deployment>/`` (the
benchmark stages of ``benchmark.yml``).

It reuses the project's parsers: ``vllm_logs.parse_log`` for the journals,
``topology_check.check`` for world size and ranks against ``plan['expect']``,
``bench_report.load_stages`` / ``bench_verdict.evaluate`` for the baseline and
the expected gains, ``gpu_balance`` for memory balance, and the doctor's
observations for the network environment.

Pure Python 3.11, no Ansible import.
"""

from __future__ import annotations

from ansible_collections.vllm_ops.cluster.plugins.module_utils import launch
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import VLLM_UNIT, Cluster
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.observations_network import (
    SOCKET_IFNAME_VARS,
    obs_host_ip_mismatch,
    obs_ib_declared,
    obs_ib_port_down,
    obs_socket_ifname_mismatch,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.systemd import parse_exec_start
from ansible_collections.vllm_ops.cluster.plugins.module_utils.parsers.text import flag_value
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify import (
    gpu_balance,
    topology_check,
    vllm_logs,
)

PASS, FAIL, NA = "pass", "fail", "n/a"
PHASES = (
    ("decision", "Decision (决策阶段)"),
    ("single_node", "Single node (单节点阶段)"),
    ("multi_node", "Multi node (多节点阶段)"),
    ("moe", "MoE (MoE 阶段)"),
)


def read_results(results_dir):
    """Benchmark stages and their verdict from results/<deployment>/ (empty when none were recorded)."""
    from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench import report as bench_report
    from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench import verdict as bench_verdict

    try:
        stages = bench_report.load_stages(results_dir)
    except (OSError, ValueError) as error:
        return {"stages": {}, "error": f"cannot read the benchmark stages in {results_dir}: {error}"}
    results = {"stages": stages, "dir": results_dir}
    if stages:
        try:
            results["verdict"] = bench_verdict.evaluate(stages)
        except (ValueError, KeyError, TypeError) as error:
            results["verdict_error"] = str(error)
    return results


# --------------------------------------------------------------------------- context


class _Context:
    def __init__(self, evidence):
        self.evidence = evidence
        self.cluster = Cluster(evidence)
        self.plan = self.cluster.plan
        self.results = evidence.get("results") or {}
        self.device = (self.plan.get("cluster") or {}).get("device", "cuda")
        self._topology = None

    @property
    def multi_node(self):
        return (self.plan.get("nodes_used") or 1) > 1

    @property
    def moe(self):
        return bool((self.plan.get("model") or {}).get("is_moe"))

    @property
    def expert_parallel(self):
        return bool(self.plan.get("enable_expert_parallel"))

    def observed(self):
        """{host: vllm_logs topology + unit state}, the input topology_check takes."""
        if self._topology is None:
            observed = {}
            for node in self.cluster.reachable_nodes():
                if not node.runs_vllm:
                    continue
                fact = vllm_logs.parse_log("\n".join(node.journal(VLLM_UNIT)))
                unit = node.unit(VLLM_UNIT)
                fact["unit"] = {
                    "active_state": unit.get("ActiveState"),
                    "sub_state": unit.get("SubState"),
                    "restarts": int(unit.get("NRestarts") or 0),
                }
                ray = node.gather.get("ray") or {}
                if node is self.cluster.head and isinstance(ray.get("actors"), list):
                    # vLLM's Ray workers as actors, joined with Ray's nodes: the ranks each node holds.
                    fact["ray"] = vllm_logs.ray_placement(ray["actors"], ray.get("nodes") or [])
                observed[node.name] = fact
            self._topology = observed
        return self._topology

    def topology_rows(self):
        try:
            return topology_check.check(self.plan, self.observed())
        except topology_check.TopologyCheckError as error:
            return {"ok": False, "rows": [], "mismatches": [], "error": str(error)}

    def verdict_stage(self):
        """The judged benchmark stage with this plan's layout, if one was recorded."""
        verdict = self.results.get("verdict") or {}
        for judged in verdict.get("stages", []):
            stage = (self.results.get("stages") or {}).get(judged.get("stage"))
            plan = (stage or {}).get("plan") or {}
            if all(plan.get(key) == self.plan.get(key) for key in ("tp", "pp", "dp", "nodes_used", "strategy")):
                return judged
        return None


def _item(status, evidence, note=None):
    return {"status": status, "evidence": [line for line in evidence if line], "note": note}


# --------------------------------------------------------------------------- decision


def check_decision_tree(ctx):
    plan = ctx.plan
    if not plan.get("strategy"):
        return _item(FAIL, ["no plan: playbooks/plan.yml did not run or failed"])
    lines = [
        f"strategy {plan['strategy']} (backend {plan.get('backend')}): TP={plan.get('tp')} PP={plan.get('pp')} "
        f"DP={plan.get('dp')} EP={plan.get('ep')}, world_size {plan.get('world_size')} on {plan.get('nodes_used')} node(s)"
    ]
    lines += [f"decision: {sentence}" for sentence in (plan.get("decision") or [])[:4]]
    return _item(PASS, lines)


def _metric_line(name, stage):
    result = stage.get("result") or {}
    parts = []
    for key, label in (("median_ttft_ms", "TTFT P50"), ("p99_ttft_ms", "TTFT P99"), ("median_tpot_ms", "TPOT P50"),
                       ("p99_tpot_ms", "TPOT P99"), ("output_throughput", "output tok/s")):
        if result.get(key) is not None:
            parts.append(f"{label} {result[key]:.1f}" if isinstance(result[key], (int, float)) else f"{label} {result[key]}")
    return f"stage {name}: " + (", ".join(parts) or "no metrics in the saved result")


def check_baseline_recorded(ctx):
    stages = ctx.results.get("stages") or {}
    baselines = [name for name, stage in stages.items() if stage.get("baseline")]
    if ctx.results.get("error"):
        return _item(FAIL, [ctx.results["error"]])
    if not baselines:
        where = ctx.results.get("dir") or "results/<deployment>/"
        return _item(FAIL, [f"no baseline stage in {where} ({len(stages)} stage(s) recorded)"],
                     "record the single-GPU anchor: benchmark.yml with vllm_benchmark_baseline: true")
    name = baselines[0]
    profile = stages[name].get("profile") or {}
    shown = ", ".join(f"{k}={profile[k]}" for k in ("dataset_name", "num_prompts", "request_rate", "max_concurrency")
                      if k in profile)
    return _item(PASS, [_metric_line(name, stages[name]), f"fixed load profile: {shown or 'recorded with the stage'}"])


# --------------------------------------------------------------------------- single node


def check_eager_first(ctx):
    head = ctx.cluster.head
    if head is None or not head.installed(VLLM_UNIT):
        return _item(FAIL, ["vllm.service is not installed on the head"])
    argv = parse_exec_start(head.unit(VLLM_UNIT).get("ExecStart"))
    if "--enforce-eager" in argv:
        return _item(PASS, [f"{head.name}: vllm.service runs with --enforce-eager (functional first, graphs later)"])
    if ctx.device == "cpu" and (ctx.plan.get("pp") or 1) > 1:
        return _item(NA, [f"PP={ctx.plan.get('pp')} on the CPU platform: --enforce-eager crashes the first request"],
                     "the planner leaves eager off for CPU PP layouts")
    stages = ctx.results.get("stages") or {}
    eager = [name for name, stage in stages.items() if (stage.get("plan") or {}).get("enforce_eager")]
    if eager:
        return _item(PASS, [f"eager stage recorded before graphs: {', '.join(sorted(eager))}",
                            f"{head.name}: vllm.service now runs with CUDA graphs"])
    return _item(FAIL, [f"{head.name}: vllm.service runs without --enforce-eager and no eager stage was recorded"],
                 "deploy with vllm_service_eager_first: true (eager, verify, then graphs)")


def check_world_size_logged(ctx):
    result = ctx.topology_rows()
    if result.get("error"):
        return _item(FAIL, [result["error"]])
    lines = []
    for host, fact in ctx.observed().items():
        for worker in fact.get("workers", [])[:4]:
            lines.append(
                f"{host}: world_size={worker['world_size']} rank={worker['rank']} local_rank={worker['local_rank']} "
                f"backend={worker.get('backend')}"
            )
    rows = [row for row in result["rows"] if row["check"] in ("world_size", "workers", "ranks (rank/local)")]
    bad = [row for row in rows if not row["ok"]]
    expected = (ctx.plan.get("expect") or {}).get("worker_log_world_size", ctx.plan.get("world_size"))
    if not lines:
        return _item(FAIL, [f"no 'world_size=... rank=...' line in any vLLM journal since the last start "
                            f"(expected world_size={expected})"])
    if bad:
        lines += [f"{row['node']}: {row['check']} expected {row['expected']}, found {row['found']}" for row in bad]
        return _item(FAIL, lines)
    return _item(PASS, [f"every worker reports world_size={expected} (the real line for the seed's "
                        "'Distributed init succeeded')"] + lines)


def check_memory_balanced(ctx):
    if ctx.device != "cuda":
        return _item(NA, ["CPU platform: vLLM uses no GPU memory (the lab's nvidia-smi replays captures)"])
    rows, labels = [], []
    for node in ctx.cluster.reachable_nodes():
        for gpu in node.gpu.get("gpus") or []:
            if gpu.get("memory_used_mib") is not None and gpu.get("index") in (node.plan.get("local_gpus") or []):
                rows.append({"index": len(rows), "memory.used": gpu["memory_used_mib"]})
                labels.append(f"{node.name}/GPU{gpu['index']}: {gpu['memory_used_mib']} MiB used")
    if not rows:
        return _item(FAIL, ["no per-GPU memory reading from nvidia-smi on the plan's GPUs"])
    try:
        balance = gpu_balance.memory_balance(rows, field="memory.used")
    except gpu_balance.BalanceError as error:
        return _item(FAIL, [f"cannot judge memory balance: {error}"])
    return _item(PASS if balance.get("status") == "pass" else FAIL, labels + list(balance.get("reasons", [])))


def _verdict_item(ctx, what, pick):
    if ctx.results.get("verdict_error"):
        return _item(FAIL, [f"the benchmark verdict could not be computed: {ctx.results['verdict_error']}"])
    judged = ctx.verdict_stage()
    if judged is None:
        recorded = ", ".join(sorted(ctx.results.get("stages") or {})) or "none"
        return _item(FAIL, [f"no benchmark stage with this layout (TP={ctx.plan.get('tp')} PP={ctx.plan.get('pp')} "
                            f"DP={ctx.plan.get('dp')} on {ctx.plan.get('nodes_used')} node(s)); recorded: {recorded}"],
                     f"run benchmark.yml for this stage to check {what}")
    rows = [row for row in judged.get("checks", []) if pick(row)]
    statuses = {row.get("status") for row in rows}
    lines = [
        f"{row.get('label') or row.get('check')}: gain {row['gain']:.2f}x, expected {row.get('expected_gain')}"
        f" -> {row.get('status')}" if isinstance(row.get("gain"), (int, float)) else
        f"{row.get('label') or row.get('check')}: {row.get('status')} {row.get('note') or ''}".strip()
        for row in rows
    ]
    if statuses and statuses <= {"not_comparable", "info"}:
        return _item(NA, lines or [f"stage {judged.get('stage')}: not comparable"],
                     "CPU platform: the seed's GPU targets do not apply (bench_verdict: not comparable)")
    if not rows:
        return _item(NA, [f"stage {judged.get('stage')}: the seed sets no target for this layout change"])
    failed = statuses & {"fail", "warn"}
    return _item(FAIL if failed else PASS, lines)


def check_scaling_gain(ctx):
    if (ctx.plan.get("world_size") or 1) == 1 and (ctx.plan.get("dp") or 1) == 1:
        return _item(NA, ["a single-GPU layout: nothing is scaled, this stage is the baseline"])
    if ctx.device == "cpu":
        judged = ctx.verdict_stage()
        where = f" (stage {judged.get('stage')})" if judged else ""
        return _item(NA, [f"CPU platform{where}: the seed's GPU targets (TTFT /3, throughput x3-4) do not apply"],
                     "benchmark.yml reports the CPU ratios as not comparable")
    return _verdict_item(ctx, "the expected gain", lambda row: row.get("kind") in ("latency", "throughput"))


# --------------------------------------------------------------------------- multi node


def check_ray_cluster(ctx):
    if not ctx.multi_node:
        return _item(NA, ["one node: no cluster to form"])
    nodes_with_ray = [node for node in ctx.cluster.reachable_nodes() if ctx.cluster.ray_argv(node)]
    mode = launch.of_plan(ctx.plan)
    if not mode.cluster_units and not nodes_with_ray:
        return _item(NA, [f"backend {mode.name}: {mode.summary}; no Ray cluster"])
    head = ctx.cluster.head
    listed = ((head.gather.get("ray") if head else None) or {}).get("nodes")
    if not isinstance(listed, list):
        error = ((head.gather.get("ray") if head else None) or {}).get("error", "the head has no Ray node list")
        return _item(FAIL, [f"ray list nodes: {error}"])
    alive = [entry for entry in listed if entry.get("state") == "ALIVE"]
    gpus = sum(float((entry.get("resources_total") or {}).get("GPU", 0)) for entry in alive)
    planned = [node for node in ctx.cluster.nodes if (node.plan or {}).get("ray_start_argv")]
    if planned:  # a Ray plan: its nodes and --num-gpus, whatever the units run now
        nodes_with_ray = planned
    wanted_gpus = 0.0
    for node in nodes_with_ray:
        argv = node.plan["ray_start_argv"] if planned else ctx.cluster.ray_argv(node)
        value = flag_value(argv, "--num-gpus")
        wanted_gpus += float(value) if value else 0.0
    lines = [f"{entry.get('node_ip')}: ALIVE, GPU {(entry.get('resources_total') or {}).get('GPU', 0)}"
             for entry in alive]
    dead = [entry for entry in listed if entry.get("state") != "ALIVE"]
    if dead:
        lines.append(f"{len(dead)} earlier registration(s) not alive (a node's previous Ray session): "
                     + ", ".join(sorted({str(entry.get('node_ip')) for entry in dead})))
    source = "the plan's" if planned else "the Ray units'"
    lines.append(f"{len(alive)} ALIVE node(s), {gpus:g} GPU(s); expected {len(nodes_with_ray)} node(s), "
                 f"{wanted_gpus:g} GPU(s) ({source} --num-gpus)")
    ok = len(alive) == len(nodes_with_ray) and abs(gpus - wanted_gpus) < 1e-6
    return _item(PASS if ok else FAIL, lines)


def check_nccl_env(ctx):
    if not ctx.multi_node:
        return _item(NA, ["one node: NCCL and Gloo stay inside the node"])
    problems = obs_socket_ifname_mismatch(ctx.cluster, {}) + obs_host_ip_mismatch(ctx.cluster, {})
    lines = []
    missing = []
    for node in ctx.cluster.reachable_nodes():
        env = node.env
        for var in (*SOCKET_IFNAME_VARS, "VLLM_HOST_IP"):
            if var in env:
                value, path, (number, text) = env[var]
                lines.append(f"{node.name} {path}:{number}: {text.strip()}")
            elif var != "TP_SOCKET_IFNAME":
                missing.append(f"{node.name}: {var} is not set in {', '.join(doctor_env_paths(node))}")
    if problems or missing:
        return _item(FAIL, missing + [f"{hit['node']} [{hit['source']}] {hit['line']}" for hit in problems])
    return _item(PASS, lines)


def doctor_env_paths(node):
    return [path for path, info in (node.gather.get("env_files") or {}).items() if info.get("exists")] or ["no env file"]


def check_rank_layout(ctx):
    if not ctx.multi_node:
        return _item(NA, ["one node: the rank layout is checked by the world_size item"])
    result = ctx.topology_rows()
    if result.get("error"):
        return _item(FAIL, [result["error"]])
    rows = [row for row in result["rows"]
            if row["check"] in ("world_size", "ranks (rank/local)", "ranks", "assigned", "processes",
                                "Ray workers (ranks)", "Ray workers (count)", "Ray workers elsewhere",
                                "Ray workers not alive")]
    lines = [f"{row['node']}: {row['check']} expected {row['expected']}, found {row['found']}"
             f"{'' if row['ok'] else '  <- mismatch'}" for row in rows]
    lines.insert(0, f"world_size = TP x PP = {ctx.plan.get('tp')} x {ctx.plan.get('pp')} = {ctx.plan.get('world_size')}")
    return _item(PASS if rows and all(row["ok"] for row in rows) else FAIL, lines)


def check_ib_traffic(ctx):
    if not ctx.multi_node:
        return _item(NA, ["one node: no inter-node traffic"])
    declared = obs_ib_declared(ctx.cluster, {})
    if not declared:
        return _item(NA, ["no node declares InfiniBand (NCCL_IB_DISABLE=1 or no NCCL_IB_HCA): traffic is TCP by design"])
    ib_lines, socket_lines = [], []
    for node in ctx.cluster.reachable_nodes():
        for line in node.journal(VLLM_UNIT):
            if "via NET/IB" in line and len(ib_lines) < 4:
                ib_lines.append(f"{node.name}: {line.strip()}")
            elif "via NET/Socket" in line and len(socket_lines) < 4:
                socket_lines.append(f"{node.name}: {line.strip()}")
    down = obs_ib_port_down(ctx.cluster, {})
    if socket_lines or down:
        return _item(FAIL, socket_lines + [hit["line"] for hit in down])
    if not ib_lines:
        return _item(FAIL, [f"{hit['node']}: {hit['line']}" for hit in declared] +
                     ["no 'via NET/IB' line in the journals: restart once with NCCL_DEBUG=INFO, or run the NCCL probe "
                      "(nccl_network_probe: true)"])
    return _item(PASS, ib_lines)


def check_linear_scaling(ctx):
    if not ctx.multi_node:
        return _item(NA, ["one node: nothing to scale across nodes"])
    if ctx.device == "cpu":
        return _item(NA, ["CPU platform: the seed's 'two nodes, close to 2x' is a GPU target"],
                     "benchmark.yml reports the CPU ratios as not comparable")
    return _verdict_item(ctx, "scaling across nodes", lambda row: row.get("kind") == "throughput")


# --------------------------------------------------------------------------- MoE


def _moe_na(ctx):
    if not ctx.moe:
        return _item(NA, [f"{(ctx.plan.get('model') or {}).get('name', 'the model')} is dense"])
    if not ctx.expert_parallel:
        return _item(NA, ["the plan runs this MoE model without expert parallel (EP=1)"])
    return None


def check_ep_logged(ctx):
    skip = _moe_na(ctx)
    if skip:
        return skip
    want = ctx.plan.get("ep")
    lines, sizes = [], set()
    for host, fact in ctx.observed().items():
        for entry in fact.get("expert_parallel", []):
            sizes.add(entry.get("ep_size"))
            lines.append(f"{host}: [EP Rank {entry.get('ep_rank')}/{entry.get('ep_size')}] "
                         f"{entry.get('local_experts')}/{entry.get('global_experts')} experts")
    if not lines:
        return _item(FAIL, [f"no '[EP Rank r/{want}] Expert parallelism is enabled' line (the real line for the seed's "
                            "'Expert parallel size')"])
    return _item(PASS if sizes == {want} else FAIL, lines + [f"expected EP size {want}, found {sorted(sizes)}"])


def check_eplb_balance(ctx):
    skip = _moe_na(ctx)
    if skip:
        return skip
    judged = ctx.verdict_stage()
    if judged is None:
        return _verdict_item(ctx, "the per-GPU balance", lambda row: False)
    rows = [h for h in judged.get("health", []) if h.get("check") in ("ep_balance", "utilization_balance")]
    if not rows:
        return _item(FAIL, [f"stage {judged.get('stage')}: no per-GPU utilization sampled under load"])
    lines = [f"{h['check']}: {h['status']} {h.get('detail', '')}".strip() for h in rows]
    return _item(PASS if all(h["status"] == "pass" for h in rows) else FAIL, lines)


def check_tp_only_comparison(ctx):
    skip = _moe_na(ctx)
    if skip:
        return skip
    comparisons = (ctx.results.get("verdict") or {}).get("moe") or []
    if not comparisons:
        return _item(FAIL, ["no TP-only stage to compare with"], "benchmark a TP-only stage of the same model")
    lines = [f"{c.get('ep_stage')} vs {c.get('tp_stage') or 'no TP-only stage'}: {c.get('status')}; "
             f"{'; '.join(c.get('reasons') or [])}".rstrip("; ") for c in comparisons]
    return _item(PASS if all(c.get("status") == "pass" for c in comparisons) else FAIL, lines)


ITEMS = (
    ("decision", "decision_tree", "决策树走完：确认是“装不下”还是“不够快”",
     "The decision tree was walked: the plan says whether the model does not fit or is not fast enough",
     check_decision_tree),
    ("decision", "baseline_recorded", "单卡基线已记录（TTFT/TPOT/吞吐，固定压测参数）",
     "A single-GPU baseline is recorded (TTFT, TPOT, throughput) under a fixed load profile",
     check_baseline_recorded),
    ("single_node", "eager_first", "--enforce-eager 先跑通功能，再开 CUDA Graph",
     "The first start runs with --enforce-eager; CUDA graphs come after it works",
     check_eager_first),
    ("single_node", "world_size_logged", "日志确认 Distributed init succeeded、world_size 正确",
     "The logs show the distributed init with the right world_size",
     check_world_size_logged),
    ("single_node", "memory_balanced", "nvidia-smi 确认显存分布均匀",
     "nvidia-smi shows GPU memory evenly spread",
     check_memory_balanced),
    ("single_node", "scaling_gain", "同参数压测，扩展收益达标（延迟 ÷3、吞吐 ×3~4）",
     "Under the same load, the expected gain is met (latency /3, throughput x3-4)",
     check_scaling_gain),
    ("multi_node", "ray_cluster", "ray status 确认集群（节点数/GPU 数）",
     "The Ray cluster has every node and GPU",
     check_ray_cluster),
    ("multi_node", "nccl_network_env", "NCCL 网络配置（NCCL_SOCKET_IFNAME 等）",
     "NCCL/Gloo network variables name the fabric interface on every node",
     check_nccl_env),
    ("multi_node", "rank_layout", "world_size = TP×PP，rank 分布符合拓扑图",
     "world_size = TP x PP and the ranks sit on the nodes the plan says",
     check_rank_layout),
    ("multi_node", "ib_traffic", "IB 流量验证",
     "Inter-node traffic goes over InfiniBand when it is declared",
     check_ib_traffic),
    ("multi_node", "linear_scaling", "吞吐随节点数线性增长",
     "Throughput grows close to linearly with the nodes",
     check_linear_scaling),
    ("moe", "ep_logged", "Expert parallel size 日志确认 EP 生效",
     "The logs show expert parallel with the planned EP size",
     check_ep_logged),
    ("moe", "eplb_balance", "每卡利用率均衡（EPLB 生效）",
     "Per-GPU utilization is balanced (EPLB works)",
     check_eplb_balance),
    ("moe", "tp_only_comparison", "与 TP-only 配置对比收益",
     "The EP+DP stage is compared with a TP-only stage",
     check_tp_only_comparison),
)


def evaluate(evidence):
    """Every item of the seed's checklist: {"items": [...], "summary": {...}}."""
    ctx = _Context(evidence)
    items = []
    for phase, item_id, seed, text, check in ITEMS:
        try:
            result = check(ctx)
        except Exception as error:  # an item must report, never abort the checklist
            result = _item(FAIL, [f"the check raised {type(error).__name__}: {error}"])
        items.append({"phase": phase, "id": item_id, "seed": seed, "text": text, **result})
    counts = {status: sum(1 for item in items if item["status"] == status) for status in (PASS, FAIL, NA)}
    return {
        "deployment": ctx.plan.get("deployment"),
        "strategy": ctx.plan.get("strategy"),
        "device": ctx.device,
        "items": items,
        "summary": {
            "deployment": ctx.plan.get("deployment"),
            "passed": counts[PASS],
            "failed": counts[FAIL],
            "not_applicable": counts[NA],
            "failed_items": [item["id"] for item in items if item["status"] == FAIL],
        },
    }


def render_lines(report):
    lines = [f"checklist of {report.get('deployment') or 'the deployment'}: {report['summary']['passed']} pass, "
             f"{report['summary']['failed']} fail, {report['summary']['not_applicable']} not applicable"]
    for phase, title in PHASES:
        lines.append(title)
        for item in (i for i in report["items"] if i["phase"] == phase):
            lines.append(f"  [{item['status']:>4}] {item['text']}")
            for line in item["evidence"][:3]:
                lines.append(f"         {line}")
            if item.get("note") and item["status"] != PASS:
                lines.append(f"         -> {item['note']}")
    return lines


def render_markdown(report):
    summary = report["summary"]
    out = [
        f"# Deployment checklist: {report.get('deployment') or 'deployment'}",
        "",
        f"The seed's checklist (section 7.1), checked on the running deployment ({report.get('strategy')}, "
        f"device {report.get('device')}): {summary['passed']} pass, {summary['failed']} fail, "
        f"{summary['not_applicable']} not applicable.",
    ]
    for phase, title in PHASES:
        out += ["", f"## {title}", "", "| status | item | seed | evidence |", "| --- | --- | --- | --- |"]
        for item in (i for i in report["items"] if i["phase"] == phase):
            evidence = "<br>".join(_cell(line) for line in item["evidence"][:6])
            if item.get("note") and item["status"] != PASS:
                evidence += f"<br>→ {_cell(item['note'])}"
            out.append(f"| {item['status']} | {_cell(item['text'])} | {item['seed']} | {evidence} |")
    return "\n".join(out) + "\n"


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")
