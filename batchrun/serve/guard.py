"""The first thing every request meets (ASGI middleware): the API key checked, and a JSON body
capped and checked for depth, before any route reads a byte of it.

FastAPI reads and parses a route's body before its dependencies run, so a key checked by a
dependency comes after a stranger's body has been buffered and parsed; here it comes first.
Uploads (POST /v1/files) stream past this (their size is capped as they are parsed:
serve/uploads.py); every other body is read whole, up to MAX_BODY_BYTES, then handed on.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from batchrun.serve.errors import ApiError
from batchrun.serve.keys import Keys

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]

# The largest JSON body taken (a batch's creation is well under a kilobyte).
MAX_BODY_BYTES = 1024 * 1024
# The deepest JSON taken in a body (a batch's creation nests two levels).
MAX_DEPTH = 32
OPEN_PATHS = frozenset({"/health"})
# Where the guard leaves the tenant whose key a request carries, for the routes.
TENANT_SCOPE_KEY = "batchrun.tenant"
UPLOAD_PATH = "/v1/files"


def bad_key() -> ApiError:
    """OpenAI's 401 for a missing or wrong key."""
    return ApiError(
        401,
        "Incorrect API key provided. Pass it as 'Authorization: Bearer KEY'.",
        code="invalid_api_key",
    )


def too_deep(what: str) -> ApiError:
    """The 400 for JSON nested past what is parsed."""
    return ApiError(400, f"{what} nests deeper than {MAX_DEPTH} levels")


def depth_ok(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether parsed JSON nests at most `limit` levels (checked without recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            if depth > limit:
                return False
            stack.extend((x, depth + 1) for x in item)
    return True


class Guard:
    """Refuse a request without a key the server takes (401) or with a body too large (413) or
    too deep (400) before the app reads its body; leave the key's tenant in the scope."""

    def __init__(self, app: Asgi, keys: Keys) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, method = scope.get("path", ""), scope.get("method", "GET")
        headers = {k.decode("latin-1").lower(): v for k, v in scope.get("headers", [])}
        if path not in OPEN_PATHS and not self.keys.open():
            tenant = self._tenant(headers)
            if tenant is None:
                await _answer(send, bad_key())
                return
            scope[TENANT_SCOPE_KEY] = tenant
        if method in ("GET", "HEAD", "DELETE") or (method == "POST" and path == UPLOAD_PATH):
            await self.app(scope, receive, send)
            return
        try:
            body = await _read_body(headers, receive)
            _check_depth(headers, body)
        except ApiError as e:
            await _answer(send, e)
            return
        await self.app(scope, _replay(body, receive), send)

    def _tenant(self, headers: dict[str, bytes]) -> str | None:
        """The tenant whose key the request's `Authorization: Bearer KEY` is; None: nobody's."""
        scheme, _, given = headers.get("authorization", b"").partition(b" ")
        if scheme.lower() != b"bearer":
            return None
        return self.keys.tenant(given.strip())  # the bytes sent, as the key was given (UTF-8)


async def _read_body(headers: dict[str, bytes], receive: Receive) -> bytes:
    """The whole body, refused (413) past MAX_BODY_BYTES: declared, or as it arrives."""
    declared = headers.get("content-length", b"")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _too_large()
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ApiError(400, "the client went away before its body was read")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _too_large()
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _check_depth(headers: dict[str, bytes], body: bytes) -> None:
    """Refuse a JSON body nested too deep for the app's parser (which recurses)."""
    if b"json" not in headers.get("content-type", b"") or not body:
        return
    try:
        value = json.loads(body)
    except RecursionError:
        raise too_deep("The request body") from None
    except ValueError:
        return  # the app says what is wrong with it
    if not depth_ok(value):
        raise too_deep("The request body")


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the body read already, then waits as the original would."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _too_large() -> ApiError:
    return ApiError(
        413,
        f"the request body is larger than {MAX_BODY_BYTES:,} bytes",
        code="request_too_large",
    )


async def _answer(send: Send, error: ApiError) -> None:
    """Send `error` as a JSON response."""
    payload = json.dumps(error.body()).encode()
    await send(
        {
            "type": "http.response.start",
            "status": error.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
