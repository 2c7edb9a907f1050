"""The dispatch plan: which requests reach the engine, and in what order.

vLLM's prefix cache only helps while a prefix is still cached, so the order of dispatch decides
how much prefill is computed again. With `--order auto` (the default) each window of requests
(at most `WINDOW_REQUESTS` requests or `WINDOW_CHARS` characters of prompt, so that memory stays
flat at millions of lines) is planned on its own:

1. identical deterministic requests run once (`dedup.Duplicates`);
2. the rest are sorted by their prompt text, which puts requests sharing a prefix next to each
   other, however deep the shared part; a *group* is a run of them whose neighbours share at least
   `MIN_SHARED` characters;
3. groups go out longest expected work first (prompt characters not shared with the request
   before, plus the tokens asked for), so the job does not end on one long straggler; requests
   that share no prefix with any other follow, in the file's order: sorting them too would send
   all the longest answers out together, which crowds the KV cache (vLLM preempts and recomputes:
   on 200 independent prompts under a tight KV budget, 30 preemptions against 19 in file order,
   and lower throughput than raw vLLM), with no prefix hit to gain in exchange.

A group's requests go out together, the group's first one first, with nothing of the next group
among them: vLLM takes its waiting queue in order and caches a prefix as its first request's
prefill runs, so the group's other requests find it cached, and the next group's prefix takes no
KV cache away from them while they run. (Sending each group's first request one group early, to
have its prefix cached before the rest arrive, was measured against this on 20 documents x 10
questions under a KV cache smaller than the documents: the same hit rate, 3% slower.)

The key is the prompt's text (messages' roles and contents in order, or the prompt), not its
tokens: the parent never loads a tokenizer, and a shared text prefix is a shared token prefix up
to the last token or so. The plan is deterministic: the same requests give the same order (ties
keep the file's order). Retry passes and resume plan the requests left the same way.

Before all that, a window's requests are grouped by what answers them (body.model: the base
model or a LoRA adapter), so that adapters swap rarely; the steps above run within each group.

`--order input` sends every request as it is, in the file's order (no grouping, no merging).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, get_args

from batchrun.openai.media import media_digest, media_urls
from batchrun.openai.records import (
    CHAT,
    EMBEDDINGS,
    POOLING_ENDPOINTS,
    RESPONSES,
    SCORING_URLS,
    Request,
)
from batchrun.openai.scoring import scoring_texts

if TYPE_CHECKING:  # the CLI imports this module for --order's choices: kept light
    from batchrun.run.dedup import Duplicates

Order = Literal["auto", "input"]
ORDERS: tuple[str, ...] = get_args(Order)
DEFAULT_ORDER: Order = "auto"

# A window: enough requests that a file's groups mostly fall in one, few enough that the parent's
# memory stays small (the window's requests and their texts are held while it is planned).
WINDOW_REQUESTS = 16_384
WINDOW_CHARS = 16 * 2**20
# Characters two prompts must share to be worth keeping together: a few KV-cache blocks (16
# tokens each, about 4 characters a token). A shared chat template or a short system prompt is
# less, and grouping on it would only shuffle independent prompts.
MIN_SHARED = 256
# Tokens expected from a request that sets no limit (a chat request runs to the context's end).
UNLIMITED_TOKENS = 256


def plan(
    source: Iterator[Request], order: str, duplicates: Duplicates | None = None
) -> Iterator[Request]:
    """The requests of `source` in the order to dispatch them; with `duplicates`, identical
    deterministic ones are held there instead of yielded (see dedup.py)."""
    if order == "input":
        yield from source
        return
    for window in windows(source):
        run = duplicates.split(window) if duplicates is not None else list(window)
        for group in by_model(run):
            yield from order_window(group)


def by_model(requests: list[Request]) -> list[list[Request]]:
    """`requests` grouped by the model or LoRA adapter their body.model names, in the order
    each name first appears (each group keeps the file's order): an engine then swaps adapters
    at most once per adapter per window, where interleaved adapters would swap all the time
    once there are more of them than it holds at once (--max-loras)."""
    groups: dict[object, list[Request]] = {}
    for request in requests:
        groups.setdefault(request.body.get("model"), []).append(request)
    return list(groups.values())


def windows(source: Iterator[Request]) -> Iterator[list[Request]]:
    """`source` cut into windows of at most WINDOW_REQUESTS requests and WINDOW_CHARS of text."""
    window: list[Request] = []
    chars = 0
    for request in source:
        window.append(request)
        chars += _size(request)
        if len(window) >= WINDOW_REQUESTS or chars >= WINDOW_CHARS:
            yield window
            window, chars = [], 0
    if window:
        yield window


def order_window(requests: Sequence[Request]) -> list[Request]:
    """One window in dispatch order: grouped by shared prefix, longest groups first, each group
    whole; then the requests that share no prefix, in the file's order."""
    n = len(requests)
    if n <= 1:
        return list(requests)
    texts = [prompt_text(r) for r in requests]
    # Two texts share MIN_SHARED characters only if both are that long: with fewer than two
    # such, every request is alone, and alone ones go in the file's order. (Short prompts, the
    # common case of a large file: no sort, no walk, no group per request.)
    if sum(len(t) >= MIN_SHARED for t in texts) < 2:
        return list(requests)
    # Stable: equal texts keep the file's order.
    by_text = sorted(range(n), key=texts.__getitem__)
    shared = _shared_prefixes(texts, by_text)
    groups: list[list[int]] = []  # positions in text order
    for k in range(n):
        if k == 0 or shared[k] < MIN_SHARED:
            groups.append([k])
        else:
            groups[-1].append(k)

    def work(group: list[int]) -> int:
        return sum(
            (len(texts[by_text[k]]) - (shared[k] if k != group[0] else 0)) // 4
            + _tokens(requests[by_text[k]])
            for k in group
        )

    shared_groups = [g for g in groups if len(g) > 1]
    ranked = sorted(shared_groups, key=lambda g: -work(g))  # stable: ties keep text order
    alone = sorted((g[0] for g in groups if len(g) == 1), key=by_text.__getitem__)  # file order
    sequence = [*itertools.chain.from_iterable(ranked), *alone]
    return [requests[by_text[k]] for k in sequence]


def _shared_prefixes(texts: list[str], by_text: list[int]) -> list[int]:
    """Each text's common prefix with the one before it in text order (0 for the first), exact
    where it is at least MIN_SHARED (groups and their work look no closer). Elsewhere it is 0,
    standing for "under MIN_SHARED": most pairs of unrelated prompts, told apart by one
    comparison (none for short prompts) instead of a binary search."""
    n = len(by_text)
    shared = [0] * n
    for k in range(1, n):
        a, b = texts[by_text[k - 1]], texts[by_text[k]]
        if len(a) >= MIN_SHARED and len(b) >= MIN_SHARED and a[:MIN_SHARED] == b[:MIN_SHARED]:
            shared[k] = common_prefix(a, b)
    return shared


def common_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix of `a` and `b` (a binary search over slices:
    each comparison is one C loop, where a character-by-character loop is Python's)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def prompt_text(request: Request) -> str:
    """The text the prompt is made of, in the order the model reads it: for chat (and responses,
    after their instructions), each message's role and text; for completions, the prompt; for
    embeddings, the input; for score and rerank, the queries then the documents (a cross-encoder
    reads each query first)."""
    body = request.body
    if request.url in SCORING_URLS:
        _, queries, documents = scoring_texts(request.url, body)
        return "\x1e".join([*queries, *documents])
    if request.url in (CHAT, RESPONSES):
        parts: list[str] = []
        if request.url == RESPONSES:  # instructions first, then the input: text or messages
            parts.append(str(body.get("instructions") or ""))
            messages = body.get("input")
            if isinstance(messages, str):
                messages = [{"role": "user", "content": messages}]
        else:
            messages = body.get("messages")
        for message in messages if isinstance(messages, list) else ():
            if isinstance(message, dict):
                parts.append(str(message.get("role", "")))
                parts.append(_content(message.get("content")))
        return "\x1e".join(parts)
    value = body.get("input" if request.url == EMBEDDINGS else "prompt")
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return "\x1e".join(value)
    return "" if value is None else repr(value)


def _content(content: Any) -> str:
    """A message's text: its string content, or its text parts in order."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_part_text(p) for p in content if isinstance(p, dict))
    return ""


def _part_text(part: dict[str, Any]) -> str:
    """A content part as the plan reads it: its text, or a medium's digest (two lines with the
    same text and different images share only the text before the image)."""
    if "text" in part:
        return str(part.get("text", ""))
    urls = media_urls({"messages": [{"content": [part]}]})
    return "\x1f" + media_digest(urls[0]) if urls else ""


def _tokens(request: Request) -> int:
    """The tokens a request asks for (its limit times its choices), as the plan estimates them."""
    body = request.body
    # The first of chat's, responses' and completions' limits that is set (params.sampling's
    # rules; read here from the body: the parent plans millions of lines).
    limit = body.get("max_completion_tokens")
    if limit is None:
        limit = body.get("max_output_tokens")
    if limit is None:
        limit = body.get("max_tokens")
    n = body.get("n")
    choices = n if isinstance(n, int) and n > 0 else 1
    if request.url in POOLING_ENDPOINTS:
        return 0  # nothing generated
    return (limit if isinstance(limit, int) and limit > 0 else UNLIMITED_TOKENS) * choices


def expected_tokens(request: Request) -> int:
    """The tokens a request asks for, as the plan estimates them (run/prefixes.py reads it)."""
    return _tokens(request)


def _parts_size(content: Any) -> int:
    """A content list's characters, its media's URLs and data included (a 250 KB base64 image
    is 250 KB the window holds)."""
    if not isinstance(content, list):
        return 64
    total = 0
    for part in content:
        if isinstance(part, dict):
            total += sum(len(v) for v in part.values() if isinstance(v, str))
            total += sum(len(u) for u in media_urls({"messages": [{"content": [part]}]}))
    return total or 64


def prompt_chars(request: Request) -> int:
    """A cheap upper bound of a request's prompt characters (and its media's)."""
    return _size(request)


def _size(request: Request) -> int:
    """A cheap upper bound of a request's prompt characters, for the window's size."""
    body = request.body
    if request.url in SCORING_URLS:
        _, queries, documents = scoring_texts(request.url, body)
        return sum(map(len, queries)) + sum(map(len, documents))
    if isinstance(body.get("file_url"), str):  # a transcription's audio
        return len(body["file_url"])
    value = body.get("messages") or body.get("prompt") or body.get("input")
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        total = 0
        for item in value:
            if isinstance(item, dict):
                content = item.get("content")
                total += len(content) if isinstance(content, str) else _parts_size(content)
            else:
                total += len(item) if isinstance(item, str) else 8
        return total
    return 0
