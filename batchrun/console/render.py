"""Tables for people: the end-of-run summary (and `JobSummary`, what a command did: run/ builds
it, and is above console/), `status`, and the batch-size probes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from batchrun.console.failed_advice import failed_advice, lasting_note
from batchrun.console.model_table import print_models
from batchrun.console.text import plural
from batchrun.job.figures import job_figures
from batchrun.job.lasting import Lasting, lasting_failures
from batchrun.job.manifest import Manifest
from batchrun.job.model_counts import model_counts, several
from batchrun.job.paths import JobPaths, command
from batchrun.job.state import JobState
from batchrun.job.status import cache_rate, kv_cache_tokens


@dataclass
class JobSummary:
    """What a command did, for the summary table and the exit code."""

    job_dir: Path
    manifest: Manifest
    state: JobState
    wall_s: float
    run_completion_tokens: int = 0
    run_outcomes: int = 0
    # This run's prefix-cache counters (vLLM's: prompt tokens looked up, found cached).
    run_cache_queries: int = 0
    run_cache_hits: int = 0
    # The attempts this run's engine ran and their generated tokens (neither a duplicate's copy
    # nor an answer from the answer cache, --cache-dir).
    run_engine_attempts: int = 0
    run_engine_tokens: int = 0
    # The options resume or retry-failed replaced, as `--dtype bfloat16 (was banana)`.
    overrides: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        """Valid requests plus invalid lines."""
        return self.manifest.requests + self.manifest.invalid

    @property
    def exit_code(self) -> int:
        """0 when every request succeeded, 1 otherwise."""
        ok = self.state.succeeded == self.manifest.requests and self.state.invalid == 0
        return 0 if ok else 1


# The error codes the error rate row names, the most frequent first (status --json has all).
CODES_SHOWN = 5


def _fmt_rate(value: float | None, unit: str) -> str:
    return f"{value:,.1f} {unit}" if value else "-"


def print_summary(console: Console, summary: JobSummary, title: str) -> None:
    """The table printed when submit, resume or retry-failed ends: the job's figures (job/figures.py,
    as `status` shows them) and this run's."""
    m = summary.manifest
    # From the job's summary.json and the journal's tail (job/summary.py): not a second pass.
    figures, kept = job_figures(JobPaths(summary.job_dir), m, save=False)
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("job", f"{m.job_id} ({m.status})")
    table.add_row(
        "requests",
        f"{figures.total:,} ({figures.valid:,} valid, {plural(figures.invalid, 'invalid line')})",
    )
    table.add_row("succeeded", f"{figures.succeeded:,}")
    lasting = lasting_failures(figures.timing.get("errors"), figures.failed)
    table.add_row("failed", f"{figures.failed:,}{lasting_note(lasting)}")
    if figures.pending:
        table.add_row("pending", f"{figures.pending:,}")
    table.add_row(
        "tokens", f"{figures.prompt_tokens:,} prompt, {figures.completion_tokens:,} generated"
    )
    engine = summary.run_engine_attempts
    table.add_row(
        "this run",
        f"{plural(summary.run_outcomes, 'attempt')} in {summary.wall_s:,.1f}s"
        + (f" ({engine:,} by the engine)" if engine != summary.run_outcomes else ""),
    )
    wall = max(summary.wall_s, 1e-9)
    # Over the run's whole time, engine start included (status gives first to last result);
    # the engine's work only: a cache hit or a duplicate's copy costs it nothing.
    table.add_row(
        "throughput",
        f"{engine / wall:,.1f} req/s, {summary.run_engine_tokens / wall:,.1f} generated tok/s "
        "(the engine's, over the run's wall time)",
    )
    table.add_row("batch size", _batch_size(m.batch_size, m.batch_size_source))
    cache = cache_rate(summary.run_cache_queries, summary.run_cache_hits)
    if cache is not None:
        table.add_row("prefix cache", _hit_rate(cache) + " this run")
    kv = kv_cache_tokens(m)
    if kv is not None:
        table.add_row("kv cache", _kv_cache(kv))
    _savings_rows(table, figures.deduplicated, figures.cache_hits)
    if summary.overrides:
        table.add_row("overrides", ", ".join(summary.overrides))
    table.add_row("runs", _runs(len(m.runs), figures.wall_s))
    _timing_rows(table, {**figures.timing, "cost": figures.cost})
    table.add_row("job dir", str(summary.job_dir))
    console.print(table)
    models = model_counts(m, kept, figures.throughput()["completion_tokens_per_s"])
    if several(models):
        print_models(console, models)


def _runs(runs: int, wall_s: float) -> str:
    """`2 (93.4s in all)`: the job's runs and their wall time, killed runs included."""
    return f"{runs} ({wall_s:,.1f}s in all)"


def _savings_rows(table: Table, deduplicated: int, cache_hits: int) -> None:
    """The engine runs saved: duplicates answered by a copy, answers from the answer cache."""
    if deduplicated:
        table.add_row("deduplicated", _deduplicated(deduplicated))
    if cache_hits:
        table.add_row(
            "answer cache",
            f"{plural(cache_hits, 'answer')} from the cache (--cache-dir; engine runs saved)",
        )


def _timing_rows(table: Table, s: dict[str, Any]) -> None:
    """Latency and queue wait p50/p99, errors by code, cost: the summary's and status'."""
    for name, key, what in (
        ("latency", "latency_s", "in the engine, per attempt"),
        ("queue wait", "queue_s", "run start to the engine"),
    ):
        q = s.get(key) or {}
        if q.get("p50") is not None:
            table.add_row(name, f"p50 {_seconds(q['p50'])}, p99 {_seconds(q['p99'])} ({what})")
    errors = s.get("errors") or {}
    if errors.get("rate"):
        table.add_row("error rate", _error_rate(errors))
    cost = s.get("cost")
    if cost:
        per = cost.get("usd_per_million_tokens")
        table.add_row(
            "cost",
            f"${cost['usd']:,.4f}" + (f" (${per:,.4f} per million tokens)" if per else ""),
        )


def _error_rate(errors: dict[str, Any]) -> str:
    """`2.50% of attempts and invalid lines: engine_error 4 (2.00%), ...`: the most frequent
    codes, then how many more codes (and their failed attempts, invalid lines) were left out."""
    by_code = list(errors["by_code"].items())
    shown, rest = by_code[:CODES_SHOWN], by_code[CODES_SHOWN:]
    said = f"{errors['rate']:.2%} of attempts and invalid lines: " + ", ".join(
        f"{code} {e['count']:,} ({e['rate']:.2%})" for code, e in shown
    )
    if not rest:
        return said
    # by_code counts both; failed_by_code the failed attempts alone (job/timing.py).
    failed_by_code = errors.get("failed_by_code") or {}
    failed = sum(failed_by_code.get(code, 0) for code, _ in rest)
    lines = sum(e["count"] for _, e in rest) - failed
    what = [plural(failed, "failed attempt")] if failed else []
    what += [plural(lines, "invalid line")] if lines else []
    return (
        f"{said}, and {plural(len(rest), 'more code')} ({', '.join(what)}): "
        "batchrun status --json lists them"
    )


def _seconds(value: float) -> str:
    """`12.3µs`, `12.3ms`, `1.23s`, `123s`."""
    if value < 1e-3:
        return f"{value * 1e6:.1f}µs"
    if value < 0.1:
        return f"{value * 1000:.1f}ms"
    return f"{value:.2f}s" if value < 100 else f"{value:,.0f}s"


def next_step(summary: JobSummary) -> str:
    """What to run next: the command that makes progress (resume while requests are pending,
    retry-failed for failures a retry may fix, what else can for the others: console/
    failed_advice.py), or, for invalid input lines only, that nothing will."""
    st, job = summary.state, summary.job_dir
    pending = st.pending(summary.manifest.requests)
    if pending > 0:
        return f"{plural(pending, 'request')} not run yet; continue with: {command('resume', job)}"
    if st.failed:
        # Which failures a retry cannot fix: the job's errors tally (job/lasting.py).
        figures, _ = job_figures(JobPaths(job), summary.manifest, save=False)
        lasting = lasting_failures(figures.timing.get("errors"), st.failed)
        limit = summary.manifest.engine.get("max_model_len")
        return failed_advice(st.failed, lasting, job, limit if isinstance(limit, int) else None)
    if st.invalid:
        them = "it" if st.invalid == 1 else "them"
        # "Every valid request succeeded" would claim a success of none at all.
        valid = "Every valid request succeeded" if summary.manifest.requests else "No line is valid"
        return (
            f"{valid}; {plural(st.invalid, 'invalid input line')} cannot "
            f"run as written: `{command('export', job)}` writes the results (errors.jsonl names "
            f"each invalid line by its number); fix {them} in the input file, then "
            f"`{command('resume', job, '--force')}` runs {them}."
        )
    return f"Write the results with: {command('export', job)}"


def print_status(console: Console, s: dict[str, Any]) -> None:
    """The table of `batchrun status`."""
    r = s["requests"]
    table = Table(title=f"job {s['job_id']}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    state = s["status"] + (f" (pid {s['pid']})" if s.get("pid") else "")
    table.add_row("status", state)
    table.add_row("input", f"{s['input']} ({s['endpoint'] or 'no valid request'})")
    table.add_row("model", f"{s['model']} on {s['engine']}")
    table.add_row(
        "requests",
        f"{r['total']:,} total: {r['valid']:,} valid, {plural(r['invalid'], 'invalid line')}",
    )
    table.add_row("succeeded", f"{r['succeeded']:,}")
    lasting = Lasting(s.get("retry_cannot_fix") or {})
    table.add_row("failed", f"{r['failed']:,}{lasting_note(lasting)}")
    table.add_row("pending", f"{r['pending']:,}")
    table.add_row(
        "tokens", f"{s['tokens']['prompt']:,} prompt, {s['tokens']['completion']:,} generated"
    )
    t = s["throughput"]
    table.add_row(
        "throughput",
        f"{_fmt_rate(t['requests_per_s'], 'req/s')}, "
        f"{_fmt_rate(t['completion_tokens_per_s'], 'tok/s')} "
        "(the engine's, over the runs' wall time)",
    )
    table.add_row("batch size", _batch_size(s["batch_size"], s["batch_size_source"]))
    if s.get("prefix_cache"):
        table.add_row("prefix cache", _hit_rate(s["prefix_cache"]) + " (runs that ended)")
    if s.get("kv_cache_tokens"):
        table.add_row("kv cache", _kv_cache(s["kv_cache_tokens"]))
    _savings_rows(table, s.get("deduplicated") or 0, s.get("cache_hits") or 0)
    table.add_row("runs", _runs(s["runs"], s["wall_s"]))
    _timing_rows(table, s)
    console.print(table)
    if several(s.get("models") or {}):
        print_models(console, s["models"])


def print_probes(console: Console, probes: list[dict[str, Any]], chosen: int | None) -> None:
    """The batch-size probe table."""
    table = Table(title="batch-size probes", title_justify="left")
    # The measure's unit (run/sizing.Probe): prompt tokens for a pooling job; probes of an
    # older job have none, and measured generated tokens.
    units = {p.get("unit") or "generated tok/s" for p in probes}
    measure = units.pop() if len(units) == 1 else "tok/s"
    for col in ("size", "status", "requests", "time", measure, "peak memory"):
        table.add_column(col, justify="right")
    for p in probes:
        mark = " *" if p["size"] == chosen and p["ok"] else ""
        mem = f"{p['peak_memory_mb']:,.0f} MiB" if p.get("peak_memory_mb") else "-"
        table.add_row(
            f"{p['size']}{mark}",
            "ok" if p["ok"] else "OOM",
            str(p["requests"]),
            f"{p['seconds']:.2f}s",
            f"{p['tokens_per_s']:,.1f}",
            mem,
        )
    console.print(table)


def print_workers(console: Console, workers: list[dict[str, Any]]) -> None:
    """Per-worker progress."""
    table = Table(title="workers", title_justify="left")
    for col in ("worker", "where", "GPU", "attempts", "generated", "tok/s"):
        table.add_column(
            col, justify="right" if col in ("attempts", "generated", "tok/s") else "left"
        )
    for w in workers:
        gpus = w.get("gpus")
        table.add_row(
            w["label"],
            w.get("node") or ("this machine" if w.get("kind") != "ray" else "-"),
            ",".join(gpus) if isinstance(gpus, list) else (gpus or "-"),
            f"{w['requests']:,}",
            f"{w['completion_tokens']:,}",
            _fmt_rate(w.get("tokens_per_s"), ""),
        )
    console.print(table)


def _hit_rate(cache: dict[str, Any]) -> str:
    """`63.2% hit rate (12,345 of 19,530 prompt tokens found cached, vLLM's counters)`."""
    return (
        f"{cache['hit_rate']:.1%} hit rate ({cache['hits']:,} of {cache['queries']:,} prompt "
        "tokens found cached, vLLM's counters)"
    )


def _kv_cache(tokens: int) -> str:
    """`6,400 tokens a worker (the engine's figure at start)`."""
    return f"{tokens:,} tokens a worker (the engine's figure at start)"


def _deduplicated(count: int) -> str:
    """How many requests were first answered with a copy of an identical deterministic one's."""
    return (
        f"{plural(count, 'request')} answered from an identical one "
        f"({'its' if count == 1 else 'their'} engine runs saved)"
    )


def _batch_size(size: object, source: object) -> str:
    """The batch size and where it came from; none when nothing has run yet."""
    if not size:
        return "none yet (nothing has run)"
    return f"{size} ({source})" if source else str(size)
