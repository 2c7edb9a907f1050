"""What crosses between the parent and its workers, and the echo engine's cheap paths.

Requests and outcomes pickle by their fields; a worker sends each response body as its JSON (a
msgspec.Raw), which the journal writes as it is. The echo engine's ids and its max_tokens fast
path must give what the slow ways gave.
"""

from __future__ import annotations

import os
import pickle
import random
import re
from multiprocessing.reduction import ForkingPickler

import msgspec

from batchrun.config import EngineSettings
from batchrun.engines import echo
from batchrun.job.journal import encode_body
from batchrun.openai import response_bodies
from batchrun.openai.params import Sampling
from batchrun.openai.records import CHAT, COMPLETIONS, Outcome, Request
from batchrun.workers import child


def roundtrip(obj: object) -> object:
    return pickle.loads(bytes(ForkingPickler.dumps(obj)))


def test_requests_and_outcomes_pickle_by_their_fields() -> None:
    request = Request(custom_id="a", line=3, url=CHAT, body={"messages": [{"role": "user"}]})
    assert roundtrip(request) == request
    out = Outcome(
        custom_id="a", ok=False, status_code=500, error={"code": "x", "message": "y"},
        prompt_tokens=1, completion_tokens=2, latency_s=0.5, retryable=True, extra={"k": 1},
    )  # fmt: skip
    assert roundtrip(out) == out
    body = {"id": "cmpl-1", "choices": [], "usage": {"prompt_tokens": 1}}
    sent = Outcome(custom_id="b", ok=True, status_code=200, body=encode_body(body))
    back = roundtrip([sent, sent])
    assert isinstance(back, list)
    assert type(back[0].body) is msgspec.Raw
    assert msgspec.json.decode(back[0].body) == body
    assert (back[0].custom_id, back[0].ok, back[0].status_code) == ("b", True, 200)


def test_response_ids_look_like_uuid_hex_and_do_not_repeat() -> None:
    ids = [response_bodies.response_id() for _ in range(10_000)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_forked_child_draws_ids_of_its_own() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report one id, and leave without running anything else
        os.write(write, response_bodies.response_id().encode())
        os._exit(0)
    os.close(write)
    theirs = os.read(read, 64).decode()
    os.waitpid(pid, 0)
    os.close(read)
    mine = {response_bodies.response_id() for _ in range(100)}
    assert re.fullmatch(r"[0-9a-f]{32}", theirs) and theirs not in mine
    assert abs(int(theirs, 16) - int(next(iter(mine)), 16)) > 10**6  # not our sequence


def old_limit(params: Sampling, text: str) -> tuple[str, str]:
    """The echo engine's cut as it was: split into words first, always."""
    for s in params.stop:
        if s and s in text:
            text = text[: text.index(s)]
    limit = params.max_tokens
    words = re.findall(r"\s*\S+", text)
    if limit is not None and limit < len(words):
        return "".join(words[:limit]), "length"
    return text, "stop"


def test_the_echo_cut_is_the_same_with_and_without_its_fast_path() -> None:
    rng = random.Random(3)
    pieces = ["a", "bb", " ", "  ", "\n", "\t", "\u3000", "\xa0", "stop", "é", "x.y", ""]
    for _ in range(5000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        # Every value validation lets through: max_tokens at least 1, stop strings.
        params = Sampling(
            max_tokens=rng.choice([None, 1, 2, 3, 4, 5]),
            stop=rng.choice([(), ("stop",), ("bb", "x"), ("",)]),
        )
        expected = old_limit(params, text)
        assert echo._limit(params, text) == expected, (text, params)
        assert echo._limit(params, text, len(text.split())) == expected, (text, params)


def test_an_echo_reply_with_n_choices_and_echo_keeps_its_shape() -> None:
    engine = echo.EchoEngine(EngineSettings(engine="echo"))
    request = Request(
        custom_id="a", line=1, url=COMPLETIONS,
        body={"prompt": "one two three four", "max_tokens": 2, "n": 3, "echo": True},
    )  # fmt: skip
    out = engine._finish(request, 0.0)
    assert out.body is not None and not isinstance(out.body, msgspec.Raw)
    assert [c["text"] for c in out.body["choices"]] == ["one two three four" + "one two"] * 3
    assert [c["index"] for c in out.body["choices"]] == [0, 1, 2]
    assert {c["finish_reason"] for c in out.body["choices"]} == {"length"}
    assert out.body["usage"] == {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}
    assert out.completion_tokens == 6
    assert response_bodies.holds_no_float(out.body)


def test_bodies_with_logprobs_tools_or_metadata_may_hold_floats() -> None:
    engine = echo.EchoEngine(EngineSettings(engine="echo"))
    chat = {"messages": [{"role": "user", "content": "hi there"}]}
    for extra, plain in [
        ({}, True),
        ({"logprobs": True}, False),
        ({"metadata": {"k": "v"}}, False),
    ]:
        request = Request(custom_id="a", line=1, url=CHAT, body={**chat, **extra})
        out = engine._finish(request, 0.0)
        assert out.body is not None and not isinstance(out.body, msgspec.Raw)
        assert response_bodies.holds_no_float(out.body) is plain
    embedding = engine._finish(
        Request(custom_id="e", line=1, url="/v1/embeddings", body={"input": "x"}), 0.0
    )
    assert embedding.body is not None and not isinstance(embedding.body, msgspec.Raw)
    # Its vectors travel as base64 float32 (openai/vectors.py): no float text to check.
    assert response_bodies.holds_no_float(embedding.body)
    score = {"object": "list", "data": [{"index": 0, "score": 0.5}], "usage": {}}
    assert not response_bodies.holds_no_float(score)


def test_results_go_in_messages_of_bounded_size_in_order() -> None:
    """A step's outcomes, bodies pre-encoded, split so that no message holds more than
    MESSAGE_BYTES of bodies (one larger body alone), in their order."""
    engine = echo.EchoEngine(EngineSettings(engine="echo"))
    out = [
        engine._finish(
            Request(f"e{i}", i + 1, "/v1/embeddings", {"input": f"t{i}", "dimensions": 1024}), 0.0
        )
        for i in range(100)
    ]
    messages = child._messages(out)
    assert [o.custom_id for m in messages for o in m] == [f"e{i}" for i in range(100)]
    # A body's bytes and its vectors' (split out of it: openai/vectors.py).
    sizes = [sum(len(o.body) + sum(map(len, o.vectors or ())) for o in m) for m in messages]  # type: ignore[arg-type]
    assert len(messages) > 1 and max(sizes) <= child.MESSAGE_BYTES
    assert all(type(o.body) is msgspec.Raw for m in messages for o in m)
    huge = Outcome("h", True, 200, body={"text": "x" * (2 * child.MESSAGE_BYTES)})
    assert [len(m) for m in child._messages([huge, *out[:2]])] == [1, 2]
    assert child._messages([]) == [[]]
