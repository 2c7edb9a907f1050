"""Time to first token: read from vLLM's RequestOutput.metrics, carried by the Outcome across the
worker's pipe, exported as batchrun_time_to_first_token_seconds only when an engine reports it."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import msgspec
import pytest

from batchrun.engines.vllm.ttft import first_token_s
from batchrun.metrics import names
from batchrun.metrics.recorder import RunMetrics
from batchrun.openai.records import Outcome, Request


@pytest.mark.slow
def test_first_token_comes_from_vllms_request_stats() -> None:
    """vLLM's own RequestOutput and RequestStateStats: the latency it measured, else None."""
    from vllm.outputs import RequestOutput
    from vllm.v1.metrics.stats import RequestStateStats

    def output(stats: RequestStateStats | None) -> RequestOutput:
        return RequestOutput(
            request_id="a",
            prompt="p",
            prompt_token_ids=[1],
            prompt_logprobs=None,
            outputs=[],
            finished=True,
            metrics=stats,
        )

    assert first_token_s(output(RequestStateStats(first_token_latency=0.125))) == 0.125
    assert first_token_s(output(RequestStateStats())) is None  # never measured: 0.0
    assert first_token_s(output(None)) is None  # stats off
    assert first_token_s(SimpleNamespace()) is None  # a pooling output has no metrics


def test_the_outcome_carries_it_across_the_pipe() -> None:
    """Pickled as the worker sends it, plain body or pre-encoded."""
    for body in ({"x": 1}, msgspec.Raw(b'{"x":1}')):
        outcome = Outcome("a", True, 200, body=body, latency_s=0.5, ttft_s=0.2)
        back = pickle.loads(pickle.dumps(outcome))
        assert back.ttft_s == 0.2 and back.latency_s == 0.5


def test_the_histogram_shows_only_when_an_engine_reports_it() -> None:
    """The echo engine measures none: no family (not an empty one); vLLM's: counted."""
    metrics = RunMetrics(gpus=False)
    request = Request("a", 1, "/v1/completions", {})
    metrics.results([(Outcome("a", True, 200), request)])
    assert names.TTFT not in {f.name for f in metrics.collect()}
    metrics.results([(Outcome("a", True, 200, ttft_s=0.03), request)])
    [family] = [f for f in metrics.collect() if f.name == names.TTFT]
    samples = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    assert samples[(names.TTFT + "_count", None)] == 1
    assert samples[(names.TTFT + "_bucket", "0.02")] == 0
    assert samples[(names.TTFT + "_bucket", "0.04")] == 1
