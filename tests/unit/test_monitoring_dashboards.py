"""The Grafana dashboards of role vllm_monitoring: every panel's PromQL parses (Debian's promtool) and reads
only metrics vLLM 0.32 registers (its source in the runtime venv), node exporter's, Prometheus's own, the
project's recording rules or vllm-router's as a real vllm-router 0.1.17 exposed them (tests/fixtures/router/);
and the helper the lab's live check will use (every panel returns a series), tested against a small local HTTP
server.
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
from test_facts_modules import REPO
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
# vllm-router's own series, as a real vllm-router 0.1.17 exposed them (tests/fixtures/router/doctor/capture.py).
ROUTER_CAPTURES = sorted((REPO / "tests" / "fixtures" / "router" / "doctor").glob("*/metrics.txt"))


def captured_router_names():
    """Every series name in the captured router metrics (``name{labels} value`` lines)."""
    return {re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0) for path in ROUTER_CAPTURES
            for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")}


def load(path):
    return json.loads(Path(path).read_text())


def panel_exprs(dashboard):
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def router_exprs(dashboard):
    return [expr for expr in panel_exprs(dashboard) if any(n.startswith("vllm_router_") for n in metric_names(expr))]


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
            if panel["type"] == "row":  # a row's title groups the panels below it; it queries nothing
                assert panel["title"] and not panel.get("targets"), panel
                continue
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}", panel["title"]
            # Every panel is scoped by the deployment variable.
            assert all("$deployment" in target["expr"] for target in panel["targets"]), panel["title"]
    assert "replica" in [v["name"] for v in load(DASHBOARDS[2])["templating"]["list"]]


def test_every_expression_reads_metrics_that_exist():
    known = vllm_exposed_names() | captured_router_names()
    recorded = recorded_names(RULES) | PLAN_RECORDS
    for path in DASHBOARDS:
        dashboard = load(path)
        exprs = panel_exprs(dashboard) + variable_queries(dashboard)
        assert unknown_names(exprs, known, recorded) == {}, path.name
    names = {name for path in DASHBOARDS for expr in panel_exprs(load(path)) for name in metric_names(expr)}
    assert {"vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds_bucket",
            "vllm:generation_tokens_total", "node_cpu_seconds_total", "vllm_cluster:replicas_healthy"} <= names


def test_the_router_panels_read_only_what_a_real_router_exposed_from_its_scrape_job():
    captured = captured_router_names()
    assert len(ROUTER_CAPTURES) == 3 and {"vllm_router_worker_health", "vllm_router_cb_state"} <= captured
    fleet = load(DASHBOARDS[1])
    exprs = router_exprs(fleet)
    read = {name for expr in exprs for name in metric_names(expr)}
    # Requests, requests per worker, each worker's health and circuit breaker: all in the capture.
    assert {"vllm_router_requests_total", "vllm_router_processed_requests_total", "vllm_router_worker_health",
            "vllm_router_cb_state", "vllm_router_cb_outcomes_total"} <= read <= captured, read - captured
    # The router's series carry no deployment: its target's `fronts` (the deployments it fronts, or *) scopes them.
    assert all('job="router"' in expr and "fronts=~" in expr for expr in exprs), exprs
    rows = [panel["title"] for panel in fleet["panels"] if panel["type"] == "row"]
    assert rows == ["The router (vllm-router's own metrics, job router)"]
    # The other dashboards are one deployment's replicas: no router panel there.
    assert not router_exprs(load(DASHBOARDS[0])) and not router_exprs(load(DASHBOARDS[2]))


@pytest.mark.parametrize(("fronts", "deployment", "selected"), [
    ("*", "chat", True), ("chat", "chat", True), ("chat,code", "code", True), ("a,chat,b", "chat", True),
    ("chatty", "chat", False), ("code", "chat", False), ("code", ".*", True), ("a,b", "(b|c)", True)])
def test_the_router_panels_follow_the_deployment_variable(fronts, deployment, selected):
    [matcher] = {re.search(r'fronts=~"([^"]+)"', expr).group(1) for expr in router_exprs(load(DASHBOARDS[1]))}
    regex = substitute(matcher, {"deployment": deployment})
    assert (re.fullmatch(regex, fronts) is not None) is selected, (regex, fronts)


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
