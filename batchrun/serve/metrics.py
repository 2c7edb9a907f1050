"""The server's counters, written as Prometheus text at GET /metrics."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

from batchrun.openai.records import Outcome


class Metrics:
    """Tokens (counters); requests by outcome, queue depth, batches by status and engine
    restarts come from `gauges`, read when the page is asked for."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.tokens = {"prompt": 0, "completion": 0}
        self.gauges: Callable[[], Mapping[str, object]] = dict

    def count(self, outcomes: Sequence[Outcome]) -> None:
        """Count the tokens of journaled outcomes."""
        with self._lock:
            self.tokens["prompt"] += sum(int(o.prompt_tokens or 0) for o in outcomes)
            self.tokens["completion"] += sum(int(o.completion_tokens or 0) for o in outcomes)

    def render(self) -> str:
        """The Prometheus text exposition."""
        with self._lock:
            tokens = dict(self.tokens)
        gauges = self.gauges()
        requests = gauges.get("requests", {"succeeded": 0, "failed": 0})
        assert isinstance(requests, Mapping)
        lines: list[str] = []
        # The batches' request_counts summed (invalid lines are failed requests), so that the
        # page and the API always agree.
        _family(
            lines,
            "batchrun_requests_total",
            "counter",
            "Requests of every batch by outcome: the sum of the batches' request_counts.",
            (({"outcome": k}, v) for k, v in requests.items()),
        )
        _family(
            lines,
            "batchrun_tokens_total",
            "counter",
            "Tokens of journaled attempts.",
            (({"kind": k}, v) for k, v in tokens.items()),
        )
        _family(
            lines,
            "batchrun_queue_depth",
            "gauge",
            "Requests of running batches not finished yet.",
            [({}, gauges.get("queue_depth", 0))],
        )
        by_status = gauges.get("batches", {})
        assert isinstance(by_status, Mapping)
        _family(
            lines,
            "batchrun_batches",
            "gauge",
            "Batches by status.",
            (({"status": k}, v) for k, v in sorted(by_status.items())),
        )
        _family(
            lines,
            "batchrun_engine_restarts_total",
            "counter",
            "Engine worker starts beyond the first of each worker.",
            [({}, gauges.get("engine_restarts", 0))],
        )
        return "\n".join(lines) + "\n"


def _family(
    lines: list[str],
    name: str,
    kind: str,
    help_text: str,
    samples: Iterable[tuple[dict[str, str], object]],
) -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")
    for labels, value in samples:
        shown = ",".join(f'{k}="{v}"' for k, v in labels.items())
        lines.append(f"{name}{{{shown}}} {value}" if shown else f"{name} {value}")
