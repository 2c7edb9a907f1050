"""The Grafana dashboard (deploy/grafana/batchrun.json) names only what the exporter emits, and
has a panel for each thing the product promises to show."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.paths import FAKE_NVML, ROOT

from batchrun.job.figures import JobFigures
from batchrun.metrics import names
from batchrun.metrics.recorder import CostMeter
from batchrun.openai.records import Outcome, Request
from batchrun.serve.metrics import Metrics

DASHBOARD = ROOT / "deploy" / "grafana" / "batchrun.json"
# A PromQL identifier followed by what may follow a metric name (a selector, a range, an
# operator, the end), not a function's parenthesis.
IDENTIFIER = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()")
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "le", "and",
                "or", "unless", "bool", "offset"}  # fmt: skip


def exported_samples(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Every sample name a server's /metrics shows with everything on: a GPU (a fake pynvml),
    a cost, a time to first token, its gauges and batches."""
    monkeypatch.syspath_prepend(str(FAKE_NVML))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    metrics = Metrics()
    metrics.gauges = lambda: {
        "queue_depth": 3,
        "batches": {"completed": 1},
        "requests": {"succeeded": 1, "failed": 0},
    }
    run = metrics.run
    run.cost = CostMeter(2.0)
    run.job_figures = lambda: JobFigures(
        valid=2, invalid=1, succeeded=1, failed=1, pending=0, attempts=3, engine_attempts=3,
        deduplicated=0, cache_hits=0, prompt_tokens=5, completion_tokens=5,
        engine_completion_tokens=5, run_walls=[1.5], cost={"usd": 0.1}, first_time=1.0,
        last_time=2.0, workers=[{"worker": 0, "requests": 3, "tokens_per_s": 2.5}],
    )  # fmt: skip
    run.in_flight = lambda: 1
    run.batch_size = lambda: 8
    request = Request("a", 1, "/v1/completions", {})
    run.dispatched([request])
    run.results([(Outcome("a", True, 200, ttft_s=0.01), request)])
    text = generate_latest(run.registry).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def expressions() -> list[tuple[str, str]]:
    """(panel title, PromQL expression) of every target of every panel."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (label names and values, keywords, durations and
    functions left out)."""
    without_labels = re.sub(r"\{[^}]*\}", "", expr)
    without_ranges = re.sub(r"\[[^\]]*\]", "", without_labels)
    without_groupings = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", without_ranges)
    return {
        name
        for name in IDENTIFIER.findall(without_groupings)
        if name not in PROMQL_WORDS and not re.fullmatch(r"\d.*|e\d+", name)
    }


def test_every_expression_names_only_what_the_exporter_emits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A renamed metric fails here, not on a dashboard that shows no data."""
    exported = exported_samples(monkeypatch)
    assert {f"{n}_bucket" for n in names.HISTOGRAMS} <= exported
    seen: set[str] = set()
    for title, expr in expressions():
        found = metric_names(expr)
        assert found, f"{title}: no metric in {expr!r}"
        unknown = found - exported
        assert not unknown, f"{title}: {expr!r} names {sorted(unknown)}, not exported"
        seen |= found
    # Every family the product exports is on the dashboard, serve's batchrun_batches too.
    stems = {re.sub(r"_(bucket|sum|count)$", "", s) for s in seen}
    assert set(names.FAMILIES) <= stems


def test_every_selector_takes_the_job_variable() -> None:
    """Each metric selected is scoped by the dashboard's $job (the scrape job, or the
    Pushgateway's job="batchrun"), a variable of Prometheus' job label whose "All" is every job."""
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == "job"]
    assert variable["query"]["query"] == "label_values(batchrun_requests_total, job)"
    assert variable["includeAll"] and variable["allValue"] == ".+"
    for title, expr in expressions():
        for name in metric_names(expr):
            selectors = re.findall(rf"\b{name}(\{{[^}}]*\}})?", expr)
            assert selectors and all(s.startswith('{job=~"$job"') for s in selectors), (
                f"{title}: {name} without the $job selector in {expr!r}"
            )


def test_the_prometheus_example_scrapes_jobs_and_the_pushgateway() -> None:
    """deploy/grafana/prometheus.yml: the job's port, and the Pushgateway with honor_labels (its
    job="batchrun" and job_id kept, not renamed exported_job)."""
    config = yaml.safe_load((DASHBOARD.parent / "prometheus.yml").read_text())
    jobs = {c["job_name"]: c for c in config["scrape_configs"]}
    assert jobs["batchrun-jobs"]["static_configs"][0]["targets"] == ["127.0.0.1:9400"]
    gateway = jobs["batchrun-pushgateway"]
    assert gateway["honor_labels"] is True
    assert gateway["static_configs"][0]["targets"] == ["127.0.0.1:9091"]


def test_metric_names_reads_promql() -> None:
    """The parser of the test itself: selectors, ranges, groupings and functions."""
    expr = (
        "histogram_quantile(0.99, sum by (le) (rate(batchrun_request_latency_seconds_bucket"
        '{job="x"}[5m]))) / clamp_min(sum(rate(batchrun_tokens_total{kind=~"a|b"}[5m])), 1e-9)'
    )
    assert metric_names(expr) == {
        "batchrun_request_latency_seconds_bucket",
        "batchrun_tokens_total",
    }


def test_the_dashboard_has_the_panels_the_design_asks_for() -> None:
    """Throughput, latency p50/p99, queue depth, error rate, tokens/s, GPU memory and
    utilization, restarts and OOM back-offs, cost; importable (a datasource input)."""
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] == "batchrun" and dashboard["uid"] == "batchrun"
    assert any(i["type"] == "datasource" for i in dashboard["templating"]["list"])
    exprs = " ".join(e for _, e in expressions())
    assert "histogram_quantile(0.5," in exprs and "histogram_quantile(0.99," in exprs
    for needed in (
        "rate(batchrun_requests_total",
        "batchrun_queue_depth",
        'outcome=~"failed|invalid"',
        "rate(batchrun_tokens_total",
        "batchrun_gpu_memory_used_bytes",
        "batchrun_gpu_utilization_ratio",
        "batchrun_engine_restarts_total",
        "batchrun_oom_backoffs_total",
        "batchrun_cost_usd_total",
    ):
        assert needed in exprs, needed
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
