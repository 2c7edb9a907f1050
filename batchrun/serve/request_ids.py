"""Request ids (ASGI middleware): every response carries `x-request-id`, as OpenAI's do, so that
the `openai` package's `request_id` is set and a client can name a request in a report; the
server's log names the same id, beside the client's own `X-Client-Request-Id` when it sent one.

Logged: every request that changes something (not GET or HEAD), every error answer, and every
request that carries a client request id (its client asked for it to be traceable); a plain
successful GET (a poll, /health, /metrics) is not, so polling fills no log. A 500 is answered
outside this middleware (Starlette's outermost handler): app.py adds the id to it and logs it.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

from batchrun.serve.guard import TENANT_SCOPE_KEY, Asgi, Message, Receive, Scope, Send

# Where the id of the request being answered is kept in its ASGI scope (for the 500 handler).
SCOPE_KEY = "batchrun.request_id"
CLIENT_SCOPE_KEY = "batchrun.client_request_id"
HEADER = b"x-request-id"
CLIENT_HEADER = b"x-client-request-id"
# OpenAI's limit on a client's request id: printable ASCII, at most 512 characters.
MAX_CLIENT_ID = 512
_QUIET_METHODS = frozenset({"GET", "HEAD"})


def new_request_id() -> str:
    """A request's id, OpenAI's form: `req_` and 32 hex digits."""
    return f"req_{secrets.token_hex(16)}"


def client_request_id(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The client's `X-Client-Request-Id`, when it sent one that is printable ASCII of at most
    MAX_CLIENT_ID characters (anything else is ignored: it would go into the log)."""
    for name, value in headers:
        if name.lower() == CLIENT_HEADER:
            if 0 < len(value) <= MAX_CLIENT_ID and all(0x20 <= b < 0x7F for b in value):
                return value.decode("ascii")
            return None
    return None


def describe(request_id: str, client_id: str | None) -> str:
    """How the log names a request: its id, and the client's beside it."""
    return request_id + (f" (client request id {client_id})" if client_id else "")


class RequestIds:
    """Give each HTTP request an id: sent back as `x-request-id` (with the client's own id
    echoed as `x-client-request-id`) and logged with the answer's status."""

    def __init__(self, app: Asgi, say: Callable[[str], None]) -> None:
        self.app, self.say = app, say

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id()
        client_id = client_request_id(list(scope.get("headers", [])))
        scope[SCOPE_KEY], scope[CLIENT_SCOPE_KEY] = request_id, client_id
        method = str(scope.get("method", "GET"))
        # The path as sent (still percent-encoded: no line break reaches the log).
        raw = scope.get("raw_path")
        path = raw.decode("latin-1") if isinstance(raw, bytes) else str(scope.get("path", ""))

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *id_headers(scope)]
                status = int(message["status"])
                if method not in _QUIET_METHODS or status >= 400 or client_id is not None:
                    # The tenant by its name (serve/tenants.py), never by its key.
                    tenant = scope.get(TENANT_SCOPE_KEY)
                    of = f" (tenant {tenant})" if isinstance(tenant, str) else ""
                    said = f"request {describe(request_id, client_id)}: {method} {path} {status}"
                    self.say(said + of)
            await send(message)

        await self.app(scope, receive, send_with_id)


def id_headers(scope: Scope) -> list[tuple[bytes, bytes]]:
    """The headers that name a request (its id, and the client's), from its scope."""
    headers: list[tuple[bytes, bytes]] = []
    request_id, client_id = scope.get(SCOPE_KEY), scope.get(CLIENT_SCOPE_KEY)
    if isinstance(request_id, str):
        headers.append((HEADER, request_id.encode("ascii")))
    if isinstance(client_id, str):
        headers.append((CLIENT_HEADER, client_id.encode("ascii")))
    return headers
