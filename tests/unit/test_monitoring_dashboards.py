"""The Grafana dashboards of role vllm_monitoring: every panel's PromQL parses (Debian's promtool) and reads
only metrics vLLM 0.32 registers (its source in the runtime venv), node exporter's, Prometheus's own or the
project's recording rules; and the helper the lab's live check will use (every panel returns a series),
tested against a small local HTTP server.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from ansible_collections.vllm_ops.cluster.plugins.module_utils.monitoring.promql import (
    empty_queries,
    metric_names,
    substitute,
)
from test_monitoring_rules import (
    PLAN_RECORDS,
    RULES,
    promtool,
    recorded_names,
    unknown_names,
    vllm_exposed_names,
)

DASHBOARDS = sorted((Path(RULES).parents[1] / "dashboards").glob("*.json"))
ALL = {"deployment": ".*", "replica": ".*"}


def load(path):
    return json.loads(Path(path).read_text())


def panel_exprs(dashboard):
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def variable_queries(dashboard):
    """The PromQL inside the template variables' label_values(<expr>, <label>)."""
    found = []
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        text = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", text)
        assert match, f"{dashboard['uid']}: variable {variable['name']}: {text}"
        found.append(match.group(1))
    return found


def test_three_dashboards_each_with_its_variables_and_panels():
    assert [path.name for path in DASHBOARDS] == ["vllm-cluster-deployment.json", "vllm-cluster-fleet-overview.json",
                                                  "vllm-cluster-replica.json"]
    for path in DASHBOARDS:
        dashboard = load(path)
        variables = [variable["name"] for variable in dashboard["templating"]["list"]]
        assert variables[:2] == ["datasource", "deployment"], path.name
        assert dashboard["uid"].startswith("vllm-cluster-") and dashboard["panels"], path.name
        for panel in dashboard["panels"]:
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}", panel["title"]
            # Every panel is scoped by the deployment variable.
            assert all("$deployment" in target["expr"] for target in panel["targets"]), panel["title"]
    assert "replica" in [v["name"] for v in load(DASHBOARDS[2])["templating"]["list"]]


def test_every_expression_reads_metrics_that_exist():
    known = vllm_exposed_names()
    recorded = recorded_names(RULES) | PLAN_RECORDS
    for path in DASHBOARDS:
        dashboard = load(path)
        exprs = panel_exprs(dashboard) + variable_queries(dashboard)
        assert unknown_names(exprs, known, recorded) == {}, path.name
    names = {name for path in DASHBOARDS for expr in panel_exprs(load(path)) for name in metric_names(expr)}
    assert {"vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds_bucket",
            "vllm:generation_tokens_total", "node_cpu_seconds_total", "vllm_cluster:replicas_healthy"} <= names


def test_every_expression_parses_in_promtool(tmp_path):
    exprs = sorted({substitute(expr, ALL) for path in DASHBOARDS
                    for expr in panel_exprs(load(path)) + variable_queries(load(path))})
    assert not [expr for expr in exprs if "$" in expr]
    rules = {"groups": [{"name": "dashboards", "rules": [{"record": f"dashboard:expr_{index}", "expr": expr}
                                                          for index, expr in enumerate(exprs)]}]}
    path = tmp_path / "dashboards.rules.yml"
    path.write_text(yaml.safe_dump(rules))
    code, output = promtool("check", "rules", path)
    assert code == 0 and f"SUCCESS: {len(exprs)} rules found" in output, output
    # And promtool refuses a broken one, so the check means something.
    path.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [{"record": "x:y", "expr": "sum by (("}]}]}))
    assert promtool("check", "rules", path)[0] != 0


def test_substitute_fills_grafanas_variables():
    assert substitute('rate(x{d=~"$deployment", r=~"${replica}"}[$__rate_interval])', {"deployment": "chat",
                                                                                        "replica": ".*"}) == \
        'rate(x{d=~"chat", r=~".*"}[1m])'


class _Prometheus(BaseHTTPRequestHandler):
    """/api/v1/query: a series for expressions naming ``vllm:num_requests_running``, none for the others, an
    error for ``broken``."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)["query"][0]
        if "broken" in query:
            body, status = {"status": "error", "errorType": "bad_data", "error": "parse error"}, 400
        else:
            result = [{"metric": {"replica": "0"}, "value": [0, "1"]}] if "num_requests_running" in query else []
            body, status = {"status": "success", "data": {"resultType": "vector", "result": result}}, 200
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def prometheus_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Prometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_empty_queries_names_the_panels_without_a_series(prometheus_url):
    exprs = ['vllm:num_requests_running{deployment=~"chat"}', "vllm:kv_cache_usage_perc", "broken("]
    found = empty_queries(prometheus_url, exprs, timeout=5)
    assert found["vllm:kv_cache_usage_perc"] == "no series"
    assert found["broken("].startswith("query failed:")
    assert 'vllm:num_requests_running{deployment=~"chat"}' not in found
    # Nothing listening: every expression is reported, none silently passes.
    assert set(empty_queries("http://127.0.0.1:9", exprs[:1], timeout=2)) == {exprs[0]}
