"""The fixed load profile: validation, the `vllm bench serve` argv, and the refusal to compare different loads."""
import json
from pathlib import Path

import pytest
import yaml
from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench import profile as bench_profile
from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench.profile import (
    DEFAULT_PROFILE,
    ProfileError,
    ProfileMismatchError,
    bench_argv,
    normalize_profile,
    profile_differences,
    require_same_profile,
    result_disagreements,
)

REPO = Path(__file__).resolve().parents[2]
# The load of the real saved result in tests/fixtures/bench (research run: 8 prompts, 32/16 tokens, 4 at once).
EXAMPLE_PROFILE = {"input_len": 32, "output_len": 16, "num_prompts": 8, "request_rate": "inf", "max_concurrency": 4}


def flags(argv):
    """{flag: value or True} of an argv after `vllm bench serve`."""
    parsed, index = {}, 3
    while index < len(argv):
        name = argv[index]
        if index + 1 < len(argv) and not argv[index + 1].startswith("--"):
            parsed[name] = argv[index + 1]
            index += 2
        else:
            parsed[name] = True
            index += 1
    return parsed


def test_role_defaults_carry_the_same_production_profile():
    defaults = yaml.safe_load((REPO / "roles/vllm_benchmark/defaults/main.yml").read_text())
    assert defaults["vllm_benchmark_profile"] == DEFAULT_PROFILE
    # The seed's load: 1000 prompts at 20 requests/s, 64 at once, fixed lengths and seed.
    assert normalize_profile({}) == normalize_profile(defaults["vllm_benchmark_profile"])
    assert (DEFAULT_PROFILE["num_prompts"], DEFAULT_PROFILE["request_rate"], DEFAULT_PROFILE["max_concurrency"]) == (
        1000, 20.0, 64)
    assert DEFAULT_PROFILE["percentile_metrics"] == ["ttft", "tpot", "itl", "e2el"]


def test_fields_left_out_take_the_production_values():
    profile = normalize_profile({"num_prompts": "100", "request_rate": "INF", "metric_percentiles": "99,50"})
    assert profile["num_prompts"] == 100 and profile["request_rate"] == "inf"
    assert profile["metric_percentiles"] == [50, 99]
    assert profile["input_len"] == 1024 and profile["max_concurrency"] == 64 and profile["seed"] == 0


@pytest.mark.parametrize(
    ("profile", "words"),
    [
        ({"num_prompt": 10}, ["unknown load profile field(s) num_prompt"]),
        ({"num_prompts": 0}, ["num_prompts", ">= 1", "0"]),
        ({"num_prompts": 2.5}, ["num_prompts", "2.5"]),
        ({"request_rate": -1}, ["request_rate", "> 0.0", "-1"]),
        ({"request_rate": "fast"}, ["request_rate", "'fast'"]),
        ({"max_concurrency": 0}, ["max_concurrency", "0"]),
        ({"range_ratio": 1.5}, ["range_ratio", "<= 1.0"]),
        ({"ignore_eos": "yes"}, ["ignore_eos", "true or false"]),
        ({"metric_percentiles": [50, 90]}, ["metric_percentiles", "lacks 99"]),
        ({"percentile_metrics": ["ttft", "itl"]}, ["percentile_metrics", "lacks tpot"]),
        ({"percentile_metrics": ["ttft", "tpot", "goodput"]}, ["'goodput'", "allowed"]),
        ({"dataset_name": "sharegpt"}, ["sharegpt dataset needs dataset_path"]),
        ({"dataset_name": "sharegpt", "dataset_path": "/d.json", "input_len": 10}, ["input_len does not apply"]),
        ({"dataset_name": "hf"}, ["dataset_name is 'hf'", "supported"]),
        ({"dataset_path": "/d.json"}, ["dataset_path must be empty for the random dataset"]),
        ({"backend": "tgi"}, ["backend is 'tgi'"]),
        ({"endpoint": "v1/completions"}, ["endpoint must be a path"]),
    ],
)
def test_bad_profiles_name_the_field_and_the_value(profile, words):
    with pytest.raises(ProfileError) as error:
        normalize_profile(profile)
    for word in words:
        assert word in str(error.value)


def test_argv_carries_every_field_of_the_production_profile():
    argv = bench_argv({}, "http://127.0.0.1:8000/", "/srv/models/m", result_dir="/var/tmp/b",
                      result_filename="result.json", vllm="/opt/vllm-cluster/venv/bin/vllm", label="tp1",
                      ready_check_timeout_s=30)
    assert argv[:3] == ["/opt/vllm-cluster/venv/bin/vllm", "bench", "serve"]
    parsed = flags(argv)
    assert parsed == {
        "--backend": "vllm", "--base-url": "http://127.0.0.1:8000", "--endpoint": "/v1/completions",
        "--model": "/srv/models/m", "--tokenizer": "/srv/models/m", "--dataset-name": "random",
        "--input-len": "1024", "--output-len": "128", "--random-range-ratio": "0", "--random-prefix-len": "0",
        "--num-prompts": "1000", "--request-rate": "20", "--burstiness": "1", "--max-concurrency": "64",
        "--seed": "0", "--ignore-eos": True, "--temperature": "0", "--num-warmups": "0",
        "--percentile-metrics": "ttft,tpot,itl,e2el", "--metric-percentiles": "50,90,99",
        "--ready-check-timeout-sec": "30", "--label": "tp1", "--disable-tqdm": True, "--save-result": True,
        "--result-dir": "/var/tmp/b", "--result-filename": "result.json",
    }


def test_argv_for_an_unbounded_burst_and_a_file_dataset():
    argv = bench_argv({"request_rate": float("inf"), "max_concurrency": None, "ignore_eos": False,
                       "temperature": None, "dataset_name": "sharegpt", "dataset_path": "/data/sg.json",
                       "output_len": None},
                      "http://10.0.0.1:8000", "meta-llama/Llama-3.1-8B-Instruct", "/models/tok",
                      result_dir="/r", result_filename="x.json")
    parsed = flags(argv)
    assert parsed["--request-rate"] == "inf" and parsed["--dataset-path"] == "/data/sg.json"
    assert parsed["--tokenizer"] == "/models/tok"
    for absent in ("--max-concurrency", "--ignore-eos", "--temperature", "--input-len", "--output-len",
                   "--random-range-ratio", "--label", "--ready-check-timeout-sec"):
        assert absent not in parsed


def test_argv_refuses_a_bad_url_or_no_model():
    with pytest.raises(ProfileError, match="base_url"):
        bench_argv({}, "127.0.0.1:8000", "/m", result_dir="/r", result_filename="x.json")
    with pytest.raises(ProfileError, match="model must name"):
        bench_argv({}, "http://h:1", "", result_dir="/r", result_filename="x.json")


def test_equal_loads_written_differently_are_the_same_profile():
    left = {"request_rate": "inf", "metric_percentiles": "50,90,99", "num_prompts": 100}
    right = {"request_rate": float("inf"), "metric_percentiles": [99, 90, 50], "num_prompts": 100.0}
    assert profile_differences(left, right) == []
    require_same_profile(left, right)
    assert bench_profile.fingerprint(left) == bench_profile.fingerprint(right)
    assert bench_profile.fingerprint(left) != bench_profile.fingerprint({"num_prompts": 101})


def test_different_loads_are_refused_naming_every_field():
    baseline = {"num_prompts": 1000, "request_rate": 20, "max_concurrency": 64}
    stage = {"num_prompts": 200, "request_rate": "inf", "max_concurrency": 64, "seed": 3}
    differences = profile_differences(baseline, stage)
    assert [d["field"] for d in differences] == ["num_prompts", "request_rate", "seed"]
    with pytest.raises(ProfileMismatchError) as error:
        require_same_profile(baseline, stage, "tp1", "tp4")
    message = str(error.value)
    assert "stage 'tp4' was measured under a different load profile than 'tp1'" in message
    assert "num_prompts (tp1: 1000, tp4: 200)" in message
    assert "request_rate (tp1: 20, tp4: inf)" in message
    assert "seed (tp1: 0, tp4: 3)" in message
    assert "max_concurrency" not in message
    assert error.value.differences == differences


def test_the_real_saved_result_agrees_with_its_profile(fixtures_dir):
    result = json.loads((fixtures_dir / "bench/vllm-bench-result-example.json").read_text())
    assert result_disagreements(EXAMPLE_PROFILE, result) == []
    wrong = {**EXAMPLE_PROFILE, "num_prompts": 1000, "max_concurrency": 64, "request_rate": 20}
    assert {d["field"]: (d["profile"], d["result"]) for d in result_disagreements(wrong, result)} == {
        "num_prompts": (1000, 8), "max_concurrency": (64, 4), "request_rate": (20.0, "inf")}


def test_the_real_controller_run_agrees_with_the_argv_that_made_it(fixtures_dir):
    profile = {"input_len": 64, "output_len": 32, "num_prompts": 32, "request_rate": "inf", "max_concurrency": 8,
               "seed": 7}
    result = json.loads((fixtures_dir / "bench/controller-tp1/result.json").read_text())
    assert result_disagreements(profile, result) == []
    # fixed lengths and ignore_eos: exactly output_len tokens per request
    assert result["total_output_tokens"] == 32 * 32
