"""The remote engine's pure parts: the AIMD flow window, what a server's answer means, and where
a line goes (batchrun/engines/remote/)."""

from __future__ import annotations

import base64
import json
import struct
from email.utils import formatdate

import msgspec
import pytest

from batchrun.engines.remote.answers import (
    MAX_RETRY_AFTER_S,
    AuthRefused,
    Retry,
    parse_retry_after,
    verdict,
)
from batchrun.engines.remote.flow import (
    MIN_GAP_S,
    START_WINDOW,
    FlowWindow,
)
from batchrun.engines.remote.urls import endpoint_url, models_url
from batchrun.openai.records import Outcome, Request


def _request(url: str = "/v1/chat/completions", **body: object) -> Request:
    return Request(custom_id="a", line=1, url=url, body=dict(body))


def test_a_window_starts_small_and_within_its_cap() -> None:
    assert FlowWindow(cap=256).limit() == START_WINDOW
    assert FlowWindow(cap=4).limit() == 4
    with pytest.raises(ValueError):
        FlowWindow(cap=0)


def test_slow_start_doubles_a_used_window_while_latency_holds() -> None:
    flow = FlowWindow(cap=1024)
    for i in range(START_WINDOW):
        flow.succeeded(now=float(i), latency_s=1.0, tokens=10, in_flight=flow.limit())
    assert flow.limit() == 2 * START_WINDOW


def test_an_unused_window_does_not_grow() -> None:
    flow = FlowWindow(cap=256)
    for i in range(100):
        flow.succeeded(now=float(i), latency_s=1.0, tokens=10, in_flight=2)
    assert flow.limit() == START_WINDOW


def test_the_window_never_passes_its_cap() -> None:
    flow = FlowWindow(cap=20)
    for i in range(200):
        flow.succeeded(now=float(i), latency_s=1.0, tokens=10, in_flight=flow.limit())
    assert flow.limit() == 20


def test_congestion_halves_once_a_round_trip_then_growth_is_additive() -> None:
    flow = FlowWindow(cap=256, window=64.0)
    flow.succeeded(now=0.0, latency_s=2.0, tokens=10, in_flight=0)
    flow.congested(now=10.0)
    # Forty throttled answers to requests sent together: one signal, not forty.
    for _ in range(40):
        flow.congested(now=10.5)
    assert flow.limit() == 32 and flow.decreases == 1
    # Answers again, then throttled again a round trip later: a new episode, a new threshold.
    flow.succeeded(now=11.0, latency_s=2.0, tokens=10, in_flight=0)
    flow.congested(now=10.0 + max(MIN_GAP_S, flow.round_trip or 0) + 0.1)
    assert flow.limit() == 16 and flow.ssthresh == 16
    # Past slow start: about a tenth of the window (at least one) per round trip of successes.
    for i in range(16):
        flow.succeeded(now=20.0 + i, latency_s=2.0, tokens=10, in_flight=16)
    assert flow.limit() == 17


def test_after_an_outage_the_window_doubles_back_to_half_what_it_was() -> None:
    flow = FlowWindow(cap=256, window=64.0)
    flow.succeeded(now=0.0, latency_s=0.5, tokens=10, in_flight=0)
    # The server is gone for a minute: a decrease every round trip, down to one.
    for t in range(1, 60):
        flow.congested(now=float(t))
    assert flow.limit() == 1 and flow.ssthresh == 32
    # It is back: slow start to 32 (one more a success), then a tenth a round trip.
    for i in range(31):
        flow.succeeded(now=100.0 + i, latency_s=0.5, tokens=10, in_flight=flow.limit())
    assert flow.limit() == 32
    flow.succeeded(now=200.0, latency_s=0.5, tokens=10, in_flight=32)
    assert flow.limit() == 32


def test_retry_after_holds_new_sends_until_it_passes() -> None:
    flow = FlowWindow(cap=64)
    flow.congested(now=100.0, retry_after_s=3.0)
    assert flow.paused(101.0) and flow.paused(102.9)
    assert not flow.paused(103.0)


def test_rising_latency_shrinks_the_window() -> None:
    flow = FlowWindow(cap=256, window=100.0, ssthresh=0.0)
    for i in range(20):
        flow.succeeded(now=float(i), latency_s=1.0, tokens=10, in_flight=100)
    grown = flow.limit()
    # The server starts queueing: each answer takes ten times as long per token.
    for i in range(5):
        flow.succeeded(now=30.0 + i * 20, latency_s=10.0, tokens=10, in_flight=100)
    assert flow.limit() < grown
    assert flow.decreases >= 1


def test_latency_that_buys_throughput_is_no_reason_to_shrink() -> None:
    """A CPU server: each step costs more the more it batches (latency per token grows as the
    square root of the window), yet tokens a second still grow with it."""
    flow = FlowWindow(cap=256)
    for i in range(2000):
        w = flow.limit()
        flow.succeeded(now=float(i), latency_s=0.01 * w**0.5 * 20, tokens=20, in_flight=w)
    assert flow.limit() == 256 and flow.decreases == 0


def test_a_saturated_server_s_window_stops_growing_without_losing_throughput() -> None:
    """A server that runs 32 at once and queues the rest: past 32, latency grows with the
    window and the rate does not. The window comes down from the cap it would otherwise reach,
    and stays at or above 32, where the rate is the best. (A window that starts above a
    server's capacity finds no better rate below it: it leaves the server its queue, which
    costs the job no throughput.)"""
    flow = FlowWindow(cap=256, window=16.0)
    seen = []
    for i in range(3000):
        w = flow.limit()
        flow.succeeded(now=i * 0.5, latency_s=0.5 * max(1.0, w / 32) * 20, tokens=20, in_flight=w)
        seen.append(flow.limit())
    assert flow.decreases >= 1
    late = seen[-1000:]
    assert min(late) >= 32 and sum(late) / len(late) < 160


def test_latency_is_compared_per_generated_token() -> None:
    """Long answers are not a rise: their latency per token holds."""
    flow = FlowWindow(cap=256, window=50.0, ssthresh=0.0)
    for i in range(30):
        tokens = 10 if i % 2 else 400
        flow.succeeded(now=float(i), latency_s=0.1 * tokens, tokens=tokens, in_flight=50)
    assert flow.decreases == 0


def test_a_line_s_url_goes_under_the_base_url() -> None:
    assert endpoint_url("http://h:8000/v1", "/v1/chat/completions") == (
        "http://h:8000/v1/chat/completions"
    )
    assert endpoint_url("http://h:8000/v1/", "/v1/embeddings") == "http://h:8000/v1/embeddings"
    assert endpoint_url("https://gw/openai", "/v1/score") == "https://gw/openai/v1/score"
    assert models_url("http://h:8000/v1") == "http://h:8000/v1/models"


def test_throttling_and_unavailability_are_waited_out() -> None:
    request = _request()
    for status in (429, 502, 503, 504, 408):
        found = verdict(request, status, b'{"error": {"message": "busy"}}', "2", 0.1)
        assert found == Retry(f"HTTP {status}: busy", 2.0)


def test_a_refused_key_stops_the_job() -> None:
    found = verdict(_request(), 401, b'{"error": {"message": "Invalid key"}}', None, 0.1)
    assert found == AuthRefused("the server refused the API key (HTTP 401: Invalid key)")


def test_a_client_error_is_the_line_s_answer_and_a_server_error_is_retried() -> None:
    raw = b'{"error": {"message": "The model `x` does not exist.", "type": "NotFoundError"}}'
    found = verdict(_request(), 404, raw, None, 0.1)
    assert isinstance(found, Outcome)
    assert (found.ok, found.status_code, found.retryable) == (False, 404, False)
    assert found.error == {"code": "NotFoundError", "message": "The model `x` does not exist."}
    found = verdict(_request(), 413, b"too big", None, 0.1)
    assert isinstance(found, Outcome)
    assert found.error == {
        "code": "request_too_large",
        "message": "HTTP 413 from the server: 'too big'",
    }
    found = verdict(_request(), 500, b'{"object": "error", "message": "boom"}', None, 0.1)
    assert isinstance(found, Outcome)
    assert (found.status_code, found.retryable, found.error) == (
        500,
        True,
        {"code": "server_error", "message": "boom"},
    )


def test_an_answer_that_is_not_openai_json_fails_the_attempt() -> None:
    found = verdict(_request(), 200, b"<html>proxy</html>", None, 0.1)
    assert isinstance(found, Outcome)
    assert (found.ok, found.status_code, found.retryable) == (False, 502, True)
    assert found.error == {
        "code": "invalid_response",
        "message": "the server's answer is not an OpenAI JSON object: '<html>proxy</html>'",
    }


def test_a_success_is_journaled_as_the_server_gave_it() -> None:
    body = {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9},
    }
    found = verdict(_request(), 200, json.dumps(body).encode(), None, 0.25)
    assert isinstance(found, Outcome) and found.ok
    assert (found.prompt_tokens, found.completion_tokens, found.latency_s) == (7, 2, 0.25)
    assert isinstance(found.body, msgspec.Raw)
    assert json.loads(bytes(found.body)) == body


def test_embeddings_are_kept_as_base64_float32_marked_when_floats_were_asked() -> None:
    body = {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": [0.5, -0.25]}],
        "usage": {"prompt_tokens": 2, "total_tokens": 2},
    }
    found = verdict(_request("/v1/embeddings", input="hi"), 200, json.dumps(body).encode(), None, 0)
    assert isinstance(found, Outcome) and isinstance(found.body, msgspec.Raw)
    kept = json.loads(bytes(found.body))
    assert next(iter(kept)) == "export_encoding" and kept["export_encoding"] == "float"
    vector = base64.b64decode(kept["data"][0]["embedding"])
    assert struct.unpack("<2f", vector) == (0.5, -0.25)


def test_retry_after_takes_seconds_or_a_date_and_is_bounded() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("-2") == 0.0
    assert parse_retry_after("99999") == MAX_RETRY_AFTER_S
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None
    date = formatdate(1_000_010.0, usegmt=True)
    assert parse_retry_after(date, now=1_000_000.0) == 10.0
