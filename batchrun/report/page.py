"""The report as one HTML page: styles, data, Chart.js and the code that draws the charts all
inline, and a Content-Security-Policy that lets the page fetch nothing at all."""

from __future__ import annotations

import datetime as dt
import html
import math
from importlib import resources
from typing import Any

from batchrun.job.strict_json import strict_dumps
from batchrun.report.data import MAX_POINTS, ReportData

# Bars of the latency and queue-wait distributions.
DISTRIBUTION_BARS = 30
CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data:; base-uri 'none'; form-action 'none'"
)


def chart_js() -> str:
    """Chart.js (MIT, vendored under batchrun/report/vendor with its licence)."""
    return (
        resources.files("batchrun.report")
        .joinpath("vendor/chart.umd.min.js")
        .read_text(encoding="utf-8")
    )


def render(data: ReportData) -> str:
    """The whole page."""
    payload = _payload(data)
    facts = _facts(data)
    body = "\n".join(
        [
            f"<h1>batchrun report: {_e(data.job_id)}</h1>",
            f'<p class="sub">{_e(str(data.job_dir))} &middot; {_e(data.status)} &middot; '
            f"made {_e(_clock(data.made_at))}</p>",
            '<section class="tiles">' + "".join(_tile(k, v) for k, v in facts) + "</section>",
            _chart("throughput", "Throughput over time"),
            _chart("latency", "Latency (in the engine, per attempt): " + _pcts(data, "latency")),
            _chart("queue", "Queue wait (run start to the engine): " + _pcts(data, "queue")),
            _chart("errors", "Errors by code"),
            _examples(data),
            _chart("batch", "Batch size, restarts and out-of-memory back-offs over time"),
            _chart("workers", "Per-worker throughput"),
        ]
    )
    # Strict JSON (JSON.parse refuses Infinity): an overflowed cost is null, as in status --json.
    data_json = strict_dumps(payload, separators=(",", ":")).replace("<", "\\u003c")
    return _TEMPLATE.format(
        csp=CSP,
        title=_e(f"batchrun report {data.job_id}"),
        style=_STYLE,
        body=body,
        data=data_json,
        chartjs=chart_js().replace("</script", "<\\/script"),
        draw=_DRAW,
    )


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _clock(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _tile(label: str, value: str) -> str:
    return (
        f'<div class="tile"><div class="v">{_e(value)}</div><div class="k">{_e(label)}</div></div>'
    )


def _chart(key: str, title: str) -> str:
    return (
        f'<section class="chart"><h2>{_e(title)}</h2>'
        f'<div class="box"><canvas id="chart-{key}" data-chart="{key}"></canvas></div></section>'
    )


def _seconds(value: float | None, digits: int = 3) -> str:
    """`12.3 µs`, `4.56 ms`, `1.23 s`, `1,234 s`: `digits` significant digits below 100 s."""
    if value is None:
        return "-"
    if value < 1e-3:
        return f"{value * 1e6:.{digits}g} µs"
    if value < 0.1:
        return f"{value * 1000:.{digits}g} ms"
    return f"{value:.{digits}g} s" if value < 100 else f"{value:,.0f} s"


def _labels(values: list[float]) -> list[str]:
    """Each value as `_seconds` writes it, with as many digits as it takes for the labels of
    different values to differ (a narrow distribution's bars read alike at 3)."""
    for digits in range(3, 10):
        labels = [_seconds(v, digits) for v in values]
        if len(set(labels)) == len(labels):
            return labels
    return labels


def _pcts(data: ReportData, which: str) -> str:
    h = data.timing.latency if which == "latency" else data.timing.queue
    return f"p50 {_seconds(h.quantile(0.5))}, p99 {_seconds(h.quantile(0.99))}"


def _facts(data: ReportData) -> list[tuple[str, str]]:
    f, t = data.figures, data.timing
    errors = f.timing.get("errors") or {}
    rate = errors.get("rate")
    facts = [
        ("requests", f"{f.total:,}"),
        ("succeeded", f"{f.succeeded:,}"),
        ("failed", f"{f.failed:,}"),
        ("invalid lines", f"{f.invalid:,}"),
        ("pending", f"{f.pending:,}"),
        ("attempts", f"{f.attempts:,} ({f.engine_attempts:,} by the engine)"),
        ("error rate", f"{rate:.2%}" if rate is not None else "-"),
        ("prompt tokens", f"{f.prompt_tokens:,}"),
        ("generated tokens", f"{f.completion_tokens:,}"),
        ("latency p50 / p99", f"{_seconds(t.latency.quantile(0.5))} / {_seconds(t.latency.quantile(0.99))}"),
        ("queue p50 / p99", f"{_seconds(t.queue.quantile(0.5))} / {_seconds(t.queue.quantile(0.99))}"),
        (
            "prefix-cache hit rate",
            f"{data.prefix_cache['hit_rate']:.1%}" if data.prefix_cache else "not counted",
        ),
        ("duplicates answered", f"{f.deduplicated:,} (engine runs saved)"),
        ("answers from the cache", f"{f.cache_hits:,} (engine runs saved)"),
        ("wall time", f"{_seconds(f.wall_s)} over {len(f.run_walls)} run(s)"),
    ]  # fmt: skip
    if f.cost:
        per = f.cost.get("usd_per_million_tokens")
        facts.append(("cost", f"${f.cost['usd']:,.4f}"))
        facts.append(("cost per million tokens", f"${per:,.4f}" if per is not None else "-"))
    else:
        facts.append(("cost", "not recorded (--gpu-hour-cost)"))
    facts.append(("model", f"{data.model} on {data.engine}"))
    return facts


def _examples(data: ReportData) -> str:
    if not data.examples:
        return '<section class="examples"><h2>Error examples</h2><p>No errors.</p></section>'
    rows = []
    for code, examples in sorted(data.examples.items()):
        for ex in examples:
            rows.append(
                f"<tr><td>{_e(code)}</td><td>{ex['line']}</td>"
                f"<td>{_e(str(ex['custom_id'] or '-'))}</td><td>{_e(ex['message'])}</td></tr>"
            )
    return (
        '<section class="examples"><h2>Error examples (a few per code)</h2><table>'
        "<tr><th>code</th><th>line</th><th>custom_id</th><th>message</th></tr>"
        + "".join(rows)
        + "</table></section>"
    )


def _over_time(data: ReportData) -> dict[str, Any]:
    """Requests/s (succeeded, failed) and generated tokens/s per bin, at most MAX_POINTS bins,
    x in seconds since the job's first run started (`data.origin`: never negative)."""
    if not data.per_second:
        return {"x": [], "ok": [], "failed": [], "tokens": [], "width": 1}
    first, last = min(data.per_second), max(data.per_second)
    width = max(1, math.ceil((last - first + 1) / MAX_POINTS))
    bins: dict[int, list[int]] = {}
    for second, (ok, failed, tokens) in data.per_second.items():
        b = bins.setdefault((second - first) // width, [0, 0, 0])
        b[0] += ok
        b[1] += failed
        b[2] += tokens
    keys = range(0, (last - first) // width + 1)
    return {
        "x": [first + k * width for k in keys],
        "ok": [bins.get(k, [0, 0, 0])[0] / width for k in keys],
        "failed": [bins.get(k, [0, 0, 0])[1] / width for k in keys],
        "tokens": [bins.get(k, [0, 0, 0])[2] / width for k in keys],
        "width": width,
    }


def _distribution(buckets: list[tuple[float, float, int]]) -> dict[str, Any]:
    """At most DISTRIBUTION_BARS bars between the least and the largest value, log-spaced."""
    if not buckets:
        return {"labels": [], "counts": []}
    low = max(min(b[0] for b in buckets), 1e-6)
    high = max(b[1] for b in buckets)
    if high <= low * 1.0001:
        return {"labels": _labels([low]), "counts": [sum(b[2] for b in buckets)]}
    step = (math.log(high) - math.log(low)) / DISTRIBUTION_BARS
    counts = [0] * DISTRIBUTION_BARS
    for lo, hi, n in buckets:
        mid = math.sqrt(max(lo, 1e-6) * hi)
        i = min(DISTRIBUTION_BARS - 1, max(0, int((math.log(mid) - math.log(low)) / step)))
        counts[i] += n
    labels = _labels([math.exp(math.log(low) + (i + 0.5) * step) for i in range(len(counts))])
    return {"labels": labels, "counts": counts}


def _payload(data: ReportData) -> dict[str, Any]:
    """What the page's script draws."""
    errors = sorted(data.timing.by_code.items(), key=lambda kv: -kv[1])
    start = data.origin
    batch = [
        {
            "x": max(0.0, round(e["time"] - start, 1)),
            "y": e.get("batch_size"),
            "worker": e.get("worker"),
        }
        for e in data.events
        if e["kind"] in ("ready", "batch_size", "oom_backoff") and e.get("batch_size")
    ]
    if batch and data.per_second:
        # The size holds until the last result: the line runs to the end of the job.
        end = float(max(data.per_second) + 1)
        if end > batch[-1]["x"]:
            batch.append({"x": end, "y": batch[-1]["y"], "worker": batch[-1]["worker"]})
    restarts = [
        {"x": max(0.0, round(e["time"] - start, 1)), "y": 1, "reason": e.get("reason")}
        for e in data.events
        if e["kind"] == "restart"
    ]
    backoffs = [
        {"x": max(0.0, round(e["time"] - start, 1)), "y": e.get("batch_size")}
        for e in data.events
        if e["kind"] == "oom_backoff"
    ]
    # The same rows as `status --json`'s workers (job/figures.py), the rates over each worker's
    # own active time; the chart reads `attempts`.
    workers = [{**w, "attempts": w["requests"]} for w in data.workers]
    f = data.figures
    return {
        # The figures the tiles show, for scripts (job/figures.py; docs/metrics.md).
        "counts": f.counts,
        "attempts": f.attempts,
        "engine_attempts": f.engine_attempts,
        "cache_hits": f.cache_hits,
        "deduplicated": f.deduplicated,
        "tokens": {"prompt": f.prompt_tokens, "completion": f.completion_tokens},
        "wall_s": round(f.wall_s, 3),
        "cost": f.cost,
        "errors_rate": (f.timing.get("errors") or {}).get("rate"),
        "throughput": _over_time(data),
        "latency": _distribution(data.timing.latency.counts()),
        "queue": _distribution(data.timing.queue.counts()),
        "errors": {"labels": [c for c, _ in errors], "counts": [n for _, n in errors]},
        "batch": {"sizes": batch, "restarts": restarts, "backoffs": backoffs},
        "workers": workers,
    }


_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;
max-width:1100px;color:#1b1f24;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:16px;margin:0 0 8px}.sub{color:#57606a;margin:0 0 16px}
.tiles{display:grid;grid-template-columns:repeat(auto-fill,minmax(170px,1fr));gap:8px;margin-bottom:16px}
.tile{border:1px solid #d0d7de;border-radius:6px;padding:8px 10px}
.tile .v{font-size:17px;font-weight:600;overflow-wrap:anywhere}.tile .k{color:#57606a;font-size:12px}
.chart,.examples{border:1px solid #d0d7de;border-radius:6px;padding:12px;margin-bottom:16px}
.box{position:relative;height:280px}
table{border-collapse:collapse;width:100%;font-size:13px}
td,th{border-bottom:1px solid #eaeef2;padding:4px 6px;text-align:left;vertical-align:top}
td:last-child{overflow-wrap:anywhere}
.empty{color:#57606a;font-style:italic}
"""

# Draws every chart from the JSON data; marks the body with how many it drew (the browser test
# reads it). No animation: the page is read as it first shows, or printed.
_DRAW = r"""
(function () {
  var data = JSON.parse(document.getElementById('report-data').textContent);
  Chart.defaults.animation = false;
  Chart.defaults.maintainAspectRatio = false;
  var drawn = 0;
  function draw(key, config, has) {
    var canvas = document.getElementById('chart-' + key);
    if (!has) {
      var p = document.createElement('p');
      p.className = 'empty';
      p.textContent = 'Nothing to show yet.';
      var box = canvas.parentNode;
      box.parentNode.replaceChild(p, box);
      return;
    }
    new Chart(canvas, config);
    drawn += 1;
  }
  var secs = {type: 'linear', min: 0,
    title: {display: true, text: "seconds since the job's first run started"}};
  var t = data.throughput;
  // One bin (a job of a second or less) is one point: drawn as a dot, not as a line of none.
  var dot = t.x.length === 1 ? 4 : 0;
  function xy(ys) { return ys.map(function (y, i) { return {x: t.x[i], y: y}; }); }
  draw('throughput', {type: 'line', data: {datasets: [
    {label: 'succeeded/s', data: xy(t.ok), borderColor: '#2da44e', backgroundColor: '#2da44e',
     pointRadius: dot, yAxisID: 'y'},
    {label: 'failed/s', data: xy(t.failed), borderColor: '#cf222e', backgroundColor: '#cf222e',
     pointRadius: dot, yAxisID: 'y'},
    {label: 'generated tokens/s', data: xy(t.tokens), borderColor: '#0969da',
     backgroundColor: '#0969da', pointRadius: dot, yAxisID: 'y1'}]},
    options: {scales: {x: secs, y: {title: {display: true, text: 'requests/s'}, beginAtZero: true},
      y1: {position: 'right', beginAtZero: true, grid: {drawOnChartArea: false},
        title: {display: true, text: 'tokens/s'}}}}}, t.x.length > 0);
  ['latency', 'queue'].forEach(function (key) {
    var d = data[key];
    draw(key, {type: 'bar', data: {labels: d.labels, datasets: [
      {label: 'attempts', data: d.counts, backgroundColor: key === 'latency' ? '#0969da' : '#8250df'}]},
      options: {scales: {y: {beginAtZero: true, title: {display: true, text: 'attempts'}}}}},
      d.counts.length > 0);
  });
  var e = data.errors;
  draw('errors', {type: 'bar', data: {labels: e.labels, datasets: [
    {label: 'failed attempts and invalid lines', data: e.counts, backgroundColor: '#cf222e'}]},
    options: {indexAxis: 'y', scales: {x: {beginAtZero: true}}}}, e.counts.length > 0);
  var b = data.batch;
  draw('batch', {data: {datasets: [
    {type: 'line', label: 'batch size', data: b.sizes, stepped: true, borderColor: '#0969da',
     yAxisID: 'y'},
    {type: 'scatter', label: 'out-of-memory back-off (new size)', data: b.backoffs,
     backgroundColor: '#cf222e', pointRadius: 6, pointStyle: 'triangle', yAxisID: 'y'},
    {type: 'scatter', label: 'engine restart', data: b.restarts, backgroundColor: '#bf8700',
     pointRadius: 6, pointStyle: 'rectRot', yAxisID: 'y1'}]},
    options: {scales: {x: secs, y: {beginAtZero: true, title: {display: true, text: 'batch size'}},
      y1: {position: 'right', display: false, min: 0, max: 2}}}},
    b.sizes.length + b.restarts.length + b.backoffs.length > 0);
  var w = data.workers;
  draw('workers', {type: 'bar', data: {labels: w.map(function (x) { return x.label; }), datasets: [
    {label: 'attempts/s', data: w.map(function (x) { return x.requests_per_s; }),
     backgroundColor: '#2da44e', yAxisID: 'y'},
    {label: 'generated tokens/s', data: w.map(function (x) { return x.tokens_per_s; }),
     backgroundColor: '#0969da', yAxisID: 'y1'}]},
    options: {scales: {y: {beginAtZero: true, title: {display: true, text: 'attempts/s'}},
      y1: {position: 'right', beginAtZero: true, grid: {drawOnChartArea: false},
        title: {display: true, text: 'tokens/s'}}}}}, w.length > 0);
  document.body.setAttribute('data-charts-drawn', String(drawn));
})();
"""

_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{style}</style>
</head>
<body>
{body}
<script type="application/json" id="report-data">{data}</script>
<script>{chartjs}</script>
<script>{draw}</script>
</body>
</html>
"""
