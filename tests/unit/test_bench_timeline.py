"""plugins/module_utils/bench/timeline.py: the queries, the window, the parsing, and Prometheus away.

The live proof (a real vLLM scraped by a real Prometheus) is tests/runtime/test_prometheus_live.py.
"""

import socket

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.bench import timeline


@pytest.mark.parametrize(("duration", "expected"), [("15s", 15.0), ("1m", 60.0), ("500ms", 0.5), (2, 2.0),
                                                     ("1.5s", 1.5)])
def test_durations(duration, expected):
    assert timeline.seconds(duration) == expected


@pytest.mark.parametrize("duration", ["fast", "", "15", "-1s", True])
def test_a_duration_that_is_not_one_is_refused_with_its_value(duration):
    with pytest.raises(timeline.TimelineError, match="is not a duration"):
        timeline.seconds(duration)


def test_queries_select_the_deployment_and_rate_over_four_scrapes():
    exprs = timeline.queries("chat-70b", "15s")
    assert set(exprs) == set(timeline.QUERIES)
    assert all('deployment="chat-70b"' in expr for expr in exprs.values())
    assert exprs["output_tokens_per_s"] == (
        'sum by (node, replica) (rate(vllm:generation_tokens_total{deployment="chat-70b"}[60s]))')
    assert timeline.queries("a", "1s")["output_tokens_per_s"].endswith("[4s]))")


@pytest.mark.parametrize("deployment", ["", None, 'a"b', "a\\b"])
def test_a_deployment_name_that_would_break_the_selector_is_refused(deployment):
    with pytest.raises(timeline.TimelineError, match="expected the plan's deployment name"):
        timeline.queries(deployment)


def test_the_window_is_the_load_with_two_scrapes_each_side():
    start, end, step = timeline.window_range({"load_start": 1000.0, "load_end": 1010.0}, "5s")
    assert (start, end, step) == (990.0, 1020.0, 2.5)
    # A long load keeps under MAX_POINTS points a series.
    start, end, step = timeline.window_range({"load_start": 0, "load_end": 36000}, "1s")
    assert (end - start) / step <= timeline.MAX_POINTS


@pytest.mark.parametrize("window", [{}, None, {"load_start": 5}, {"load_start": 10, "load_end": 5}])
def test_a_stage_without_a_load_window_has_no_timeline(window):
    with pytest.raises(timeline.TimelineError):
        timeline.window_range(window, "1s", margin_s=0)


def test_series_are_sorted_per_replica_and_nan_points_dropped():
    matrix = [{"metric": {"node": "n2", "replica": "0"}, "values": [[1.0, "3"], [2.0, "NaN"]]},
              {"metric": {"node": "n1", "replica": "1"}, "values": [[1.0, "0.5"]]},
              {"metric": {}, "values": []}]
    assert timeline.series_points(matrix) == [
        {"node": "", "replica": "", "points": []},
        {"node": "n1", "replica": "1", "points": [[1.0, 0.5]]},
        {"node": "n2", "replica": "0", "points": [[1.0, 3.0]]},
    ]


def test_prometheus_away_is_recorded_not_raised():
    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    record = timeline.stage_timelines(f"http://127.0.0.1:{port}", "lab", {"load_start": 10, "load_end": 20}, "1s",
                                      timeout=2)
    assert record["error"].startswith(f"Prometheus at http://127.0.0.1:{port}: ")
    assert record["series"] == {}
    assert timeline.summary(record) == []


def test_a_stage_without_a_window_is_recorded_with_why():
    record = timeline.stage_timelines("http://127.0.0.1:9", "lab", {}, "1s")
    assert "no load window" in record["error"]


def test_the_summary_names_each_replica_s_peak_inside_the_load_only():
    timelines = {"error": None, "load_start": 10.0, "load_end": 20.0, "series": {
        "running": [{"node": "n1", "replica": "0", "points": [[5.0, 9.0], [12.0, 4.0], [18.0, 6.0]]},
                    {"node": "n2", "replica": "0", "points": [[15.0, 2.0]]}],
        "waiting": [{"node": "n1", "replica": "0", "points": [[25.0, 1.0]]}]}}
    lines = timeline.summary(timelines)
    assert lines[0] == "requests running (requests), peak per replica during the load: n1/0 6, n2/0 2"
    assert lines[1] == "requests waiting (requests), peak per replica during the load: no series"
    assert len(lines) == len(timeline.QUERIES)
