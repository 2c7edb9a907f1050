"""`doctor --base-url`: the server a remote job would send its lines to, checked as submit
checks it (engines/remote/probe.py), said as findings with the fix for each problem."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from batchrun.engines.remote.probe import probe, served_model
from batchrun.engines.remote.urls import api_key
from batchrun.errors import BatchrunError


@dataclass
class ServerCheck:
    """What the doctor found of a server: its models, or the problem a job would stop on."""

    base_url: str
    key_sent: bool
    models: list[str] = field(default_factory=list)
    model: str = ""  # what a line naming no model is sent with ("" when the server has several)
    problem: str | None = None

    @property
    def ok(self) -> bool:
        """Whether a job would run there."""
        return self.problem is None

    def to_dict(self) -> dict[str, Any]:
        """The findings as JSON."""
        return {
            "base_url": self.base_url,
            "key_sent": self.key_sent,
            "models": self.models,
            "model": self.model or None,
            "ok": self.ok,
            "problem": self.problem,
        }

    def lines(self) -> list[str]:
        """The findings as lines to read; the last says ok or what stops a job."""
        key = "sent (--api-key or OPENAI_API_KEY)" if self.key_sent else "none sent"
        found = [f"server: {self.base_url}", f"API key: {key}"]
        if self.problem is not None:
            return [*found, f"problem: {self.problem}"]
        found.append(f"models: {', '.join(self.models) or 'none listed'}")
        if self.model:
            sent = f"lines naming no model are sent with {self.model}"
        else:
            sent = "lines naming no model go as they are (the server has several models)"
        return [*found, f"ok: a job with --base-url {self.base_url} would run; {sent}"]


def check_server(base_url: str, served_model_name: str | None = None) -> ServerCheck:
    """Check the server at `base_url` as a remote job's submit does."""
    found = ServerCheck(base_url, key_sent=api_key() is not None)
    try:
        server = probe(base_url)
        found.models = list(server.models)
        found.model = served_model(server, served_model_name)
    except BatchrunError as e:
        found.problem = str(e)
    return found
