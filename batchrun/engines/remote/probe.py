"""The server checked before a job exists (and before each resume): reachable, answering as
OpenAI does, taking the key, serving the model. One GET of /v1/models, with the standard library
(the process that owns the journal imports no HTTP client for one request)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

from batchrun.engines.remote.answers import error_text, quote
from batchrun.engines.remote.urls import api_key, headers, models_url
from batchrun.errors import BatchrunError

PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Server:
    """What the server said of itself: its models."""

    base_url: str
    models: tuple[str, ...]


def probe(base_url: str, timeout_s: float = PROBE_TIMEOUT_S) -> Server:
    """GET `base_url`/models; a BatchrunError in one line when the server cannot be used."""
    url = models_url(base_url)
    request = urllib.request.Request(url, headers=headers(api_key()), method="GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            raw = response.read()
    except urllib.error.HTTPError as e:
        raw = e.read() if e.fp is not None else b""
        if e.code in (401, 403):
            given = "the key given" if api_key() else "no key (none was given)"
            raise BatchrunError(
                f"the server at {base_url} refused {given} (HTTP {e.code}: {error_text(raw)}); "
                "pass --api-key or set OPENAI_API_KEY"
            ) from None
        if e.code == 404:
            raise BatchrunError(
                f"the server at {base_url} has no {url} (HTTP 404): is --base-url the server's "
                "OpenAI root, such as http://HOST:8000/v1?"
            ) from None
        raise BatchrunError(
            f"the server at {base_url} answered GET {url} with HTTP {e.code}: {error_text(raw)}"
        ) from None
    except (TimeoutError, urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise BatchrunError(
            f"cannot reach the server at {base_url} ({reason}); is it running, and is "
            "--base-url right?"
        ) from None
    return Server(base_url, _model_ids(base_url, url, raw))


def _model_ids(base_url: str, url: str, raw: bytes) -> tuple[str, ...]:
    """The ids of OpenAI's model list; a BatchrunError when the answer is not one."""
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list) or not all(
        isinstance(m, dict) and isinstance(m.get("id"), str) for m in items
    ):
        raise BatchrunError(
            f"the server at {base_url} does not answer as an OpenAI-compatible server: GET {url} "
            f"gave {quote(raw)}, not a model list"
        )
    return tuple(m["id"] for m in items)


def served_model(server: Server, name: str | None) -> str:
    """The model a line naming none is sent with: `name` (--served-model-name), which the server
    must serve, else the one it serves; "" when it serves several (lines go as they are)."""
    if name is not None:
        if server.models and name not in server.models:
            raise BatchrunError(
                f"the server at {server.base_url} does not serve the model {name!r} (it serves "
                f"{', '.join(server.models)}); fix --served-model-name"
            )
        return name
    if len(server.models) == 1:
        return server.models[0]
    return ""
