"""An aiohttp app served on 127.0.0.1 (a free port) from a thread of the test's process, for the
length of a block: the fake OpenAI server and the fault proxy run so."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web


@contextmanager
def serve_in_thread(app: web.Application, name: str, what: str) -> Iterator[str]:
    """Serve `app` for the block from a thread called `name`; yield its base URL
    (http://127.0.0.1:PORT/v1). The test fails, saying `what` did not start, after 10 s."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None)
    ready = threading.Event()
    url: list[str] = []

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        url.append(f"http://127.0.0.1:{port}/v1")
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, name=name, daemon=True)
    thread.start()
    if not ready.wait(10):
        raise AssertionError(f"{what} did not start")
    try:
        yield url[0]
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
