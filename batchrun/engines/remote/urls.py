"""Where a line goes on the server, and the key it is sent with: the remote engine's addressing.

The key comes from the environment only (`--api-key` puts it there: cli/options.py), never from
the settings, which are saved into the job directory.
"""

from __future__ import annotations

import os

# --api-key's way to the workers (the CLI and the Python API set it), then the OpenAI client's
# own variable. Not BATCHRUN_API_KEY: that is serve's own key for its clients, which a serve root
# on a remote server must never send on to that server.
API_KEY_VARS = ("BATCHRUN_REMOTE_API_KEY", "OPENAI_API_KEY")


def api_key() -> str | None:
    """The key to send as `Authorization: Bearer`: --api-key, else OPENAI_API_KEY; None: none."""
    for name in API_KEY_VARS:
        value = os.environ.get(name)
        if value:
            return value
    return None


def headers(key: str | None) -> dict[str, str]:
    """The request headers: JSON, and the key when there is one."""
    found = {"Content-Type": "application/json", "Accept": "application/json"}
    if key:
        found["Authorization"] = f"Bearer {key}"
    return found


def endpoint_url(base_url: str, url: str) -> str:
    """The server URL of a line's `url` (/v1/chat/completions) under `base_url`
    (http://HOST:PORT/v1): the base already holds the /v1 the line's url starts with."""
    base = base_url.rstrip("/")
    path = url if url.startswith("/") else "/" + url
    if path.startswith("/v1/") and base.endswith("/v1"):
        path = path[len("/v1") :]
    return base + path


def models_url(base_url: str) -> str:
    """GET this for the models the server serves (OpenAI's /v1/models)."""
    return endpoint_url(base_url, "/v1/models")
