"""The remote engine: each line's body POSTed to an OpenAI-compatible server, as many in flight
as the flow window allows (flow.py), each answer handed back as an Outcome when it comes.

It runs in a worker process like any engine (workers/child.py), behind the same step interface:
an asyncio loop with one aiohttp session runs in a thread of its own; `add` hands it a line,
`step` returns what has finished. What the server's answers mean is answers.py's; this module
sends, waits, and retries what the server could not take (a 429, a 503, a dropped connection, a
server restarting) after a back-off, with no attempt spent, until the server has been unreachable
for OUTAGE_LIMIT_S for that line. A 401 stops the job (`AuthStops`, raised from `step`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import random
import threading
import time
from collections import deque
from dataclasses import dataclass

import aiohttp

from batchrun.config import DEFAULT_MAX_CONCURRENCY, EngineSettings
from batchrun.engines.base import StopsJob
from batchrun.engines.remote.answers import AuthRefused, Retry, verdict
from batchrun.engines.remote.flow import FlowWindow
from batchrun.engines.remote.urls import api_key, endpoint_url, headers
from batchrun.openai.records import Outcome, Request
from batchrun.openai.response_bodies import failure

# How long one line waits out a server that throttles or cannot be reached (a restart, a
# network cut) before the attempt fails (retryable: a retry pass sends it again); the
# environment may set it (tests: seconds).
OUTAGE_LIMIT_S = 600.0
OUTAGE_ENV = "BATCHRUN_REMOTE_OUTAGE_S"
# Back-off between sends of one line: doubling from BACKOFF_S up to BACKOFF_MAX_S, jittered.
BACKOFF_S = 0.5
BACKOFF_MAX_S = 10.0
# How long `step` waits for an answer before it returns to the worker's loop (its messages).
STEP_WAIT_S = 0.02


class AuthStops(StopsJob):
    """The server refused the key: every line would be refused; the job stops."""


@dataclass
class _Line:
    """One line on its way: what is sent, and its tries against a server that is not there."""

    request: Request
    url: str
    payload: bytes
    tries: int = 0
    outage_since: float | None = None


class RemoteEngine:
    """Lines to a server with flow control; outcomes back as they finish."""

    def __init__(self, settings: EngineSettings) -> None:
        if not settings.base_url:
            raise ValueError("the remote engine needs a base URL (--base-url)")
        self.settings = settings
        self.base_url = settings.base_url
        self.flow = FlowWindow(settings.max_concurrency or DEFAULT_MAX_CONCURRENCY)
        self.timeout = settings.request_timeout
        self.outage_limit_s = float(os.environ.get(OUTAGE_ENV) or OUTAGE_LIMIT_S)
        self.headers = headers(api_key())
        self._done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self._fatal: BaseException | None = None
        self._unfinished = 0  # the worker's thread only
        # The loop's own (its thread only): lines waiting for the window, and those sent.
        self._waiting: deque[_Line] = deque()
        self._sent: dict[str, asyncio.Task[None]] = {}
        self._aborted: set[str] = set()
        self._wake: asyncio.TimerHandle | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="batchrun-remote", daemon=True
        )
        self._thread.start()
        self._session = asyncio.run_coroutine_threadsafe(self._open(), self._loop).result()

    async def _open(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=self.flow.cap, ttl_dns_cache=300)
        return aiohttp.ClientSession(connector=connector, headers=self.headers)

    # -- the worker's side ------------------------------------------------------------------

    def add(self, request: Request) -> Outcome | None:
        """Queue a line for the server; it is sent when the flow window has room."""
        body = request.body
        model = self.settings.model_name
        if ("model" not in body and model) or self.settings.priority is not None:
            body = dict(body)
            if "model" not in body and model:
                body["model"] = model
            if self.settings.priority is not None:
                body["priority"] = self.settings.priority
        line = _Line(request, endpoint_url(self.base_url, request.url), json.dumps(body).encode())
        self._unfinished += 1
        self._loop.call_soon_threadsafe(self._enqueue, line)
        return None

    def step(self) -> list[Outcome]:
        """The lines answered since the last step (waiting a moment for the first); once they
        are all handed back, the error that stops the job, if one came."""
        out: list[Outcome] = []
        try:
            out.append(self._done.get(timeout=STEP_WAIT_S))
            while True:
                out.append(self._done.get_nowait())
        except queue.Empty:
            pass
        self._unfinished -= len(out)
        if self._fatal is not None and not out:
            raise self._fatal
        return out

    def has_unfinished(self) -> bool:
        """Whether any line added has no outcome yet."""
        return self._unfinished > 0

    def abort(self, custom_id: str) -> None:
        """Stop waiting for a line (its outcome is the caller's); unknown ids are ignored."""
        self._unfinished -= 1
        self._loop.call_soon_threadsafe(self._drop, custom_id)

    def flow_window(self) -> int:
        """The flow window now: the requests this engine lets be in flight (its batch size)."""
        return self.flow.settled()

    def close(self) -> None:
        """Stop sending, close the session and the loop."""
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._shut(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    # -- the loop's side ----------------------------------------------------------------------

    async def _shut(self) -> None:
        for task in list(self._sent.values()):
            task.cancel()
        await self._session.close()

    def _enqueue(self, line: _Line) -> None:
        self._waiting.append(line)
        self._pump()

    def _pump(self) -> None:
        """Send waiting lines while the window has room and no Retry-After holds them."""
        if self._fatal is not None:
            return  # the job stops: nothing more is sent
        now = time.monotonic()
        if self.flow.paused(now):
            if self._wake is None:
                self._wake = self._loop.call_later(self.flow.paused_until - now, self._woken)
            return
        limit = self.flow.limit()
        while self._waiting and len(self._sent) < limit:
            line = self._waiting.popleft()
            custom_id = line.request.custom_id
            self._sent[custom_id] = self._loop.create_task(self._send(line))

    def _woken(self) -> None:
        self._wake = None
        self._pump()

    def _drop(self, custom_id: str) -> None:
        task = self._sent.pop(custom_id, None)
        if task is not None:
            task.cancel()
        else:
            kept = [x for x in self._waiting if x.request.custom_id != custom_id]
            if len(kept) == len(self._waiting):
                self._aborted.add(custom_id)  # still backing off: dropped when it comes back
            self._waiting = deque(kept)
        self._pump()

    async def _send(self, line: _Line) -> None:
        request = line.request
        started = time.monotonic()
        result: Outcome | Retry | AuthRefused
        try:
            result = await self._post(line, started)
        except asyncio.CancelledError:
            return
        except Exception as e:  # a bug here must fail the line, not leave it unanswered forever
            result = failure(
                request,
                "engine_error",
                f"the remote engine failed on this line: {type(e).__name__}: {e}",
                status_code=500,
                retryable=True,
                latency_s=time.monotonic() - started,
            )
        finally:
            self._sent.pop(request.custom_id, None)
        now = time.monotonic()
        if isinstance(result, AuthRefused):
            self._fatal = AuthStops(
                f"{result.message}; pass --api-key or set OPENAI_API_KEY, then resume the job"
            )
            return
        if isinstance(result, Retry):
            self.flow.congested(now, result.retry_after_s)
            self._retry_later(line, result, now)
        else:
            if result.ok:
                backlog = len(self._sent) + len(self._waiting)
                self.flow.succeeded(now, result.latency_s, result.completion_tokens, backlog)
            elif result.error is not None and result.error.get("code") == "timeout":
                self.flow.congested(now)
            self._done.put(result)
        self._pump()

    async def _post(self, line: _Line, started: float) -> Outcome | Retry | AuthRefused:
        """One send of a line: the server's answer, or why there was none."""
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        try:
            async with self._session.post(line.url, data=line.payload, timeout=timeout) as reply:
                raw = await reply.read()
                status, retry_after = reply.status, reply.headers.get("Retry-After")
        except asyncio.TimeoutError:
            assert self.timeout is not None
            return failure(
                line.request,
                "timeout",
                f"the server did not answer within {self.timeout:g} s (--request-timeout)",
                status_code=504,
                retryable=True,
                latency_s=time.monotonic() - started,
            )
        except (aiohttp.ClientError, OSError) as e:
            return Retry(f"{type(e).__name__}: {e}".rstrip(": "))
        return verdict(line.request, status, raw, retry_after, time.monotonic() - started)

    def _retry_later(self, line: _Line, why: Retry, now: float) -> None:
        """Send the line again after a back-off (and the server's Retry-After), unless the
        server has been away from it for longer than the outage limit: then it fails."""
        if line.outage_since is None:
            line.outage_since = now
        line.tries += 1
        if now - line.outage_since >= self.outage_limit_s:
            self._done.put(
                failure(
                    line.request,
                    "server_unavailable",
                    f"the server did not take the request for {now - line.outage_since:.0f} s "
                    f"({line.tries} tries; last: {why.reason})",
                    status_code=503,
                    retryable=True,
                    latency_s=now - line.outage_since,
                )
            )
            return
        wait = min(BACKOFF_MAX_S, BACKOFF_S * 2 ** (line.tries - 1)) * random.uniform(0.5, 1.0)
        wait = max(wait, why.retry_after_s or 0.0)
        self._loop.call_later(wait, self._back, line)

    def _back(self, line: _Line) -> None:
        """A line's back-off is over: first in line for the window."""
        if line.request.custom_id in self._aborted:
            self._aborted.discard(line.request.custom_id)
            return
        self._waiting.appendleft(line)
        self._pump()
