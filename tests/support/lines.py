"""Batch input lines and JSONL files: what a test feeds a job and reads back."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from batchrun.openai.reader import read_input
from batchrun.openai.records import LineError, Request


def request_line(cid: str, url: str, body: dict[str, Any]) -> dict[str, Any]:
    """One batch request line: POST `body` to `url`."""
    return {"custom_id": cid, "method": "POST", "url": url, "body": body}


def chat_line(cid: str, text: str, **body: Any) -> dict[str, Any]:
    """One chat request line."""
    messages = [{"role": "user", "content": text}]
    return request_line(
        cid, "/v1/chat/completions", {"model": "test-model", "messages": messages, **body}
    )


def completion_line(cid: str, max_tokens: int) -> dict[str, Any]:
    """One /v1/completions line asking to say its id."""
    body = {"model": "m", "prompt": f"say {cid}", "max_tokens": max_tokens}
    return request_line(cid, "/v1/completions", body)


def media_line(
    cid: str, part: dict[str, Any], text: str = "What is this?", **body: Any
) -> dict[str, Any]:
    """A chat line (model "m") whose message is a text part, then `part`; `body`, its other
    fields."""
    content = [{"type": "text", "text": text}, part]
    messages = [{"role": "user", "content": content}]
    return request_line(cid, "/v1/chat/completions", {"model": "m", **body, "messages": messages})


def model_line(cid: str, model: str | None) -> dict[str, Any]:
    """A short chat line naming `model` in body.model (None: naming none)."""
    line = chat_line(cid, f"text of {cid}", max_tokens=4)
    if model is None:
        del line["body"]["model"]
    else:
        line["body"]["model"] = model
    return line


def chat_input(path: Path, lines: int | Sequence[str], text: str = "message", **body: Any) -> Path:
    """Write an input of chat lines to `path`: `lines` a count n (ids r0 .. r{n-1}, line i saying
    "{text} {i}") or the ids themselves (each saying "{text} {id}"); `body`, their other fields."""
    if isinstance(lines, int):
        said = [(f"r{i}", f"{text} {i}") for i in range(lines)]
    else:
        said = [(cid, f"{text} {cid}") for cid in lines]
    return write_jsonl(path, [chat_line(cid, words, **body) for cid, words in said])


def model_input(path: Path, models: Sequence[str | None]) -> Path:
    """Write an input whose line i (id r{i}) names models[i] in body.model (`model_line`)."""
    return write_jsonl(path, [model_line(f"r{i}", m) for i, m in enumerate(models)])


def write_jsonl(path: Path, lines: Sequence[Any]) -> Path:
    """Write objects (or raw strings) as JSONL."""
    with path.open("w", encoding="utf-8") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read a JSONL file."""
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def read_lines(tmp_path: Path, *lines: Any) -> list[Request | LineError]:
    """What the reader makes of `lines` (objects or raw strings) in an input file."""
    return list(read_input(write_jsonl(tmp_path / "in.jsonl", lines)))


def line_error(tmp_path: Path, line: Any) -> LineError:
    """The error record the reader makes of `line` (the test fails if it makes a request)."""
    (out,) = read_lines(tmp_path, line)
    assert isinstance(out, LineError), out
    return out
