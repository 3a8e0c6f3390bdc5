"""The layout search: the seed's decision tree over every TP x PP x DP (x EP) vLLM accepts here.

``choose(inputs)`` walks the candidates in the tree's order (one GPU, EP + DP for
MoE, TP inside a node, TP x PP inside a node, then across nodes) and returns the
first that meets the target. A dense model that fits one GPU but misses the
target takes the seed's other branch ("fits, not fast enough"): DP replicas of
TP=1 (``replicas_for_target``), with TP inside the node tried first only where
the GPUs share NVLink. ``scale_for_throughput`` answers Q2 with DP replicas;
``settle`` decides EPLB and the CPU's eager default once the layout is known. A
layout that cannot be planned raises PlanError naming the numbers.

Pure Python, no Ansible import.
"""

from __future__ import annotations

import math

from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.checks import PlanError, gib
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.memory import evaluate

# Q2 estimate when no measured baseline is given: decode-bound replicas run at
# about 2.5x the weight-streaming roofline under load (performance-anchors §3.2),
# at the seed's benchmark concurrency.
DECODE_SLOWDOWN = 2.5
ESTIMATE_CONCURRENCY = 64
HBM_TB_PER_S = (
    ("GH200", 4.0),
    ("H200", 4.8),
    ("H100 NVL", 3.9),
    ("H100 PCIE", 2.0),
    ("H100", 3.35),
    ("H800", 3.35),
    ("B200", 8.0),
    ("A100-SXM4-80GB", 2.039),
    ("A100 80GB PCIE", 1.935),
    ("A100-PCIE-80GB", 1.935),
    ("A100", 1.555),
    ("A800", 2.039),
    ("L40S", 0.864),
    ("L40", 0.864),
    ("A10G", 0.6),
    ("A10", 0.6),
    ("L4", 0.3),
    ("V100", 0.9),
    ("T4", 0.32),
    ("RTX 4090", 1.008),
)


class Candidate:
    """One layout: TP x PP per replica, DP replicas, EP on or off, and how a replica spans nodes.

    ``r``: nodes per replica (1 inside a node), ``local``: ranks per node of a
    replica, ``tp_across``: TP spans nodes, ``step``: the tree's step that
    proposed it; ``nnodes`` and ``rpn`` (replicas per node) are set by ``place``.
    """

    __slots__ = ("tp", "pp", "dp", "ep_on", "r", "local", "tp_across", "step", "nnodes", "rpn")

    def __init__(self, tp, pp, dp, ep_on, r, local, tp_across, step):
        self.tp, self.pp, self.dp, self.ep_on = tp, pp, dp, ep_on
        self.r, self.local, self.tp_across, self.step = r, local, tp_across, step
        self.nnodes = self.rpn = None

    @property
    def world(self):
        return self.tp * self.pp

    def label(self):
        parts = [f"TP={self.tp}"]
        if self.pp > 1:
            parts.append(f"PP={self.pp}")
        if self.dp > 1:
            parts.append(f"DP={self.dp}")
        if self.ep_on:
            parts.append(f"EP={self.tp * self.dp}")
        return " x ".join(parts)


def tp_rule_violation(spec, tp):
    """vLLM's checks of TP against the attention heads, as vLLM words them; None when valid (or unknown)."""
    if spec["heads"] is None:  # a model planned without its shapes (plan/modelled.py opaque_spec)
        if tp & (tp - 1):
            return (f"its attention heads are unknown, so only power-of-two TP sizes are planned (vLLM needs TP to "
                    f"divide the heads; give the config to plan TP={tp})")
        return None
    if spec["heads"] % tp:
        return f"Total number of attention heads ({spec['heads']}) must be divisible by tensor parallel size ({tp})"
    if spec["attention"] not in ("mla", "given"):
        kv = spec["kv_heads"]
        if kv >= tp and kv % tp:
            return f"the {kv} KV heads must be divisible by tensor parallel size ({tp})"
        if kv < tp and tp % kv:
            return f"tensor parallel size ({tp}) must be a multiple of the {kv} KV heads when it exceeds them"
    return None


def place(inputs, cand):
    """Put the replicas on nodes the way ``--nnodes`` spreads them; False if they do not fit."""
    if cand.r > 1:
        nnodes = cand.dp * cand.r
        if nnodes > inputs.n_nodes:
            return False
        cand.nnodes, cand.rpn = nnodes, 0
        return True
    per_node = inputs.gpus_per_node // cand.world
    for nnodes in range(1, inputs.n_nodes + 1):
        if cand.dp % nnodes == 0 and cand.dp // nnodes <= per_node:
            cand.nnodes, cand.rpn = nnodes, cand.dp // nnodes
            return True
    return False


# --------------------------------------------------------------------------- candidates


def _replica_shapes(inputs):
    """Every (tp, pp, nodes per replica, ranks per node, tp across nodes) vLLM accepts here."""
    spec, gpus, n_nodes = inputs.spec, inputs.gpus_per_node, inputs.n_nodes
    total = gpus * n_nodes
    shapes = []
    for tp in range(1, total + 1):
        if tp_rule_violation(spec, tp) or (tp > gpus and not inputs.allow_tp_across_nodes):
            continue
        for pp in range(1, min(spec["layers"], total // tp) + 1):
            world = tp * pp
            if world <= gpus:
                shapes.append((tp, pp, 1, world, False))
                continue
            for r in range(2, n_nodes + 1):
                if world % r or world // r > gpus:
                    continue
                local = world // r
                if local % tp == 0:
                    shapes.append((tp, pp, r, local, False))
                    break
                if inputs.allow_tp_across_nodes and tp % local == 0:
                    shapes.append((tp, pp, r, local, True))
                    break
    return shapes


def _ordered_candidates(inputs):
    """Candidates in the order the seed's decision tree considers them."""
    shapes = _replica_shapes(inputs)
    spec = inputs.spec
    dp_default = inputs.pins.get("dp", 1)

    def dense(step, selected):
        for tp, pp, r, local, across in selected:
            yield Candidate(tp, pp, dp_default, False, r, local, across, step)

    single = [s for s in shapes if s[0] == 1 and s[1] == 1]
    in_node_tp = sorted((s for s in shapes if s[2] == 1 and s[1] == 1 and s[0] > 1), key=lambda s: s[0])
    in_node_pp = sorted((s for s in shapes if s[2] == 1 and s[1] > 1), key=lambda s: (s[0] * s[1], s[1]))
    multi = sorted((s for s in shapes if s[2] > 1), key=lambda s: (s[2], s[4], -s[3], -s[0], s[1]))
    multi = [s for s in multi if inputs.mode.accepts_multi_node_shape(inputs.gpus_per_node, s[3], s[4])]

    ep_allowed = (
        spec["is_moe"] and inputs.device == "cuda" and inputs.mode.plans_expert_parallel
        and inputs.pins.get("ep") != 1
    )

    def expert_parallel(first_nodes, last_nodes):
        if not ep_allowed:
            return
        pinned = "dp" in inputs.pins or "ep" in inputs.pins
        if pinned and first_nodes > 1:
            return  # a pinned DP or EP size fixes the node count: yielded once already
        tps = [tp for tp in range(1, inputs.gpus_per_node + 1) if not tp_rule_violation(spec, tp)]
        for nodes in range(first_nodes, first_nodes + 1 if pinned else last_nodes + 1):
            for tp in tps:
                if "dp" in inputs.pins:
                    dp = inputs.pins["dp"]
                elif "ep" in inputs.pins:
                    if inputs.pins["ep"] % tp:
                        continue
                    dp = inputs.pins["ep"] // tp
                else:
                    if (nodes * inputs.gpus_per_node) % tp:
                        continue
                    dp = nodes * inputs.gpus_per_node // tp
                if dp < 2 and "ep" not in inputs.pins:
                    continue
                if tp * dp > spec["experts"]:
                    continue  # an EP rank without experts
                yield Candidate(tp, 1, dp, True, 1, tp, False, "ep_dp")

    yield from dense("single", single)
    yield from expert_parallel(1, 1)
    yield from dense("tp_in_node", in_node_tp)
    yield from dense("tp_pp_in_node", in_node_pp)
    yield from expert_parallel(2, inputs.n_nodes)
    yield from dense("multi_node", multi)


def _matches_pins(inputs, cand):
    pins = inputs.pins
    if "tp" in pins and cand.tp != pins["tp"]:
        return False
    if "pp" in pins and cand.pp != pins["pp"]:
        return False
    if "dp" in pins and cand.dp != pins["dp"]:
        return False
    if "ep" in pins:
        if pins["ep"] == 1:
            return not cand.ep_on
        return cand.ep_on and cand.tp * cand.dp == pins["ep"]
    return True


# --------------------------------------------------------------------------- the search


def check_pins(inputs):
    """Reject overrides that break a rule, with vLLM's own wording where it has one."""
    spec, pins, gpus = inputs.spec, inputs.pins, inputs.gpus_per_node
    total = gpus * inputs.n_nodes
    say = inputs.request.setting
    tp, pp, dp, ep = pins.get("tp"), pins.get("pp"), pins.get("dp"), pins.get("ep")
    if tp is not None:
        violation = tp_rule_violation(spec, tp)
        if violation:
            raise PlanError(f"{say('overrides.tp', tp)} is invalid for {spec['name']}: {violation}")
        if tp > gpus and not inputs.allow_tp_across_nodes:
            raise PlanError(
                f"{say('overrides.tp', tp)} exceeds the {gpus} GPUs of one node: TP stays inside a node "
                "(set allow_tp_across_nodes to break that rule on purpose)"
            )
    if pp is not None and pp > 1 and spec.get("opaque") and spec["layers"] == 1:
        raise PlanError(f"{say('overrides.pp', pp)} needs the model's layers, which {spec['name']} was planned "
                        "without: give its config.json (a model directory, or {config: ...} beside weights_gib and "
                        "kv_bytes_per_token)")
    if pp is not None and pp > spec["layers"]:
        raise PlanError(
            f"{say('overrides.pp', pp)} exceeds the model's {spec['layers']} layers: a stage would hold no layer"
        )
    if ep is not None and ep > 1:
        _check_expert_pin(inputs, say, tp, pp, dp, ep)
    if dp is not None and dp > 1:
        refusal = inputs.mode.refuse_data_parallel(say("overrides.dp", dp))
        if refusal:
            raise PlanError(refusal)
        if inputs.device == "cpu" and spec["is_moe"]:
            raise PlanError(
                f"{say('overrides.dp', dp)} on a MoE model: MoE data parallel fails on the CPU platform "
                "(all_gatherv is not implemented)"
            )
    known = [v for v in (tp, pp, dp) if v is not None]
    if ep is not None and ep > 1:
        known = [ep]
    if known and math.prod(known) > total:
        raise PlanError(
            f"the overrides need {math.prod(known)} GPUs; the cluster has {inputs.n_nodes} x {gpus} = {total}"
        )


def _check_expert_pin(inputs, say, tp, pp, dp, ep):
    spec, pinned = inputs.spec, say("overrides.ep", ep)
    if not spec["is_moe"]:
        raise PlanError(
            f"{pinned} on the dense model {spec['name']}: Number of experts in the model must be greater than 0 "
            "when expert parallelism is enabled"
        )
    if inputs.device == "cpu":
        raise PlanError(f"{pinned}: expert parallel serving does not work on the CPU platform (first forward crashes)")
    refusal = inputs.mode.refuse_expert_parallel(pinned)
    if refusal:
        raise PlanError(refusal)
    if pp not in (None, 1):
        raise PlanError(f"{pinned} with pp={pp}: this planner does not combine expert and pipeline parallel")
    if tp is not None and dp is not None and tp * dp != ep:
        raise PlanError(f"{pinned} must equal tp x dp = {tp} x {dp} = {tp * dp} (vLLM sets EP = TP x DP)")
    if tp is not None and ep % tp:
        raise PlanError(f"{pinned} is not a multiple of tp={tp}: EP = TP x DP")
    if dp is not None and ep % dp:
        raise PlanError(f"{pinned} is not a multiple of dp={dp}: EP = TP x DP")
    if ep > spec["experts"]:
        raise PlanError(f"{pinned} exceeds the {spec['experts']} experts of {spec['name']}: some EP ranks would hold none")


def choose(inputs):
    """Walk the candidates; return (candidate, evaluation, trace, default_target_missed).

    Sets ``inputs.one_gpu_rule`` (None, or what ``replicas_for_target`` decided) for the decision path.
    """
    inputs.one_gpu_rule = None
    trace, first_fit, best_failed, placement_failures = [], None, None, []
    rule = None  # set once TP=1 fits but misses the target and the fits-one-GPU rule decides the rest
    for cand in _ordered_candidates(inputs):
        if not _matches_pins(inputs, cand):
            continue
        if rule is not None and not (rule["nvlink"] and cand.step == "tp_in_node"):
            rule["avoided"].append(cand)  # TP over PCIe; PP or several nodes for a model that fits one GPU
            continue
        if not place(inputs, cand):
            placement_failures.append(cand)
            continue
        ev = evaluate(inputs, cand)
        trace.append((cand, ev))
        if rule is not None:
            rule["tried"].append((cand, ev))
        if ev["fits"] and first_fit is None:
            first_fit = (cand, ev)
        if not ev["fits"] and (best_failed is None or ev["weights_max"] < best_failed[1]["weights_max"]):
            best_failed = (cand, ev)
        if ev["meets_target"]:
            if rule is not None:
                inputs.one_gpu_rule = dict(rule, answer="tp")
            return cand, ev, trace, False
        if cand.step == "single" and _one_gpu_rule_applies(inputs, ev):
            rule = {"nvlink": inputs.nvlink, "single": (cand, ev), "tried": [], "avoided": []}
    if rule is not None:
        return replicas_for_target(inputs, rule, trace)
    if first_fit is not None and inputs.target_is_default:
        return first_fit[0], first_fit[1], trace, True
    raise PlanError(_no_fit_message(inputs, trace, best_failed, first_fit, placement_failures))


def _no_fit_message(inputs, trace, best_failed, first_fit, placement_failures):
    spec = inputs.spec
    per_gpu = inputs.gpu_memory_bytes * (inputs.gpu_memory_utilization if inputs.device == "cuda" else 1)
    where = (
        f"{spec['name']} ({spec['weights_gib']} GiB of weights, {spec['params'] / 1e9:.1f}B params) on "
        f"{inputs.n_nodes} node(s) x {inputs.gpus_per_node} x {inputs.gpu_name}"
    )
    budget = (
        f"usable {gib(per_gpu)} GiB per GPU, {gib(per_gpu * inputs.gpus_per_node)} GiB per node, "
        f"{gib(per_gpu * inputs.gpus_per_node * inputs.n_nodes)} GiB in the cluster"
    )
    if inputs.device == "cuda":
        budget += f" at gpu_memory_utilization {inputs.gpu_memory_utilization}"
    pins = ", ".join(f"{k}={v}" for k, v in sorted(inputs.pins.items()))
    pinned = f" with {pins}" if pins else ""
    if first_fit is not None:
        cand, ev = max(((c, e) for c, e in trace if e["fits"]), key=lambda ce: ce[1]["concurrency"])
        want = f"{inputs.concurrency_target:g} concurrent requests"
        if inputs.kv_tokens_target is not None:
            want += f" and {inputs.kv_tokens_target:,} KV tokens"
        return (
            f"no layout{pinned} meets the target for {where}: it asks for {want} at max_model_len "
            f"{inputs.max_model_len:,}; the best, {cand.label()}, holds {ev['tokens']:,} tokens = "
            f"{ev['concurrency']:.1f} concurrent ({budget})"
        )
    if best_failed is not None:
        cand, ev = best_failed
        return f"no layout{pinned} fits {where}: {budget}; the smallest per-GPU need, {cand.label()}, is {ev['why']}"
    if placement_failures:
        cand = placement_failures[0]
        return (
            f"no layout{pinned} can be placed for {where}: {cand.label()} needs "
            f"{cand.world * cand.dp} GPUs in whole-node groups; the cluster has {inputs.n_nodes} x {inputs.gpus_per_node}"
        )
    return f"no layout{pinned} satisfies vLLM's rules for {where} (heads {spec['heads']}, KV heads {spec['kv_heads']})"


# --------------------------------------------------------------------------- fits one GPU: DP, not TP over PCIe


def _one_gpu_rule_applies(inputs, single_ev):
    """The seed's "fits, but not enough": TP=1 holds the weights and a full request, but not the target.

    Dense models on CUDA whose DP size the overrides leave open. MoE models keep their EP + DP branch
    (their DP ranks share one world, not independent replicas); the CPU platform keeps its TP/PP path.
    """
    return (
        inputs.device == "cuda"
        and not inputs.spec["is_moe"]
        and "dp" not in inputs.pins
        and single_ev["fits"]
        and not single_ev["meets_target"]
    )


def replicas_needed(inputs, ev):
    """TP=1 replicas whose combined KV cache holds the target: concurrency and, when given, KV tokens."""
    need = math.ceil(inputs.concurrency_target / ev["concurrency"] - 1e-9)
    if inputs.kv_tokens_target is not None:
        need = max(need, math.ceil(inputs.kv_tokens_target / ev["tokens"]))
    return max(need, 2)


def _placed_replicas(inputs, counts):
    for count in counts:
        trial = Candidate(1, 1, count, False, 1, 1, False, "dp_replicas")
        if place(inputs, trial):
            return trial
    return None


def replicas_for_target(inputs, rule, trace):
    """Answer the target with DP replicas of TP=1, or say why not (choose's return value).

    The fewest replicas whose KV caches together hold the target, rounded up until they split evenly
    over whole nodes. An explicit target they cannot reach, or a launch mode without replicas, is an
    error that names the override that overrules the rule; the default target falls back to as many
    replicas as the cluster places (default target missed), or to one replica.
    """
    single, single_ev = rule["single"]
    need = replicas_needed(inputs, single_ev)
    total = inputs.n_nodes * inputs.gpus_per_node
    rule.update(need=need, answer="dp", refusal=None, rounded=False, short=False)
    inputs.one_gpu_rule = rule
    each = f"{single_ev['concurrency']:.1f} concurrent"
    if inputs.kv_tokens_target is not None:
        each += f", {single_ev['tokens']:,} KV tokens"
    unmet = f"{_target_text(inputs)} needs {need} replicas of TP=1 ({each} each)"
    grown = _placed_replicas(inputs, range(need, total + 1))
    if grown is None:
        if not inputs.target_is_default:
            raise PlanError(
                f"{unmet} = {need} GPUs spread evenly over whole nodes; the cluster has {inputs.n_nodes} x "
                f"{inputs.gpus_per_node}{_avoided_note(rule)}"
            )
        grown = _placed_replicas(inputs, range(total, 1, -1))
        rule["short"] = True
    refusal = inputs.mode.refuse_replicas(unmet) if grown is not None else None
    if refusal and not inputs.target_is_default:
        raise PlanError(f"{refusal}{_avoided_note(rule)}")
    if grown is None or refusal:
        rule.update(answer="single", refusal=refusal)
        return single, single_ev, trace, True
    rule.update(dp=grown.dp, rounded=grown.dp > need and not rule["short"])
    return grown, evaluate(inputs, grown), trace, rule["short"]


def _target_text(inputs):
    return f"the {'default ' if inputs.target_is_default else ''}target of {target_words(inputs, 'concurrent')}"


def target_words(inputs, unit):
    """The target in words: the concurrency (unless only KV tokens were asked), the KV tokens when asked."""
    parts = []
    if inputs.kv_tokens_target is None or inputs.concurrency_target != 1:
        parts.append(f"{inputs.concurrency_target:g} {unit}")
    if inputs.kv_tokens_target is not None:
        parts.append(f"{inputs.kv_tokens_target:,} KV tokens")
    return " and ".join(parts)


def _avoided_note(rule):
    """Why an error offers no TP: the rule's reason, and the override that overrules it."""
    if rule["nvlink"]:
        if rule["tried"]:
            return " (TP inside the node does not reach it either; pin overrides.tp and pp for TP x PP)"
        return ""
    if any(cand.tp > 1 for cand in rule["avoided"]):
        return " (TP over PCIe avoided: the GPUs share no NVLink; pin overrides.tp to plan it anyway)"
    return ""


# --------------------------------------------------------------------------- Q2: throughput


def _hbm_bandwidth(inputs):
    if inputs.device != "cuda":
        return None
    name = inputs.gpu_name.upper()
    for key, value in HBM_TB_PER_S:
        if key in name:
            return value
    return None


def _replica_throughput(inputs, ev):
    """One replica's tokens/s and the sentence on where it comes from; (None, None) when it cannot be estimated."""
    if inputs.replica_throughput is not None:
        per_replica = inputs.replica_throughput
        return per_replica, f"the measured baseline of {per_replica:,.0f} tok/s per replica"
    bandwidth = _hbm_bandwidth(inputs)
    if bandwidth is None:
        return None, None
    tpot = ev["weights_max"] / (bandwidth * 1e12) * DECODE_SLOWDOWN
    batch = min(ESTIMATE_CONCURRENCY, max(ev["concurrency"], 1.0))
    per_replica = batch / tpot
    return per_replica, (
        f"an estimate of {per_replica:,.0f} tok/s per replica ({batch:.0f} concurrent requests, "
        f"{DECODE_SLOWDOWN}x the {bandwidth} TB/s weight-streaming roofline; measure it and pass "
        "replica_throughput_tok_s)"
    )


def _no_estimate(inputs):
    return (f"the planner cannot estimate one replica's throughput on {inputs.gpu_name!r} ({inputs.device}): "
            "measure the single-replica baseline (the seed's step 0) and pass replica_throughput_tok_s")


def _throughput_dp(inputs, ev):
    """Replicas needed for the throughput need: (dp, sentence on the per-replica figure)."""
    need = inputs.throughput_need
    per_replica, source = _replica_throughput(inputs, ev)
    if per_replica is None:
        raise PlanError(
            f"{inputs.request.setting('targets.throughput_need_tok_s', f'{need:,.0f}')} but {_no_estimate(inputs)}")
    return max(1, math.ceil(need / per_replica)), source


def _pinned_dp_against_need(inputs, cand, ev):
    """Q2 under a pinned DP: the pin sizes the replicas; (sentence, warning or None) say what the need asks."""
    pin = inputs.request.setting("overrides.dp", cand.dp)
    need = (f"the throughput need of {inputs.throughput_need:,.0f} tok/s "
            f"({inputs.request.setting('targets.throughput_need_tok_s', f'{inputs.throughput_need:g}')})")
    question = "Q2 Is the pinned replica fast enough?" if cand.dp == 1 else \
        f"Q2 Are the {cand.dp} pinned replicas fast enough?"
    per_replica, source = _replica_throughput(inputs, ev)
    if per_replica is None:
        return (f"{question} Not checked: {pin} sizes the replicas and {_no_estimate(inputs)}.",
                f"The pinned {pin} decides the replicas; {need} was not checked against it: {_no_estimate(inputs)}.")
    dp = max(1, math.ceil(inputs.throughput_need / per_replica))
    if dp <= cand.dp:
        return (f"{question} Yes: {inputs.throughput_need:,.0f} tok/s needed, {source}: "
                f"{dp} replica{'s' if dp > 1 else ''} would do."), None
    sentence = (f"{question} No: {inputs.throughput_need:,.0f} tok/s needed, {source}: {dp} replicas would do, but "
                f"{pin} is pinned and wins over the need.")
    warning = (f"The pinned {pin} overrides {need}: the need asks for {dp} replicas, {cand.dp} "
               f"{'is' if cand.dp == 1 else 'are'} planned.")
    return sentence, warning


def scale_for_throughput(inputs, cand, ev):
    """The seed's Q2: (candidate, evaluation, sentence or None) with DP replicas for the throughput need."""
    if inputs.throughput_need is None:
        return cand, ev, None
    if cand.ep_on:
        return cand, ev, ("Q2 (throughput): EP + DP already spreads requests over every DP rank; "
                          "measure it with the fixed benchmark.")
    if "dp" in inputs.pins:
        sentence, inputs.pinned_dp_warning = _pinned_dp_against_need(inputs, cand, ev)
        return cand, ev, sentence
    dp, source = _throughput_dp(inputs, ev)
    need_text = inputs.request.setting("targets.throughput_need_tok_s", f"{inputs.throughput_need:,.0f}")
    if dp <= 1:
        return cand, ev, f"Q2 Is one replica fast enough? Yes: {inputs.throughput_need:,.0f} tok/s needed, {source}."
    if dp <= cand.dp:
        return cand, ev, (
            f"Q2 Are the {cand.dp} replicas fast enough? Yes: {inputs.throughput_need:,.0f} tok/s needed, {source}: "
            f"{dp} replicas would do."
        )
    refusal = inputs.mode.refuse_replicas(f"{need_text} needs {dp} replicas ({source})")
    if refusal:
        raise PlanError(refusal)
    if inputs.device == "cpu" and inputs.spec["is_moe"]:
        raise PlanError(f"throughput needs {dp} replicas of a MoE model: MoE data parallel fails on the CPU platform")
    grown = None
    for count in range(dp, inputs.n_nodes * inputs.gpus_per_node // cand.world + 1):
        trial = Candidate(cand.tp, cand.pp, count, False, cand.r, cand.local, cand.tp_across, cand.step)
        if place(inputs, trial):
            grown = trial
            break
    if grown is None:
        replica = Candidate(cand.tp, cand.pp, 1, False, cand.r, cand.local, cand.tp_across, cand.step)
        raise PlanError(
            f"{need_text} needs {dp} replicas of {replica.label()} ({source}) = {dp * cand.world} GPUs spread "
            f"evenly over whole nodes; the cluster has {inputs.n_nodes} x {inputs.gpus_per_node}"
        )
    rounded = (
        f" (rounded up from {dp} so the replicas split evenly over {grown.nnodes} nodes)" if grown.dp > dp else ""
    )
    balancer = "a load balancer" if inputs.independent_replicas(grown) else "vLLM's load balancer"
    return grown, evaluate(inputs, grown), (
        f"Q2 Is one replica fast enough? No: {inputs.throughput_need:,.0f} tok/s needed, {source}: "
        f"{grown.dp} DP replicas{rounded} behind {balancer}."
    )


# --------------------------------------------------------------------------- after the choice


def settle(inputs, cand):
    """What the chosen layout decides: identical nodes, the CPU's eager default, EPLB."""
    spec = inputs.spec
    used = inputs.nodes[: cand.nnodes]
    for node in used[1:]:
        if node["gpus"] != used[0]["gpus"]:
            raise PlanError(
                f"nodes {used[0]['name']} and {node['name']} of one deployment differ: {used[0]['gpus']} vs "
                f"{node['gpus']} (nodes of one replica must be identical: GPU model, count, memory)"
            )
    if inputs.device == "cpu":
        if inputs.enforce_eager_given and cand.pp > 1:
            raise PlanError(
                f"{inputs.request.label('enforce_eager')} with PP={cand.pp} on the CPU platform: the first request "
                "crashes (intermediate tensors are never allocated); leave enforce_eager unset"
            )
        if inputs.enforce_eager_given is None:
            inputs.enforce_eager = cand.pp == 1
    eplb = inputs.request.label("enable_eplb")
    if cand.ep_on:
        ep = cand.tp * cand.dp
        even = spec["experts"] % ep == 0
        if inputs.enable_eplb:
            if not even:
                raise PlanError(
                    f"{eplb}: EPLB currently only supports even distribution of experts across ranks. "
                    f"Got {spec['experts']} experts and {ep} EP ranks."
                )
            inputs.eplb = True
        elif inputs.enable_eplb is None:
            inputs.eplb = even
            if not even:
                inputs.eplb_disabled_reason = (
                    f"EPLB left off: {spec['experts']} experts do not split evenly over EP={ep} ranks."
                )
    elif inputs.enable_eplb:
        raise PlanError(f"{eplb} needs expert parallel (enable_expert_parallel must be True to use EPLB)")
