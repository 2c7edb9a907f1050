"""A fault-injecting proxy in front of a real OpenAI-compatible server (tests of the remote
engine against `vllm serve`): every request is passed on and its answer passed back, except
those the test scripts a fault for, one per POST in the order they come: "429:SECONDS" (with
Retry-After), a status ("503", "502"), "drop" (the connection closed unanswered). Runs in the
test's process (aiohttp, a thread of its own)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from support.fakes.aiohttp_thread import serve_in_thread

# What the proxy does not pass on either way (the hop's own).
_HOP = {"host", "content-length", "transfer-encoding", "connection", "content-encoding"}


@dataclass
class FaultProxy:
    """The proxy's script and what it did."""

    upstream: str
    faults: deque[str] = field(default_factory=deque)
    # POSTs seen, and the faults thrown (in order).
    posts: int = 0
    thrown: list[str] = field(default_factory=list)
    url: str = ""


def _app(state: FaultProxy) -> web.Application:
    session: list[aiohttp.ClientSession] = []

    async def start(app: web.Application) -> None:
        session.append(aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)))

    async def stop(app: web.Application) -> None:
        await session[0].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.method == "POST":
            state.posts += 1
            fault = state.faults.popleft() if state.faults else ""
            if fault:
                state.thrown.append(fault)
            if fault.startswith("429"):
                wait = fault.partition(":")[2] or "1"
                return web.json_response(
                    {"error": {"message": "rate limited"}},
                    status=429,
                    headers={"Retry-After": wait},
                )
            if fault.isdigit():
                return web.json_response({"error": {"message": "unavailable"}}, status=int(fault))
            if fault == "drop":
                assert request.transport is not None
                request.transport.close()
                return web.Response()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        target = state.upstream + request.path_qs
        try:
            async with session[0].request(
                request.method, target, data=body, headers=headers
            ) as reply:
                raw = await reply.read()
                out = {k: v for k, v in reply.headers.items() if k.lower() not in _HOP}
                return web.Response(body=raw, status=reply.status, headers=out)
        except aiohttp.ClientError:
            # The server is down (killed by the test): as a gateway says so.
            return web.json_response({"error": {"message": "upstream down"}}, status=502)

    app = web.Application(client_max_size=64 * 2**20)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


@contextmanager
def fault_proxy(upstream: str) -> Iterator[FaultProxy]:
    """Run a FaultProxy to `upstream` (http://HOST:PORT, no path) on 127.0.0.1 for the block."""
    state = FaultProxy(upstream.rstrip("/"))
    with serve_in_thread(_app(state), "fault-proxy", "the fault proxy") as url:
        state.url = url
        yield state
