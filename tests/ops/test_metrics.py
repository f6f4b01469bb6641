"""`berth up --metrics-listen`: /metrics parsed by prometheus_client's OpenMetrics parser;
histograms (operations, CRIU runs and image sizes, store calls) and the proxy's
connection and byte counters move with what they count; no label carries a key or an
id."""

from __future__ import annotations

import httpx
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from conftest import METRICS_ADDR, Berth, Cli


def scrape() -> dict[str, list]:
    answer = httpx.get(f"http://{METRICS_ADDR}/metrics", timeout=30)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("application/openmetrics-text")
    return {family.name: family.samples for family in text_string_to_metric_families(answer.text)}


def value(families: dict[str, list], family: str, sample: str, **labels: str) -> float:
    return sum(
        s.value for s in families.get(family, [])
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    )


def op_count(families: dict[str, list], operation: str, outcome: str = "ok") -> float:
    return value(families, "berth_sandbox_operation_duration_seconds",
                 "berth_sandbox_operation_duration_seconds_count", operation=operation, outcome=outcome)


def test_metrics_move_with_operations(cli: Cli, berth: Berth, other_team_key: str) -> None:
    before = scrape()
    sandbox_id = cli.ok("sandbox", "create", "--timeout", "300", "--metadata", "secret=topsecret-label").stdout.strip()
    try:
        during = scrape()
        assert op_count(during, "create") == op_count(before, "create") + 1
        assert value(during, "berth_sandboxes", "berth_sandboxes", state="running", template="base") >= 1
        cli.ok("sandbox", "pause", sandbox_id)
        paused = scrape()
        assert value(paused, "berth_sandboxes", "berth_sandboxes", state="paused", template="base") >= 1
        cli.ok("sandbox", "resume", sandbox_id)
        assert cli.json("sandbox", "exec", sandbox_id, "--", "true")["exitCode"] == 0
        forks = cli.json("sandbox", "fork", sandbox_id, "--count", "1", "--timeout", "60")
        cli.ok("sandbox", "kill", forks[0]["sandbox"]["sandboxID"])
        after = scrape()
        for operation in ("pause", "resume", "fork"):
            assert op_count(after, operation) >= op_count(before, operation) + 1, operation
        # The sum is seconds spent: positive once something was timed.
        assert value(after, "berth_sandbox_operation_duration_seconds",
                     "berth_sandbox_operation_duration_seconds_sum", operation="create") > 0
        # Buckets are cumulative and end at +Inf = count.
        buckets = [s for s in after["berth_sandbox_operation_duration_seconds"]
                   if s.name.endswith("_bucket") and s.labels["operation"] == "create" and s.labels["outcome"] == "ok"]
        assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == op_count(after, "create")
        assert [b.value for b in buckets] == sorted(b.value for b in buckets)
        assert value(after, "berth_process_resident_memory_bytes", "berth_process_resident_memory_bytes") > 0
        assert value(after, "berth_process_threads", "berth_process_threads") >= 1
        assert value(after, "berth_process_open_fds", "berth_process_open_fds") >= 3
        assert value(after, "berth_pool_sandboxes", "berth_pool_sandboxes", template="base") >= 0

        text = httpx.get(f"http://{METRICS_ADDR}/metrics", timeout=30).text
        # The SDK-style traffic of `exec` went through the proxy, over connections it
        # opened into the sandbox, both ways.
        assert value(after, "berth_proxy_requests", "berth_proxy_requests_total", status="2xx") >= 1
        assert value(after, "berth_proxy_connections_opened", "berth_proxy_connections_opened_total") >= 1
        for direction in ("to_sandbox", "from_sandbox"):
            assert value(after, "berth_proxy_bytes", "berth_proxy_bytes_total", direction=direction) > \
                value(before, "berth_proxy_bytes", "berth_proxy_bytes_total", direction=direction), direction
        assert "berth_proxy_connections_open" in after
        # CRIU: the pause and the fork dumped (with images), the resume and the fork
        # restored.
        for action in ("dump", "restore"):
            assert value(after, "berth_criu_duration_seconds", "berth_criu_duration_seconds_count",
                         action=action, outcome="ok") >= \
                value(before, "berth_criu_duration_seconds", "berth_criu_duration_seconds_count",
                      action=action, outcome="ok") + 1, action
        assert value(after, "berth_criu_image_size_bytes", "berth_criu_image_size_bytes_count") >= \
            value(before, "berth_criu_image_size_bytes", "berth_criu_image_size_bytes_count") + 2
        assert value(after, "berth_criu_image_size_bytes", "berth_criu_image_size_bytes_sum") > 0
        # Every store call is timed.
        assert value(after, "berth_store_query_duration_seconds", "berth_store_query_duration_seconds_count") > \
            value(before, "berth_store_query_duration_seconds", "berth_store_query_duration_seconds_count")
        assert "berth_store_wait_duration_seconds" in after
        for forbidden in (berth.api_key, other_team_key, sandbox_id, "topsecret-label", "e2b_"):
            assert forbidden not in text
        label_names = {name for samples in after.values() for s in samples for name in s.labels}
        assert label_names <= {
            "operation", "outcome", "state", "template", "kind", "status", "le", "action", "direction", "sweeper",
            "rule",
        }, label_names
    finally:
        cli.run("sandbox", "kill", sandbox_id)


def test_metrics_listener_is_not_the_api(berth: Berth) -> None:
    assert httpx.get(f"{berth.api_url}/metrics", timeout=30).status_code in (401, 404)
    assert httpx.get(f"http://{METRICS_ADDR}/v2/sandboxes", timeout=30).status_code == 404
