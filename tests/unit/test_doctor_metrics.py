"""The doctor's reading of Prometheus: module_utils/doctor/metrics.py and observations_metrics.py.

The live proof (a real vLLM that queues, a real Prometheus firing the role's alert, the doctor's CLI) is
tests/runtime/test_prometheus_live.py; tests/fixtures/doctor/prometheus/ keeps what the doctor saved there.
"""

import json
import socket
from pathlib import Path

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor import diagnosis, metrics
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.catalog import load_catalog_file
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.evidence import (
    Cluster,
    evidence_from_saved,
)
from ansible_collections.vllm_ops.cluster.plugins.module_utils.doctor.observations_metrics import (
    obs_alert_firing,
    obs_kv_saturated,
    obs_metrics_unreadable,
)

REPO = Path(__file__).resolve().parents[2]
CATALOG = load_catalog_file(REPO / "roles" / "doctor" / "files" / "signatures.yml")
HEALTHY = REPO / "tests" / "fixtures" / "doctor" / "unseen" / "healthy" / "doctor-evidence.json"
SATURATED = REPO / "tests" / "fixtures" / "doctor" / "prometheus" / "kv-saturated" / "doctor-evidence.json"


def evidence_of(path, metrics_record=None):
    data = json.loads(path.read_text(encoding="utf-8"))
    if metrics_record is not None:
        data["metrics"] = metrics_record
    return evidence_from_saved(data)


def closed_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_trend_queries_select_the_deployment_and_look_back():
    queries = metrics.trend_queries("lab", "2m", "10s")
    assert queries["saturated_moments"] == (
        'count_over_time(((vllm:num_requests_waiting{deployment="lab"} > 0) and on (node, replica, instance) '
        '(vllm:kv_cache_usage_perc{deployment="lab"} >= 0.9))[2m:10s])')
    assert queries["kv_usage_max"] == 'max_over_time(vllm:kv_cache_usage_perc{deployment="lab"}[2m])'


@pytest.mark.parametrize("deployment", ["", None, 'a"b'])
def test_a_deployment_name_that_would_break_the_selector_is_refused(deployment):
    with pytest.raises(metrics.MetricsError, match="expected the plan's deployment name"):
        metrics.trend_queries(deployment)


def test_only_firing_alerts_of_the_deployment_are_kept():
    data = {"alerts": [
        {"state": "firing", "labels": {"alertname": "B", "deployment": "lab", "node": "n1", "severity": "warning"},
         "annotations": {"summary": "queue"}, "activeAt": "t1"},
        {"state": "pending", "labels": {"alertname": "C", "deployment": "lab"}},
        {"state": "firing", "labels": {"alertname": "D", "deployment": "other"}},
        {"state": "firing", "labels": {"alertname": "A"}, "annotations": {"description": "no deployment label"}},
    ]}
    assert metrics.firing_alerts(data, "lab") == [
        {"alertname": "A", "severity": "", "node": "", "replica": "", "summary": "no deployment label",
         "active_at": ""},
        {"alertname": "B", "severity": "warning", "node": "n1", "replica": "", "summary": "queue", "active_at": "t1"},
    ]


def test_each_replica_s_trend_is_one_row():
    answers = {"kv_usage_max": [{"metric": {"node": "n2", "replica": "0"}, "value": [1, "0.5"]},
                                {"metric": {"node": "n1", "replica": "1"}, "value": [1, "1"]}],
               "saturated_moments": [{"metric": {"node": "n1", "replica": "1"}, "value": [1, "3"]}]}
    assert metrics.replica_trends(answers) == [
        {"node": "n1", "replica": "1", "kv_usage_max": 1.0, "saturated_moments": 3.0},
        {"node": "n2", "replica": "0", "kv_usage_max": 0.5},
    ]


def test_prometheus_away_is_a_warning_that_names_the_url():
    url = f"http://127.0.0.1:{closed_port()}"
    record = metrics.gather(url, "lab-tiny-llama", timeout=2)
    assert record["error"].startswith(f"Prometheus at {url}: ")
    report = diagnosis.diagnose(CATALOG, evidence_of(HEALTHY, record))
    assert report["faults"] == 0
    [finding] = [f for f in report["findings"] if f["id"] == "prometheus_unreadable"]
    assert finding["severity"] == "warning" and url in finding["title"]


def test_without_a_prometheus_the_metrics_observations_see_nothing():
    cluster = Cluster(evidence_of(HEALTHY, {}))
    assert obs_kv_saturated(cluster, {}) == obs_alert_firing(cluster, {}) == obs_metrics_unreadable(cluster, {}) == []


def test_a_firing_alert_is_a_finding_on_its_node_unless_another_observation_covers_it():
    record = {"url": "http://mon:9090", "lookback": "5m", "kv_full": 0.9, "replicas": [], "error": None,
              "alerts": [{"alertname": "VllmApiServerDown", "severity": "critical", "node": "node1", "replica": "",
                          "summary": "the API server of lab is down", "active_at": "t"}]}
    cluster = Cluster(evidence_of(HEALTHY, record))
    [hit] = obs_alert_firing(cluster, {})
    assert hit["node"] == "node1" and set(hit["values"]) == {"alertname", "severity", "summary", "url"}
    assert obs_alert_firing(cluster, {"ignore": ["VllmApiServerDown"]}) == []
    report = diagnosis.diagnose(CATALOG, evidence_of(HEALTHY, record))
    [finding] = [f for f in report["findings"] if f["id"] == "prometheus_alert_firing"]
    assert finding["nodes"] == ["node1"] and "VllmApiServerDown (critical)" in finding["title"]


def test_the_saturated_replica_captured_live_is_a_warning_on_its_node():
    """Replays what the doctor saved in tests/runtime/test_prometheus_live.py: a real vLLM queueing with its KV
    cache full, read from a real Prometheus."""
    evidence = evidence_of(SATURATED)
    [hit] = obs_kv_saturated(Cluster(evidence), {})
    assert set(hit["values"]) == {"replica", "moments", "kv_pct", "waiting", "lookback", "kv_full_pct", "url"}
    report = diagnosis.diagnose(CATALOG, evidence)
    assert report["faults"] == 0
    [finding] = [f for f in report["findings"] if f["id"] == "kv_cache_saturated"]
    head = evidence["plan"]["nodes"][0]["host"]
    assert finding["nodes"] == [head] and finding["severity"] == "warning"
    assert "Add capacity" in finding["fix"]
    # Below the threshold of moments, nothing.
    assert obs_kv_saturated(Cluster(evidence), {"min_moments": 10_000}) == []
