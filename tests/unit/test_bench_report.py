"""Stage records, the report and its plots, and bin/vllm-cluster-report, on real saved runs."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench import profile as bench_profile
from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench import report as bench_report
from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench import stage as bench_stage
from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench.report import (
    ReportError,
    build_stage_record,
    check_before_run,
    load_stages,
    parse_samples,
    stage_name_for,
    write_report,
    write_stage_record,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.plan.build import build_plan

REPO = Path(__file__).resolve().parents[2]
CLI = REPO / "bin" / "vllm-cluster-report"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# The profile the real controller runs were made with (tests/fixtures/bench/controller-runs.source.txt).
PROFILE = {"input_len": 64, "output_len": 32, "num_prompts": 32, "request_rate": "inf", "max_concurrency": 8, "seed": 7}


def gpu_nodes(count, gpus):
    return [{"name": f"node{i}", "address": f"10.0.0.{i + 1}",
             "gpus": {"count": gpus, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "nvlink": True}}
            for i in range(count)]


def request_for(fixtures_dir, name, **changes):
    base = fixtures_dir / f"bench/controller-{name}"
    samples = (base / "samples.jsonl").read_text()
    request = {"stage": name, "baseline": name == "tp1", "profile": PROFILE,
               "plan": json.loads((base / "plan.json").read_text()), "result": (base / "result.json").read_text(),
               "samples": {"node0": samples},
               "bench_end": json.loads((base / "saved-at.json").read_text())["result_saved_at"],
               "versions": {"node0": {"vllm": "0.32.0", "python": "3.11.7"}}}
    request.update(changes)
    return request


@pytest.fixture
def results(tmp_path, fixtures_dir):
    """results/<deployment>/ with the two real controller stages recorded, and a plan.json beside them."""
    directory = tmp_path / "results" / "lab"
    for name in ("tp1", "tp2"):
        write_stage_record(str(directory), build_stage_record(request_for(fixtures_dir, name)))
    (directory / "plan.json").write_text(json.dumps({"deployment": "lab"}))
    return directory


def test_stage_names_follow_the_layout():
    assert stage_name_for(build_plan("llama-3.1-8b", gpu_nodes(1, 1), {"max_model_len": 8192})) == "tp1"
    assert stage_name_for(build_plan("llama-3.1-70b", gpu_nodes(1, 4), {"max_model_len": 8192})) == "tp4"
    assert stage_name_for(build_plan("llama-3.1-405b", gpu_nodes(2, 8), {"max_model_len": 8192})) == "tp8-pp2-2nodes"
    ep = build_plan("deepseek-v3", [dict(n, gpus=dict(n["gpus"], name="NVIDIA H200", memory_total_mib=143771))
                                    for n in gpu_nodes(1, 8)], {"max_model_len": 8192}, {"tp": 2})
    assert stage_name_for(ep) == "tp2-dp4-ep8"
    across = build_plan("llama-3.1-8b", gpu_nodes(2, 1), {"max_model_len": 8192}, {"tp": 2},
                        allow_tp_across_nodes=True)
    assert stage_name_for(across) == "tp2-2nodes"
    # The same layout over Ray is a stage of its own beside the mp one (issue 24).
    over_ray = build_plan("llama-3.1-8b", gpu_nodes(2, 1), {"max_model_len": 8192}, {"tp": 2, "backend": "ray"},
                          allow_tp_across_nodes=True)
    assert stage_name_for(over_ray) == "tp2-2nodes-ray"
    assert bench_stage.describe_layout(bench_stage.stage_layout(over_ray)) == "TP=2, 2 GPUs on 2 nodes over Ray"


@pytest.mark.parametrize("name", ["", "TP1", "-tp1", "tp 1", "plan", "report", "a" * 65, "../x"])
def test_bad_stage_names_are_refused(name):
    with pytest.raises(ReportError, match="stage name"):
        bench_report.check_stage_name(name)


def test_sampler_lines_parse_and_a_truncated_last_line_is_dropped(fixtures_dir):
    text = (fixtures_dir / "bench/controller-tp2/samples.jsonl").read_text()
    lines = parse_samples(text)
    assert lines[0]["sampler"] == 1 and lines[0]["mode"] == "cpu" and lines[-1]["reason"] == "stop-file"
    assert len(parse_samples(text + '{"t": 17960')) == len(lines)
    with pytest.raises(ReportError, match="line 2 is not JSON"):
        parse_samples('{"sampler": 1}\n{oops\n{"end": 1}\n')


def test_a_record_keeps_the_raw_result_plan_versions_and_the_load_window(fixtures_dir):
    request = request_for(fixtures_dir, "tp2")
    record = build_stage_record(request)
    raw = json.loads(request["result"])
    assert record["result"] == raw
    assert record["plan"] == request["plan"] and record["deployment"] == "lab"
    assert record["profile"] == bench_profile.normalize_profile(PROFILE)
    assert record["versions"] == {"node0": {"vllm": "0.32.0", "python": "3.11.7"}}
    assert record["window"]["load_end"] - record["window"]["load_start"] == pytest.approx(raw["duration"])
    assert record["layout"] == "TP=2, 2 CPU workers" and record["baseline"] is False
    assert len(record["samples"]["node0"]) == len(request["samples"]["node0"].splitlines())


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"result": None}, "needs 'result'"),
        ({"result": "{not json"}, "result of stage 'tp2' is not JSON"),
        ({"result": {"completed": 1}}, "not a saved vllm bench serve result"),
        ({"stage": "Bad Name"}, "stage name 'Bad Name'"),
    ],
)
def test_bad_record_requests_say_what_is_wrong(fixtures_dir, changes, message):
    with pytest.raises(ReportError, match=message):
        build_stage_record(request_for(fixtures_dir, "tp2", **changes))


def test_records_round_trip_and_other_json_is_not_a_stage(results):
    stages = load_stages(str(results))
    assert sorted(stages) == ["tp1", "tp2"]
    assert stages["tp1"]["baseline"] is True
    assert not any(p.name.startswith(".tmp-") for p in results.iterdir())


def test_check_refuses_a_run_under_another_profile_before_it_starts(results):
    plan = load_stages(str(results))["tp2"]["plan"]
    assert check_before_run(str(results), "tp2", PROFILE, plan, False) == {
        "stage": "tp2", "baseline": "tp1", "comparable": True}
    with pytest.raises(bench_profile.ProfileMismatchError) as error:
        check_before_run(str(results), "tp2-more", {**PROFILE, "num_prompts": 64, "max_concurrency": 16}, plan, False)
    assert "max_concurrency (tp1: 8, tp2-more: 16)" in str(error.value)
    assert "num_prompts (tp1: 32, tp2-more: 64)" in str(error.value)
    with pytest.raises(ReportError, match="'new' is to be the baseline, but tp1 already is"):
        check_before_run(str(results), "new", PROFILE, plan, True)
    # re-recording the baseline itself is allowed; an empty stage name is derived from the plan
    assert check_before_run(str(results), "tp1", PROFILE, plan, True)["baseline"] == "tp1"
    assert check_before_run(str(results), "", PROFILE, plan, False)["stage"] == "tp2"


def test_check_without_a_baseline_says_how_to_record_one(tmp_path, fixtures_dir):
    plan = json.loads((fixtures_dir / "bench/controller-tp1/plan.json").read_text())
    answer = check_before_run(str(tmp_path / "empty"), "", PROFILE, plan, False)
    assert answer["stage"] == "tp1" and answer["baseline"] is None
    assert "vllm_benchmark_baseline: true" in answer["note"]


def test_the_report_on_real_cpu_stages(results):
    summary = write_report(str(results))
    report = (results / "report.md").read_text()
    assert summary["status"] == "warn" and summary["baseline"] == "tp1"
    assert [s["stage"] for s in summary["stages"]] == ["tp1", "tp2"]
    assert all(s["gpu_targets"] == "not comparable (CPU)" for s in summary["stages"])
    # one table to paste into the deployment docs, with both stages
    header = "| stage | layout | TTFT P50 / P99 ms | TPOT P50 / P99 ms | output tok/s | total tok/s |"
    assert report.count(header) == 1
    rows = [line for line in report.splitlines() if line.startswith("| tp1 |") or line.startswith("| tp2 |")]
    assert len(rows) == 2 and "anchor" in rows[0] and "not comparable to GPU targets" in rows[1]
    assert "**CPU platform.**" in report and "never passed" in report
    assert "Troubleshooting, in the seed's order (compute -> communication -> load)" in report
    assert "measured CPU use of each vLLM worker process" in report
    # no gain on CPU is passed: the baseline's rows are the anchor, the others not comparable
    gain_rows = [line for line in report.splitlines() if line.startswith(("| TTFT P", "| TPOT P", "| output tok/s"))]
    assert len(gain_rows) == 2 * 5 and all(line.endswith(("| anchor |", "| not comparable |")) for line in gain_rows)
    for name in ("latency.png", "throughput.png", "utilization.png"):
        path = results / name
        assert str(path) in summary["plots"]
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 20_000
        assert f"![{name.split('.')[0]}]({name})" in report


def test_the_report_names_refused_stages(results, fixtures_dir):
    other = build_stage_record(request_for(fixtures_dir, "tp2", stage="tp2-short",
                                           profile={**PROFILE, "num_prompts": 16}))
    other["result"]["num_prompts"] = 16
    write_stage_record(str(results), other)
    summary = write_report(str(results), plots=False)
    report = (results / "report.md").read_text()
    assert summary["refused"][0]["stage"] == "tp2-short"
    assert "## Refused comparisons" in report and "num_prompts (tp1: 32, tp2-short: 16)" in report
    assert "_Plots skipped: plots not requested_" in report


def test_before_the_baseline_the_report_says_so_and_lists_the_stages(tmp_path, fixtures_dir):
    directory = tmp_path / "lab"
    write_stage_record(str(directory), build_stage_record(request_for(fixtures_dir, "tp2")))
    summary = write_report(str(directory))
    report = (directory / "report.md").read_text()
    assert summary["baseline"] is None and summary["status"] == "warn"
    assert "no baseline: run the single-GPU anchor with vllm_benchmark_baseline: true" in summary["note"]
    assert "**No baseline yet:**" in report and "| tp2 | TP=2, 2 CPU workers |" in report
    with pytest.raises(bench_report.bench_verdict.VerdictError, match="baseline stage 'tp1' has no result"):
        write_report(str(directory), baseline="tp1")


def test_no_stage_no_report(tmp_path):
    with pytest.raises(ReportError, match="no stage records"):
        write_report(str(tmp_path))


def test_the_module_does_not_import_matplotlib_until_it_plots():
    code = (f"import sys; sys.path.insert(0, {str(REPO / 'collections')!r}); "
            "from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench import report; "
            "print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------ the command line


def cli(*args, stdin=None):
    return subprocess.run([sys.executable, str(CLI), *args], input=stdin, capture_output=True, text=True,
                          timeout=120, check=False)


def test_cli_argv_check_record_report(tmp_path, fixtures_dir):
    results = tmp_path / "results" / "lab"
    argv = cli("argv", stdin=json.dumps({"profile": PROFILE, "base_url": "http://127.0.0.1:8000",
                                         "model": "/srv/models/tiny-llama", "result_dir": "/var/tmp/b/tp1",
                                         "vllm": "/opt/vllm-cluster/venv/bin/vllm", "label": "tp1"}))
    assert argv.returncode == 0, argv.stderr
    answer = json.loads(argv.stdout)
    assert answer["argv"][:3] == ["/opt/vllm-cluster/venv/bin/vllm", "bench", "serve"]
    assert answer["fingerprint"] == bench_profile.fingerprint(PROFILE)
    bad = cli("argv", stdin=json.dumps({"profile": {"num_prompts": 0}, "base_url": "http://h:1", "model": "m"}))
    assert bad.returncode == 2 and "num_prompts must be an integer >= 1, got 0" in bad.stderr
    for name in ("tp1", "tp2"):
        request = dict(request_for(fixtures_dir, name), results_dir=str(results))
        recorded = cli("record", stdin=json.dumps(request))
        assert recorded.returncode == 0, recorded.stderr
        assert json.loads(recorded.stdout)["path"] == str(results / f"{name}.json")
    plan = json.loads((fixtures_dir / "bench/controller-tp2/plan.json").read_text())
    bench = {"base_url": "http://127.0.0.1:8000", "model": "/srv/models/tiny-llama", "work_dir": "/var/tmp/b/",
             "vllm": "/opt/vllm-cluster/venv/bin/vllm"}
    checked = cli("check", stdin=json.dumps({"results_dir": str(results), "stage": "", "plan": plan,
                                             "profile": PROFILE, "bench": bench}))
    assert checked.returncode == 0, checked.stderr
    answer = json.loads(checked.stdout)
    assert (answer["stage"], answer["baseline"], answer["result_dir"]) == ("tp2", "tp1", "/var/tmp/b/tp2")
    assert answer["argv"][-4:] == ["--result-dir", "/var/tmp/b/tp2", "--result-filename", "result.json"]
    assert answer["argv"][answer["argv"].index("--label") + 1] == "tp2"
    lacking = cli("check", stdin=json.dumps({"results_dir": str(results), "profile": PROFILE}))
    assert lacking.returncode == 2 and "the request lacks plan" in lacking.stderr
    refused = cli("check", stdin=json.dumps({"results_dir": str(results), "stage": "", "plan": plan,
                                             "profile": {**PROFILE, "seed": 8}, "bench": bench}))
    assert refused.returncode == 3
    assert refused.stderr.startswith("vllm-cluster-report check: refused: stage 'tp2' was measured under a "
                                     "different load profile than 'tp1': seed (tp1: 7, tp2: 8)")
    report = cli("report", "--results-dir", str(results), "--no-plots")
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["status"] == "warn"
    overrides = tmp_path / "expect.json"
    overrides.write_text(json.dumps({"gain_efficiency": {"throughput": {"tp": 2}}}))
    bad_overrides = tmp_path / "bad.json"
    bad_overrides.write_text(json.dumps({"gain": 1}))
    assert cli("report", "--results-dir", str(results), "--no-plots", "--expectations", str(overrides)).returncode == 0
    wrong = cli("report", "--results-dir", str(results), "--no-plots", "--expectations", str(bad_overrides))
    assert wrong.returncode == 2 and "unknown expectation 'gain'" in wrong.stderr
    shutil.rmtree(results)
    empty = cli("report", "--results-dir", str(results))
    assert empty.returncode == 2 and "no stage records" in empty.stderr
