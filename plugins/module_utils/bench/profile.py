"""The fixed load profile of `vllm bench serve`: validation, argv, and comparison.

The seed's rule: every stage is measured under one fixed load ("same load, same
parameters: the concurrency and the request length distribution must be fixed,
otherwise every later comparison is noise"). A profile is one dict, stored in the
inventory (``vllm_benchmark_profile``) and saved with every stage result, so two
stages can be compared only when their profiles are equal, field by field.

Flags and defaults are those of vLLM 0.32.0's ``vllm bench serve``
(vllm/benchmarks/serve.py and datasets/datasets.py); ``--input-len`` and
``--output-len`` are its generic aliases of ``--random-input-len`` /
``--random-output-len`` (and of the other datasets' output lengths).

Pure Python, no Ansible import.
"""
from __future__ import annotations

import hashlib
import json
import math

# The seed's production profile (section 2: 1000 prompts, 20 requests/s, 64 at
# once) on the random dataset with fixed lengths (range ratio 0 and ignore_eos,
# so every request has exactly input_len / output_len tokens), a fixed seed and
# greedy sampling. The lengths are vLLM's defaults for the random dataset.
DEFAULT_PROFILE = {
    "backend": "vllm",
    "endpoint": "/v1/completions",
    "dataset_name": "random",
    "dataset_path": None,
    "input_len": 1024,
    "output_len": 128,
    "range_ratio": 0.0,
    "prefix_len": 0,
    "num_prompts": 1000,
    "request_rate": 20.0,
    "burstiness": 1.0,
    "max_concurrency": 64,
    "seed": 0,
    "ignore_eos": True,
    "temperature": 0.0,
    "num_warmups": 0,
    "percentile_metrics": ["ttft", "tpot", "itl", "e2el"],
    "metric_percentiles": [50, 90, 99],
}

# What the verdict reads: P50 and P99 of TTFT and TPOT.
REQUIRED_METRICS = ("ttft", "tpot")
REQUIRED_PERCENTILES = (50, 99)

BACKENDS = ("vllm", "openai", "openai-chat")
ENDPOINTS = {"vllm": "/v1/completions", "openai": "/v1/completions", "openai-chat": "/v1/chat/completions"}
# Datasets that need no download: random is generated from the tokenizer's
# vocabulary; sharegpt and custom read a file already on the benchmark host.
DATASETS = ("random", "sharegpt", "custom")
PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")


class ProfileError(ValueError):
    """A load profile that `vllm bench serve` cannot run or the verdict cannot judge."""


class ProfileMismatchError(ValueError):
    """Two stages measured under different loads: comparing them would be noise."""

    def __init__(self, message: str, differences: list[dict]):
        super().__init__(message)
        self.differences = differences


def _integer(name: str, value, minimum: int, allow_none: bool = False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ProfileError(f"load profile field {name} must be an integer >= {minimum}, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise ProfileError(f"load profile field {name} must be an integer >= {minimum}, got {value!r}") from None
    if not number.is_integer() or number < minimum:
        raise ProfileError(f"load profile field {name} must be an integer >= {minimum}, got {value!r}")
    return int(number)


def _real(name: str, value, minimum: float, maximum: float | None = None, strict: bool = False):
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ProfileError(f"load profile field {name} must be a number, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise ProfileError(f"load profile field {name} must be a number, got {value!r}") from None
    low_ok = number > minimum if strict else number >= minimum
    if not math.isfinite(number) or not low_ok or (maximum is not None and number > maximum):
        bound = f"> {minimum}" if strict else f">= {minimum}"
        upper = f" and <= {maximum}" if maximum is not None else ""
        raise ProfileError(f"load profile field {name} must be a number {bound}{upper}, got {value!r}")
    return number


def _request_rate(value):
    """'inf' (all requests at t=0, vLLM's default) or a positive rate in requests/s."""
    if isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
        return "inf"
    if isinstance(value, float) and math.isinf(value) and value > 0:
        return "inf"
    return _real("request_rate", value, 0.0, strict=True)


def _name_list(name: str, value, allowed) -> list[str]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items:
        raise ProfileError(f"load profile field {name} must be a list such as {list(allowed)}, got {value!r}")
    result = []
    for item in items:
        text = str(item).strip().lower()
        if text not in allowed:
            raise ProfileError(f"load profile field {name} holds {item!r}; allowed: {', '.join(allowed)}")
        if text not in result:
            result.append(text)
    return result


def _percentiles(value) -> list:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items:
        raise ProfileError(f"load profile field metric_percentiles must be a list such as [50, 90, 99], got {value!r}")
    result = []
    for item in items:
        number = _real("metric_percentiles", item, 0.0, 100.0, strict=True)
        number = int(number) if float(number).is_integer() else number
        if number not in result:
            result.append(number)
    return sorted(result)


def normalize_profile(profile: dict | None) -> dict:
    """A complete, canonical profile: defaults filled in, types fixed, everything checked.

    Fields left out take the seed's production values (DEFAULT_PROFILE). Unknown
    fields are an error (a typo would otherwise silently fall back to a default).
    """
    if profile is None:
        profile = {}
    if not isinstance(profile, dict):
        raise ProfileError(f"the load profile must be a mapping of field: value, got {type(profile).__name__}")
    unknown = sorted(set(profile) - set(DEFAULT_PROFILE))
    if unknown:
        raise ProfileError(
            f"unknown load profile field(s) {', '.join(unknown)}; known: {', '.join(DEFAULT_PROFILE)}"
        )
    merged = {**DEFAULT_PROFILE, **profile}
    out: dict = {}
    backend = str(merged["backend"]).strip()
    if backend not in BACKENDS:
        raise ProfileError(f"load profile field backend is {backend!r}; supported: {', '.join(BACKENDS)}")
    out["backend"] = backend
    endpoint = merged["endpoint"]
    if endpoint is None or (backend == "openai-chat" and "endpoint" not in profile):
        endpoint = ENDPOINTS[backend]
    if not isinstance(endpoint, str) or not endpoint.startswith("/"):
        raise ProfileError(f"load profile field endpoint must be a path such as /v1/completions, got {endpoint!r}")
    out["endpoint"] = endpoint
    dataset = str(merged["dataset_name"]).strip().lower()
    if dataset not in DATASETS:
        raise ProfileError(f"load profile field dataset_name is {dataset!r}; supported: {', '.join(DATASETS)}")
    out["dataset_name"] = dataset
    path = merged["dataset_path"]
    if dataset == "random":
        if path not in (None, ""):
            raise ProfileError(f"load profile field dataset_path must be empty for the random dataset, got {path!r}")
        out["dataset_path"] = None
        out["input_len"] = _integer("input_len", merged["input_len"], 1)
        out["output_len"] = _integer("output_len", merged["output_len"], 1)
        out["range_ratio"] = _real("range_ratio", merged["range_ratio"], 0.0, 1.0)
        out["prefix_len"] = _integer("prefix_len", merged["prefix_len"], 0)
    else:
        if not isinstance(path, str) or not path.strip():
            raise ProfileError(f"the {dataset} dataset needs dataset_path (a file on the benchmark host)")
        out["dataset_path"] = path
        # Prompt lengths come from the dataset; only the output length can be pinned.
        if "input_len" in profile and profile["input_len"] is not None:
            raise ProfileError(f"load profile field input_len does not apply to the {dataset} dataset: leave it out")
        out["input_len"] = None
        out["output_len"] = _integer("output_len", profile.get("output_len"), 1, allow_none=True)
        out["range_ratio"] = None
        out["prefix_len"] = None
    out["num_prompts"] = _integer("num_prompts", merged["num_prompts"], 1)
    out["request_rate"] = _request_rate(merged["request_rate"])
    out["burstiness"] = _real("burstiness", merged["burstiness"], 0.0, strict=True)
    out["max_concurrency"] = _integer("max_concurrency", merged["max_concurrency"], 1, allow_none=True)
    out["seed"] = _integer("seed", merged["seed"], 0)
    if not isinstance(merged["ignore_eos"], bool):
        raise ProfileError(f"load profile field ignore_eos must be true or false, got {merged['ignore_eos']!r}")
    out["ignore_eos"] = merged["ignore_eos"]
    temperature = merged["temperature"]
    out["temperature"] = None if temperature is None else _real("temperature", temperature, 0.0)
    out["num_warmups"] = _integer("num_warmups", merged["num_warmups"], 0)
    metrics = _name_list("percentile_metrics", merged["percentile_metrics"], PERCENTILE_METRICS)
    missing = [m for m in REQUIRED_METRICS if m not in metrics]
    if missing:
        raise ProfileError(
            f"load profile field percentile_metrics {metrics} lacks {', '.join(missing)}: the verdict compares "
            "TTFT and TPOT"
        )
    out["percentile_metrics"] = metrics
    percentiles = _percentiles(merged["metric_percentiles"])
    lacking = [p for p in REQUIRED_PERCENTILES if p not in percentiles]
    if lacking:
        raise ProfileError(
            f"load profile field metric_percentiles {percentiles} lacks {', '.join(map(str, lacking))}: the verdict "
            "compares P50 and P99"
        )
    out["metric_percentiles"] = percentiles
    return out


def _flag_number(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value)) if abs(value) < 1e15 else repr(value)
    return str(value)


def bench_argv(profile: dict, base_url: str, model: str, tokenizer: str | None = None, *,
               result_dir: str, result_filename: str, vllm: str = "vllm", label: str | None = None,
               ready_check_timeout_s: int = 0) -> list[str]:
    """The `vllm bench serve` command line for a profile.

    base_url: the server's API root, e.g. http://127.0.0.1:8000. model: the name
    the server serves (vllm serve's default: the model argument). tokenizer: a
    local directory or id the client can load offline (the bench tokenizes on the
    client); defaults to model. The result goes to result_dir/result_filename.
    """
    spec = normalize_profile(profile)
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise ProfileError(f"base_url must be an http(s) URL such as http://127.0.0.1:8000, got {base_url!r}")
    if not model:
        raise ProfileError("model must name the served model (the vllm serve model argument)")
    argv = [vllm, "bench", "serve",
            "--backend", spec["backend"], "--base-url", base_url.rstrip("/"), "--endpoint", spec["endpoint"],
            "--model", str(model), "--tokenizer", str(tokenizer or model),
            "--dataset-name", spec["dataset_name"]]
    if spec["dataset_path"]:
        argv += ["--dataset-path", spec["dataset_path"]]
    if spec["input_len"] is not None:
        argv += ["--input-len", str(spec["input_len"])]
    if spec["output_len"] is not None:
        argv += ["--output-len", str(spec["output_len"])]
    if spec["dataset_name"] == "random":
        argv += ["--random-range-ratio", _flag_number(spec["range_ratio"]),
                 "--random-prefix-len", str(spec["prefix_len"])]
    argv += ["--num-prompts", str(spec["num_prompts"]),
             "--request-rate", _flag_number(spec["request_rate"]),
             "--burstiness", _flag_number(spec["burstiness"])]
    if spec["max_concurrency"] is not None:
        argv += ["--max-concurrency", str(spec["max_concurrency"])]
    argv += ["--seed", str(spec["seed"])]
    if spec["ignore_eos"]:
        argv.append("--ignore-eos")
    if spec["temperature"] is not None:
        argv += ["--temperature", _flag_number(spec["temperature"])]
    argv += ["--num-warmups", str(spec["num_warmups"]),
             "--percentile-metrics", ",".join(spec["percentile_metrics"]),
             "--metric-percentiles", ",".join(_flag_number(p) for p in spec["metric_percentiles"])]
    if ready_check_timeout_s:
        argv += ["--ready-check-timeout-sec", str(int(ready_check_timeout_s))]
    if label:
        argv += ["--label", str(label)]
    argv += ["--disable-tqdm", "--save-result", "--result-dir", result_dir, "--result-filename", result_filename]
    return argv


def fingerprint(profile: dict) -> str:
    """A short digest of the normalized profile, to label runs made under the same load."""
    canonical = json.dumps(normalize_profile(profile), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def profile_differences(reference: dict, candidate: dict) -> list[dict]:
    """Fields whose values differ, after both are normalized: [{field, reference, candidate}]."""
    left, right = normalize_profile(reference), normalize_profile(candidate)
    return [
        {"field": field, "reference": left[field], "candidate": right[field]}
        for field in DEFAULT_PROFILE
        if left[field] != right[field]
    ]


def _show(value) -> str:
    if isinstance(value, list):
        return ",".join(_flag_number(v) for v in value)
    if value is None:
        return "unset"
    return _flag_number(value)


def describe_differences(differences: list[dict], reference_name: str, candidate_name: str) -> str:
    return ", ".join(
        f"{d['field']} ({reference_name}: {_show(d['reference'])}, {candidate_name}: {_show(d['candidate'])})"
        for d in differences
    )


def require_same_profile(reference: dict, candidate: dict, reference_name: str = "baseline",
                         candidate_name: str = "stage") -> None:
    """Refuse a comparison under different loads, naming every differing field."""
    differences = profile_differences(reference, candidate)
    if differences:
        raise ProfileMismatchError(
            f"stage {candidate_name!r} was measured under a different load profile than {reference_name!r}: "
            f"{describe_differences(differences, reference_name, candidate_name)}. Stages are compared only under "
            f"one fixed load: re-run {candidate_name!r} with the profile of {reference_name!r}, or record a new "
            "baseline under the new profile",
            differences,
        )


def result_disagreements(profile: dict, result: dict) -> list[dict]:
    """Fields of a saved `vllm bench serve` result that contradict the profile it claims.

    The saved JSON echoes num_prompts, request_rate ('inf' or a number),
    burstiness, max_concurrency and backend; a difference means the file was not
    produced by this profile.
    """
    spec = normalize_profile(profile)
    found = []
    echoed = {
        "backend": result.get("backend"),
        "num_prompts": result.get("num_prompts"),
        "request_rate": result.get("request_rate"),
        "burstiness": result.get("burstiness"),
        "max_concurrency": result.get("max_concurrency"),
    }
    for field, value in echoed.items():
        expected = spec[field]
        if field == "request_rate":
            same = (expected == "inf" and str(value).lower() == "inf") or (
                expected != "inf" and isinstance(value, int | float) and not isinstance(value, bool)
                and math.isclose(float(value), float(expected))
            )
        elif field == "burstiness":
            same = isinstance(value, int | float) and math.isclose(float(value), float(expected))
        else:
            same = value == expected
        if not same:
            found.append({"field": field, "profile": expected, "result": value})
    return found
