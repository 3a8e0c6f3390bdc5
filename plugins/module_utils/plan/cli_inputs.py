"""What ``bin/vllm-cluster`` checks before the planner sees a flag: bounds, unit slips, text, its catalog and version.

The planner (plan/inputs.py) checks what every caller gives it; a command line
meets other mistakes: a value typed in the wrong unit (``--gpu-memory-gib
81920``: MiB), a number no cluster has (``--nodes 1000000``), ``nan``, ``inf``,
an empty or very long string. Here every number has bounds, each error names
the flag, the value and what is expected, and a value that looks like the
wrong unit gets a warning or, above the bound, an error that says which unit
it looks like.

Pure Python, no Ansible import.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass

from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import model_catalog
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan import model_config as mc
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.checks import PlanError

MAX_NODES = 4096
MAX_GPUS_PER_NODE = 64
MAX_GPU_MEMORY_GIB = 1024  # no accelerator (or CPU worker) is planned with more than 1 TiB
LARGEST_GPU_GIB = 288  # the largest GPUs hold 288 GB; more per GPU is a node's total or a unit slip
MAX_RANKS = MAX_NODES * MAX_GPUS_PER_NODE
SHORT_CONTEXT = 128  # --max-model-len at or below this looks like thousands of tokens
SHOWN = 40  # characters of a value quoted in an error


@dataclass(frozen=True)
class Bound:
    """One numeric flag: ``kind`` int or number, ``low`` (excluded when ``low_open``) to ``high``."""

    flag: str
    kind: str
    low: float
    high: float
    low_open: bool = False
    unit: str = ""  # "GiB": a value in MiB or bytes gets a hint

    def expected(self):
        unit = f" {self.unit}" if self.unit else ""
        if self.kind == "int":
            return f"an integer from {_number(self.low)} to {_number(self.high)}{unit}"
        low = f"> {_number(self.low)}" if self.low_open else f">= {_number(self.low)}"
        return f"a number {low} and <= {_number(self.high)}{unit}"

    def contains(self, value):
        above_low = value > self.low if self.low_open else value >= self.low
        return above_low and value <= self.high


BOUNDS = {bound.flag: bound for bound in (
    Bound("--nodes", "int", 1, MAX_NODES),
    Bound("--gpus-per-node", "int", 1, MAX_GPUS_PER_NODE),
    Bound("--gpu-memory-gib", "number", 0, MAX_GPU_MEMORY_GIB, low_open=True, unit="GiB"),
    Bound("--max-model-len", "int", 1, 2**24, unit="tokens"),
    Bound("--gpu-memory-utilization", "number", 0, 1, low_open=True),
    Bound("--kv-tokens-target", "int", 1, 10**10, unit="tokens"),
    Bound("--concurrency-target", "number", 0, 10**6, low_open=True, unit="requests"),
    Bound("--throughput-need", "number", 0, 10**9, low_open=True, unit="tokens/s"),
    Bound("--replica-throughput", "number", 0, 10**9, low_open=True, unit="tokens/s"),
    Bound("--tp", "int", 1, MAX_RANKS),
    Bound("--pp", "int", 1, MAX_RANKS),
    Bound("--dp", "int", 1, MAX_RANKS),
    Bound("--ep", "int", 1, MAX_RANKS),
    Bound("--cpu-kvcache-space-gib", "int", 1, MAX_GPU_MEMORY_GIB, unit="GiB"),
    Bound("--cpu-cores-per-node", "int", 1, 4096),
    Bound("--weights-gib", "number", 0, 65536, low_open=True, unit="GiB"),
    Bound("--kv-bytes-per-token", "int", 1, 2**30, unit="bytes"),
)}
# vLLM flags the planner models (plan/serve_args.py MODELLED): their numbers get bounds too.
SERVE_ARG_BOUNDS = {
    "max-num-seqs": Bound("max-num-seqs", "int", 1, 2**20),
    "max-num-batched-tokens": Bound("max-num-batched-tokens", "int", 1, 2**26),
    "block-size": Bound("block-size", "int", 1, 1024),
    "cpu-offload-gb": Bound("cpu-offload-gb", "number", 0, 65536),
}
# Any other number given to a vLLM flag: what a 64-bit integer holds.
SERVE_ARG_LIMIT = 2**63 - 1
# The longest text each flag takes (a path: PATH_MAX; a host name: 253; the rest: 255).
TEXT_LIMITS = {"--model": 4096, "--model-path": 4096, "--serve-arg": 4096, "--addresses": 253}
TEXT_LIMIT = 255
UNITS = {"b": 1024**-3, "k": 1024**-2, "kb": 1000 / 1024**3, "kib": 1024**-2, "m": 1024**-1, "mb": 1e6 / 1024**3,
         "mib": 1024**-1, "g": 1.0, "gb": 1e9 / 1024**3, "gib": 1.0, "t": 1024.0, "tb": 1e12 / 1024**3,
         "tib": 1024.0}
# Token counts as vLLM's own flags take them (arg_utils' human_readable_int): lower case decimal, upper case binary.
TOKEN_UNITS = {"k": 1000, "K": 1024, "m": 10**6, "M": 2**20}
INTEGER = re.compile(r"[+-]?\d{1,30}")
NUMBER = re.compile(r"[+-]?(\d{1,30}\.?\d{0,30}|\.\d{1,30})([eE][+-]?\d{1,4})?")
WITH_UNIT = re.compile(r"(?P<number>[+-]?(\d+\.?\d*|\.\d+))\s*(?P<unit>[a-zA-Z]{1,3})")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _number(value):
    """1024 -> 1,024; 0.5 -> 0.5; 80.0 -> 80."""
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.4g}" if abs(value) >= 1 else f"{value:.4g}"
    return f"{int(value):,}"


def shown(text):
    """A value as an error quotes it: at most SHOWN characters; quoted when empty or with spaces or controls."""
    text = str(text)
    head, tail = (text[:SHOWN], f"... ({len(text):,} characters)") if len(text) > SHOWN else (text, "")
    if not head or CONTROL.search(head) or re.search(r"\s", head):
        head = repr(head)
    return head + tail


def _plain(value):
    """81920.0 -> 81920, 79.6484 -> 79.65: a number as a user types it."""
    value = round(value, 2)
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e16 else f"{value:g}"


def _gib_hint(value, high=MAX_GPU_MEMORY_GIB):
    """A GiB value that looks like MiB or bytes (and is then at most ``high`` GiB): the sentence, else None."""
    for divisor, unit in ((1024**3, "bytes"), (1024, "MiB")):
        if value >= divisor and value / divisor <= high:
            return f"looks like {unit}: {_plain(value / divisor)} GiB?"
    return None


def _hint(bound, value):
    if bound.unit == "GiB":
        hint = _gib_hint(value, bound.high)
        if hint:
            return f"{_plain(value)} GiB {'per GPU ' if bound.flag == '--gpu-memory-gib' else ''}{hint}"
    if bound.flag == "--gpu-memory-utilization" and 1 < value <= 100:
        return f"looks like a percentage: {_plain(value / 100)}?"
    return None


def parse(flag, text):
    """The value of numeric flag ``flag`` given as ``text``; a PlanError names the flag, the value, the bounds."""
    bound = BOUNDS[flag]
    stripped = text.strip()
    pattern = INTEGER if bound.kind == "int" else NUMBER
    if not pattern.fullmatch(stripped):
        suffix = WITH_UNIT.fullmatch(stripped)
        if suffix and bound.unit == "GiB" and suffix["unit"].lower() in UNITS:
            gib = float(suffix["number"]) * UNITS[suffix["unit"].lower()]
            raise PlanError(f"{flag} {shown(text)}: give the number alone, in GiB: {flag} {_plain(gib)}")
        if suffix and bound.unit == "tokens" and suffix["unit"] in TOKEN_UNITS:
            tokens = float(suffix["number"]) * TOKEN_UNITS[suffix["unit"]]
            raise PlanError(f"{flag} {shown(text)}: give the number alone, in tokens: {flag} {_plain(tokens)}")
        what = "an integer" if bound.kind == "int" else "a number"
        raise PlanError(f"{flag} {shown(text)}: not {what}; expected {bound.expected()}")
    value = int(stripped) if bound.kind == "int" else float(stripped)
    if not math.isfinite(value) or not bound.contains(value):
        hint = _hint(bound, value) if math.isfinite(value) else None
        raise PlanError(f"{flag} {shown(text)}: expected {bound.expected()}" + (f"; {hint}" if hint else ""))
    return value


def text(flag, value):
    """A text flag's value: not empty, one line, not longer than its limit."""
    limit = TEXT_LIMITS.get(flag, TEXT_LIMIT)
    if not value.strip():
        raise PlanError(f"{flag} {shown(value)}: expected a non-empty value")
    if CONTROL.search(value):
        raise PlanError(f"{flag} {shown(value)}: control characters (a newline, a tab, ...) are not allowed")
    if len(value) > limit:
        raise PlanError(f"{flag} {shown(value)}: expected at most {limit:,} characters")
    return value


def addresses(value, nodes):
    """``--addresses a,b,c`` for ``nodes`` nodes: one non-empty address per node."""
    items = [item.strip() for item in value.split(",")]
    if any(not item for item in items):
        raise PlanError(f"--addresses {shown(value)}: an empty address; expected one address per node "
                        f"(--nodes {nodes}), comma-separated")
    for item in items:
        text("--addresses", item)
    if len(items) != nodes:
        raise PlanError(f"--addresses {shown(value)}: {len(items)} address{'es' if len(items) != 1 else ''} for "
                        f"--nodes {nodes}; expected one per node")
    return items


def serve_args(values):
    """Bounds on the numbers of ``--serve-arg KEY=VALUE`` (already read by plan/serve_args.py parse_cli)."""
    for key, value in (values or {}).items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        bound = SERVE_ARG_BOUNDS.get(str(key).replace("_", "-"))
        where = f"--serve-arg {shown(f'{key}={value}')}"
        if not math.isfinite(value):
            raise PlanError(f"{where}: expected a finite number")
        if bound and not bound.contains(value):
            raise PlanError(f"{where}: expected {bound.expected()}")
        if abs(value) > SERVE_ARG_LIMIT:
            raise PlanError(f"{where}: expected a number from {-SERVE_ARG_LIMIT:,} to {SERVE_ARG_LIMIT:,}")
    return values


def overrides_fit(values):
    """``--tp/--pp/--dp`` (or ``--ep``) that need more GPUs than ``--nodes`` x ``--gpus-per-node``: a PlanError.

    The planner refuses the same (plan/layout.py); here the error names the flags the user typed.
    """
    pinned = [flag for flag in ("--tp", "--pp", "--dp") if values.get(flag) is not None]
    if (values.get("--ep") or 1) > 1:
        pinned = ["--ep"]
    need = math.prod(values[flag] for flag in pinned)
    nodes, gpus = values.get("--nodes", 1), values.get("--gpus-per-node", 1)
    if pinned and need > nodes * gpus:
        given = " ".join(f"{flag} {values[flag]}" for flag in pinned)
        raise PlanError(f"{given} need{'s' if len(pinned) == 1 else ''} {need:,} GPUs; the cluster has --nodes {nodes} "
                        f"x --gpus-per-node {gpus} = {nodes * gpus:,}")


def warnings(values, device="cuda"):
    """Values in bounds that still look like a slip: ``{flag: value}`` -> sentences for stderr and the plan."""
    found = []
    memory = values.get("--gpu-memory-gib")
    gpus = values.get("--gpus-per-node") or 1
    if memory is not None:
        hint = _gib_hint(memory)
        if hint:
            found.append(f"--gpu-memory-gib {_plain(memory)}: {_plain(memory)} GiB per GPU {hint}")
        elif device == "cuda" and memory > LARGEST_GPU_GIB:
            per_gpu = f"; per GPU, not per node: {_plain(memory / gpus)} GiB?" if gpus > 1 else ""
            found.append(f"--gpu-memory-gib {_plain(memory)}: more than any GPU holds ({LARGEST_GPU_GIB} GB at "
                         f"most){per_gpu}")
    length = values.get("--max-model-len")
    if length is not None and length <= SHORT_CONTEXT:
        found.append(f"--max-model-len {length}: {length} tokens per request looks like thousands of tokens: "
                     f"{length * 1024}?")
    return found


# --------------------------------------------------------------------------- the catalog


def _params(count):
    return f"{count / 1e9:.1f}B" if count < 1e12 else f"{count / 1e12:.2f}T"


def _context(tokens):
    return f"{tokens // 1024}K" if tokens and tokens % 1024 == 0 else f"{tokens:,}" if tokens else "-"


def catalog_rows():
    """One mapping per catalog model: what ``vllm-cluster models`` prints, computed as the planner sees it."""
    rows = []
    for name in model_catalog.catalog_names():
        spec = mc.load_model(name)
        entry = model_catalog.CATALOG[name]
        rows.append({
            "name": name,
            "hub_id": entry["hf_id"],
            "aliases": sorted(entry.get("short_aliases", {})),
            "params": spec["params"],
            "weights_gib": spec["weights_gib"],
            "dtype": spec["quantization"] or spec["dtype"],
            "context": spec["max_position_embeddings"],
            "experts": spec["experts"],
            "experts_per_token": spec["experts_per_token"],
        })
    return rows


def catalog_table(rows):
    """The rows as an aligned table."""
    header = ("NAME", "HUB ID", "PARAMS", "WEIGHTS", "DTYPE", "CONTEXT", "EXPERTS")
    lines = [header]
    for row in rows:
        experts = f"{row['experts']} ({row['experts_per_token']} active)" if row["experts"] else "-"
        name = row["name"] + (f" (also {', '.join(row['aliases'])})" if row["aliases"] else "")
        lines.append((name, row["hub_id"], _params(row["params"]), f"{row['weights_gib']:.1f} GiB", row["dtype"],
                      _context(row["context"]), experts))
    widths = [max(len(line[column]) for line in lines) for column in range(len(header))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in lines]


# --------------------------------------------------------------------------- the version


def collection_version(root):
    """The version of the collection at ``root``: galaxy.yml (a checkout), else MANIFEST.json (installed)."""
    galaxy = os.path.join(root, "galaxy.yml")
    if os.path.isfile(galaxy):
        with open(galaxy, encoding="utf-8") as handle:
            for line in handle:
                match = re.match(r"""version:\s*["']?([^"'\s#]+)""", line)
                if match:
                    return match.group(1)
    manifest = os.path.join(root, "MANIFEST.json")
    if os.path.isfile(manifest):
        with open(manifest, encoding="utf-8") as handle:
            try:
                version = json.load(handle).get("collection_info", {}).get("version")
            except (ValueError, AttributeError):
                version = None
        if isinstance(version, str) and version:
            return version
    return "unknown"
