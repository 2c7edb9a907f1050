"""Identical deterministic requests computed once: one representative runs, its duplicates are
held back and answered with copies of its outcome, each under its own custom_id and response id.

A request is deterministic when its answer cannot differ between two runs of the same body: an
embeddings, score or rerank request, or a chat / completions request with one choice (`n` 1) and greedy decoding
(temperature 0) or an explicit `seed`. Sampled requests are never merged: two people asking for
two samples want two samples.

Exactly-once per custom_id holds because nothing about a duplicate is written until its
representative's outcome is: the copies' journal records go in the same append as the
representative's. A duplicate whose record a kill cut off is simply not done, and runs again on
resume (on its own, or as the representative of the duplicates still left).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any

import msgspec

from batchrun.job.journal import encode_body
from batchrun.job.shards import ShardReader, stored_ref
from batchrun.openai.media import media_identity
from batchrun.openai.records import POOLING_ENDPOINTS, Outcome, Request
from batchrun.openai.response_bodies import holds_no_float, response_id

# Canonical bodies: keys sorted, so that the same body written in another key order matches.
_CANONICAL = msgspec.json.Encoder(order="sorted")
_DECODE = msgspec.json.Decoder()
# A response's id: a prefix ending in "-" or "_", then hex digits.
_ID = re.compile(r"(.*[-_])[0-9a-fA-F]+\Z", re.DOTALL)


def dedup_key(request: Request) -> bytes | None:
    """What identical deterministic requests share (a digest of url and body); None when the
    request's answer may differ between runs (sampled, or several choices)."""
    if request.url not in POOLING_ENDPOINTS:
        # params.sampling's defaults (n 1, temperature 1), read from the body: this runs in the
        # parent for every request of a job, and a typed Sampling costs 5 µs to build.
        body = request.body
        n = body.get("n")
        if n is not None and n != 1:
            return None  # several choices: sampled
        # Sampled unless greedy (temperature 0) or seeded; no temperature means 1.
        if body.get("temperature") != 0 and body.get("seed") is None:
            return None
    try:
        canonical = _CANONICAL.encode([request.url, request.body])
    except (TypeError, ValueError, UnicodeEncodeError):  # a lone surrogate: never merged
        return None
    # A data URL is in the body itself; a file:// medium is keyed by what the file is now (its
    # size and modification time), not by its path alone.
    if b"file:" in canonical:
        canonical += b"\x00" + media_identity(request.body)
    return hashlib.blake2b(canonical, digest_size=16).digest()


class Duplicates:
    """The duplicates held back, by the custom_id of the representative that runs for them."""

    def __init__(self, shards: ShardReader | None = None) -> None:
        self.held: dict[str, list[Request]] = {}
        # The job's result shards, where a representative's worker may have written its body
        # (job/shards.py): a copy is read from there. None: bodies travel whole (serve).
        self.shards = shards

    def split(self, window: Sequence[Request]) -> list[Request]:
        """The requests of `window` that must run (one per set of identical deterministic ones,
        the first in the window's order); the others are held for their representative."""
        first: dict[bytes, Request] = {}
        run: list[Request] = []
        held = self.held
        for request in window:
            key = dedup_key(request)
            if key is None:
                run.append(request)
                continue
            rep = first.get(key)
            if rep is None:
                first[key] = request
                run.append(request)
            else:
                held.setdefault(rep.custom_id, []).append(request)
        return run

    def answer(self, pairs: Sequence[tuple[Outcome, Request]]) -> list[tuple[Outcome, Request]]:
        """The copies that the outcomes in `pairs` answer for their held duplicates (these are
        no longer held)."""
        held = self.held
        copies: list[tuple[Outcome, Request]] = []
        for outcome, request in pairs:
            waiting = held.pop(request.custom_id, None)
            if waiting is not None:
                copies += [(copy_outcome(outcome, d, self.shards), d) for d in waiting]
        return copies


def copy_outcome(
    outcome: Outcome, duplicate: Request, shards: ShardReader | None = None
) -> Outcome:
    """`outcome` as the answer to `duplicate`: its own custom_id, a fresh response id (and fresh
    tool-call ids); `extra["copy_of"]` names the representative. An outcome whose body its
    worker stored in a shard (`stored`) is read from `shards`: the copy holds its body itself
    (its ids are its own, so it cannot name the representative's bytes)."""
    body, vectors = outcome.body, outcome.vectors
    if outcome.stored is not None:
        if shards is None:
            raise AssertionError("a stored result to copy, and no shards to read it from")
        text, split = shards.load(stored_ref(outcome.stored))
        body, vectors = msgspec.Raw(text), split or None
    if body is not None:
        data: Any = _DECODE.decode(body) if isinstance(body, msgspec.Raw) else body
        if isinstance(data, dict):
            data = _fresh_ids(data)
            body = encode_body(data, floats=not holds_no_float(data))
    return Outcome(
        custom_id=duplicate.custom_id,
        ok=outcome.ok,
        status_code=outcome.status_code,
        body=body,
        error=outcome.error,
        prompt_tokens=outcome.prompt_tokens,
        completion_tokens=outcome.completion_tokens,
        latency_s=outcome.latency_s,
        retryable=outcome.retryable,
        extra={"copy_of": outcome.custom_id},
        vectors=vectors,  # the placeholders stay where they were: they pair up still
    )


def _fresh_ids(body: dict[str, Any]) -> dict[str, Any]:
    """A copy of a response body with new ids where a response carries its own (ids must not
    be shared between two answers): its own, its output items' (Responses), tool calls'."""
    body = _fresh_id(body)
    output = body.get("output")
    if isinstance(output, list):
        body["output"] = [_fresh_id(item) if isinstance(item, dict) else item for item in output]
    choices = body.get("choices")
    if isinstance(choices, list):
        body["choices"] = [_fresh_tool_ids(c) for c in choices]
    return body


def _fresh_id(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` with its `id` (`chatcmpl-<hex>`, `resp_<hex>`, ...) made anew, its prefix kept."""
    old = obj.get("id")
    found = _ID.match(old) if isinstance(old, str) else None
    return {**obj, "id": found.group(1) + response_id()} if found else dict(obj)


def _fresh_tool_ids(choice: Any) -> Any:
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        return choice
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        return choice
    fresh = [
        {**c, "id": f"call_{response_id()[-24:]}"} if isinstance(c, dict) and "id" in c else c
        for c in calls
    ]
    return {**choice, "message": {**message, "tool_calls": fresh}}
