"""A tiny OpenAI-compatible server in the test's process (aiohttp, a thread of its own), for the
remote engine's fast tests: its answers are deterministic, it records what it was sent, and it
throws the faults a test scripts (429 with Retry-After, 503, dropped connections, 401, 500,
an answer that is not JSON), one per request in the order they come."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from support.fakes.aiohttp_thread import serve_in_thread

MODEL = "fake-model"


@dataclass
class FakeServer:
    """The server's knobs (set before or while requests come) and what it saw."""

    models: list[str] = field(default_factory=lambda: [MODEL])
    # A key every request must carry (None: any); the models list not JSON.
    key: str | None = None
    broken_models: bool = False
    # Seconds each answer takes (concurrent requests overlap, like a batching server).
    delay_s: float = 0.0
    # Faults, each taken by the next POST: "429:SECONDS" (with Retry-After), a status ("503",
    # "502", "400", "401"; "500" with code "oops"), "drop" (the connection closed unanswered),
    # "notjson", "" (none); a POST when it is empty is answered.
    faults: deque[str] = field(default_factory=deque)
    # Every POST answered or refused: (path, body).
    received: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    # The most requests in flight at once, and now.
    peak_in_flight: int = 0
    in_flight: int = 0
    url: str = ""

    def answered_texts(self) -> list[str]:
        """The user texts of the chat requests sent, in order."""
        return [b["messages"][-1]["content"] for p, b in self.received if "messages" in b]


def _text(body: dict[str, Any]) -> str:
    if "messages" in body:
        return str(body["messages"][-1]["content"])
    return str(body.get("prompt", body.get("input", "")))


def answer(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The fake's deterministic answer to a body: the text back, reversed."""
    text = _text(body)[::-1]
    usage = {"prompt_tokens": 3, "completion_tokens": len(text.split()) or 1, "total_tokens": 4}
    model = body.get("model", MODEL)
    if path.endswith("/embeddings"):
        return {
            "object": "list",
            "data": [{"object": "embedding", "index": 0, "embedding": [0.5, -0.25, 1.0]}],
            "model": model,
            "usage": {"prompt_tokens": 3, "total_tokens": 3},
        }
    if path.endswith("/chat/completions"):
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "stop",
        }
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": "stop"}
        kind = "text_completion"
    return {
        "id": "cmpl-fake",
        "object": kind,
        "created": 0,
        "model": model,
        "choices": [choice],
        "usage": usage,
    }


def _app(state: FakeServer) -> web.Application:
    def authorised(request: web.Request) -> bool:
        return state.key is None or request.headers.get("Authorization") == f"Bearer {state.key}"

    async def models(request: web.Request) -> web.StreamResponse:
        if not authorised(request):
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        if state.broken_models:
            return web.Response(text="<html>hello</html>", content_type="text/html")
        data = [{"id": m, "object": "model"} for m in state.models]
        return web.json_response({"object": "list", "data": data})

    async def post(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        state.received.append((request.path, body))
        state.in_flight += 1
        state.peak_in_flight = max(state.peak_in_flight, state.in_flight)
        try:
            fault = state.faults.popleft() if state.faults else None
            if state.delay_s:
                await asyncio.sleep(state.delay_s)
            if not authorised(request) or fault == "401":
                return web.json_response({"error": {"message": "bad key"}}, status=401)
            if fault is not None and fault.startswith("429"):
                wait = fault.partition(":")[2] or "0"
                return web.json_response(
                    {"error": {"message": "slow down"}}, status=429, headers={"Retry-After": wait}
                )
            if fault == "500":
                return web.json_response({"error": {"message": "boom", "code": "oops"}}, status=500)
            if fault is not None and fault.isdigit():  # 503, 502, 400, ...: that status
                return web.json_response({"error": {"message": "busy"}}, status=int(fault))
            if fault == "drop":
                assert request.transport is not None
                request.transport.close()
                return web.Response()
            if fault == "notjson":
                return web.Response(text="<html>gateway</html>", content_type="text/html")
            if body.get("model") not in state.models:
                message = f"The model `{body.get('model')}` does not exist."
                return web.json_response(
                    {"error": {"message": message, "type": "NotFoundError"}}, status=404
                )
            return web.json_response(answer(request.path, body))
        finally:
            state.in_flight -= 1

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/{tail:.*}", post)
    return app


@contextmanager
def fake_openai_server(**knobs: Any) -> Iterator[FakeServer]:
    """Run a FakeServer on 127.0.0.1 (a free port) for the block; `knobs` set its fields."""
    state = FakeServer(**knobs)
    with serve_in_thread(_app(state), "fake-openai", "the fake OpenAI server") as url:
        state.url = url
        yield state


def chat_body_line(cid: str, text: str, **body: Any) -> str:
    """A chat line naming no model (the server's is filled in)."""
    return json.dumps(
        {
            "custom_id": cid,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": text}], **body},
        }
    )
