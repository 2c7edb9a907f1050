"""The echo engine: no model. Replies with the last user message (chat, responses) or the prompt
(completions).

The reply honours ``stop`` (it ends before the first stop sequence) and ``max_tokens`` /
``max_completion_tokens`` (counting whitespace-separated words as tokens; finish_reason "length").
A prompt whose words plus ``max_tokens`` exceed ``--max-model-len`` is refused as the vLLM engine
refuses it (context_length_exceeded, 400), so a dry run shows those lines.
Embeddings requests get a deterministic unit vector per input, derived from a hash of the input:
`ECHO_DIMENSIONS` (8) float32 values by default, ``dimensions`` up to `ECHO_MAX_DIMENSIONS` (4096).
Up to 8 they are the hash's first bytes, renormalised (a shorter vector keeps the first values);
above, one of a few fixed random unit vectors of that size, rotated by the hash (cheap enough to
measure batchrun's own cost of large vectors: scripts/bench.py embeddings).
Score and rerank requests get the cosine similarity of the two texts' word counts (runs of
letters and digits, lowercased, each word a token; the truncation fields cut words), so identical texts score 1 and
texts with no word in common 0. Audio lines (transcriptions, translations) get OpenAI's
transcription shape with the line's ``prompt`` as the text (the audio is not decoded). With ``logprobs`` each whitespace-separated word is a token of
logprob 0. A forced tool call
(``tool_choice`` "required" or a named function) is answered with that call (for "required", of
the first tool) with empty arguments ``{}``. With ``--reasoning-parser`` (any name), a
``<think>...</think>`` span of the reply is its reasoning (one token a word), the rest its content.

For dry runs of a pipeline, for measuring batchrun's own overhead, and for fault injection from the
environment, so failures are testable from the command line:

- ``BATCHRUN_ECHO_DELAY_MS``: latency of each request, in milliseconds (requests overlap, like a
  continuously batching engine).
- ``BATCHRUN_ECHO_FAIL``: comma-separated custom_ids that fail (with a 500) for as long as listed.
- ``BATCHRUN_ECHO_CRASH_AFTER``: the worker process dies abruptly (SIGKILL to itself) after that
  many results.
- ``BATCHRUN_ECHO_CRASH_ON``: comma-separated custom_ids that kill the worker process abruptly
  (SIGKILL to itself) the moment the engine receives one of them: a poison request.
- ``BATCHRUN_ECHO_OOM_ABOVE``: starting with more than that many sequences (``max_num_seqs``), or
  running more than that many at once, raises an out-of-memory error shaped like PyTorch's.
- ``BATCHRUN_ECHO_NAN_ON``: comma-separated custom_ids whose embeddings begin with NaN, +infinity
  and -infinity (an engine's overflow), the rest of each vector as usual.
- ``BATCHRUN_ECHO_RECORD``: a file to which every custom_id the engine receives is appended, so
  that tests can assert what the engine was (and was not) asked to run; with
  ``BATCHRUN_ECHO_RECORD_MODEL`` set, each line is the custom_id, a tab and the engine's model
  name (which engine of a job of several models ran it).

And the faults of GPU engines (a start that raises, stuck ranks, hangs, an out-of-memory error
tied to one request): see engines/echo_faults.py. Every id list matches the custom_id, under
``serve`` too.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import random
import re
import signal
import struct
import time
from collections import Counter, deque
from typing import Any

from batchrun.config import EngineSettings
from batchrun.engines import echo_faults
from batchrun.engines.echo_faults import env_int, id_set, plain_id
from batchrun.openai.params import (
    Sampling,
    ScoreParams,
    context_exceeded,
    embedding_params,
    sampling,
    score_params,
)
from batchrun.openai.records import (
    AUDIO_ENDPOINTS,
    CHAT,
    EMBEDDINGS,
    RESPONSES,
    SCORING_URLS,
    TRANSCRIPTIONS,
    Outcome,
    Request,
)
from batchrun.openai.response_bodies import (
    Choice,
    TokenLogprob,
    answered,
    embedding_success,
    failure,
    refused,
    response_model,
    success,
)
from batchrun.openai.responses_api import last_user_text
from batchrun.openai.scoring_body import scoring_success
from batchrun.openai.toolchoice import ForcedCall, forced_answer
from batchrun.openai.vectors import float32_bytes, float32_values

# The size of the echo engine's embeddings, and the largest `dimensions` it takes.
ECHO_DIMENSIONS = 8
ECHO_MAX_DIMENSIONS = 4096
# Above ECHO_DIMENSIONS: how many fixed unit vectors of each size the hash chooses from.
_TABLES = 8
_WORDS = re.compile(r"\s*\S+")
# A word of a text to score: letters and digits, so "mat." and "mat" are one word.
_TEXT_WORD = re.compile(r"\w+")


class OutOfMemoryError(RuntimeError):
    """Shaped like torch.cuda.OutOfMemoryError: same class name, same message style."""


def echo_text(request: Request) -> str:
    """The echo reply: the last user message's text (chat, responses) or the prompt
    (completions)."""
    body = request.body
    if request.url == RESPONSES:
        return last_user_text(body)
    if request.url == CHAT:
        for message in reversed(body.get("messages") or []):
            if isinstance(message, dict) and message.get("role") == "user":
                return _content_text(message.get("content"))
        return ""
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        return str(prompt[0]) if prompt else ""
    return str(prompt)


def _content_text(content: Any) -> str:
    """A message's text: its string content, or its text parts joined with newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        # Newlines, as the vLLM engine joins them (and vLLM's server does): the README says so.
        return "\n".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


class EchoEngine:
    """A deterministic engine with no model, driven by the same step loop as vLLM."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        echo_faults.raise_start_error()
        self.delay_s = (env_int("BATCHRUN_ECHO_DELAY_MS") or 0) / 1000.0
        self.fail_ids = id_set("BATCHRUN_ECHO_FAIL")
        self.crash_after = env_int("BATCHRUN_ECHO_CRASH_AFTER")
        self.crash_on = id_set("BATCHRUN_ECHO_CRASH_ON")
        self.oom_above = env_int("BATCHRUN_ECHO_OOM_ABOVE")
        self.hang_after = env_int("BATCHRUN_ECHO_HANG_AFTER")
        self.hang_on = id_set("BATCHRUN_ECHO_HANG_ON")
        self.oom_on = id_set("BATCHRUN_ECHO_OOM_ON")
        self.nan_on = id_set("BATCHRUN_ECHO_NAN_ON")
        self.produced = 0
        record = os.environ.get("BATCHRUN_ECHO_RECORD")
        # Line-buffered: the record must survive the abrupt deaths this engine simulates.
        self._record = open(record, "a", buffering=1, encoding="utf-8") if record else None  # noqa: SIM115
        self._record_model = bool(os.environ.get("BATCHRUN_ECHO_RECORD_MODEL"))
        if self.oom_above is not None and settings.max_num_seqs > self.oom_above:
            raise OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB (simulated by the echo engine: "
                f"max_num_seqs {settings.max_num_seqs} > BATCHRUN_ECHO_OOM_ABOVE {self.oom_above})"
            )
        # Held by the engine object so that they live as long as it does; nothing stops them.
        self._ranks = echo_faults.spawn_ranks()
        # (added time, request), in the order added: every request takes the same delay, so they
        # are also due in that order (a queue, not a heap).
        self._running: deque[tuple[float, Request]] = deque()
        # Requests that never finish (BATCHRUN_ECHO_HANG_ON), by engine id; aborting drops them.
        self._hung: dict[str, Request] = {}
        # The BATCHRUN_ECHO_OOM_ON requests now running: any of them makes a step run out.
        self._oom_running: set[str] = set()

    def add(self, request: Request) -> Outcome | None:
        """Queue a request; it finishes `BATCHRUN_ECHO_DELAY_MS` later."""
        custom_id = plain_id(request.custom_id)
        if self._record is not None:
            model = f"\t{self.settings.model_name}" if self._record_model else ""
            self._record.write(f"{custom_id}{model}\n")
        if custom_id in self.crash_on:
            # A poison request: the engine dies on it the way a native crash does, at once.
            os.kill(os.getpid(), signal.SIGKILL)
        if custom_id in self.hang_on:
            self._hung[request.custom_id] = request
            return None
        if custom_id in self.oom_on:
            self._oom_running.add(request.custom_id)
        self._running.append((time.monotonic(), request))
        return None

    def abort(self, custom_id: str) -> None:
        """Drop a running request (the caller records its outcome); unknown ids are ignored."""
        if self._hung.pop(custom_id, None) is not None:
            return
        self._oom_running.discard(custom_id)
        for i, (_, request) in enumerate(self._running):
            if request.custom_id == custom_id:
                del self._running[i]
                return

    def step(self) -> list[Outcome]:
        """Finish every request whose delay has passed (sleeping until the first one is due)."""
        if self.crash_after is not None and self.produced >= self.crash_after:
            # Die the way a crashed engine dies: no cleanup, no goodbye message. Checked at the
            # start of a step, so the results of earlier steps have reached the parent.
            os.kill(os.getpid(), signal.SIGKILL)
        if self.hang_after is not None and self.produced >= self.hang_after:
            # Checked at the start of a step too, so the results of earlier steps are out.
            echo_faults.hang_forever()
        if self._oom_running:
            raise OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 20.00 GiB (simulated by the echo engine: "
                f"request {plain_id(min(self._oom_running))!r} is in BATCHRUN_ECHO_OOM_ON)"
            )
        if not self._running:
            if self._hung:
                time.sleep(0.01)  # as a step of an engine whose requests are all still running
            return []
        if self.oom_above is not None and len(self._running) > self.oom_above:
            raise OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 512.00 MiB (simulated by the echo engine: "
                f"{len(self._running)} sequences running > {self.oom_above})"
            )
        now = time.monotonic()
        delay = self.delay_s
        wait = self._running[0][0] + delay - now
        if wait > 0:
            # Cap the sleep so that the worker keeps reading new requests from its parent.
            time.sleep(min(wait, 0.01))
            now = time.monotonic()
        out: list[Outcome] = []
        running, finish, due = self._running, self._finish, now - delay
        while running and running[0][0] <= due:
            if self.crash_after is not None and self.produced >= self.crash_after:
                break
            if self.hang_after is not None and self.produced >= self.hang_after:
                break
            added, request = running.popleft()
            out.append(finish(request, now - added))
        return out

    def _finish(self, request: Request, latency_s: float) -> Outcome:
        self.produced += 1
        if self.fail_ids and plain_id(request.custom_id) in self.fail_ids:
            return failure(
                request,
                "engine_error",
                "simulated engine failure (BATCHRUN_ECHO_FAIL)",
                status_code=500,
                retryable=True,
                latency_s=latency_s,
            )
        if request.url == EMBEDDINGS:
            return self._embed(request, latency_s)
        if request.url in SCORING_URLS:
            return self._score(request, latency_s)
        if request.url in AUDIO_ENDPOINTS:
            return _speech(request, latency_s)
        params = sampling(request)
        prompt = echo_text(request)
        prompt_words = len(prompt.split())
        limit = self.settings.max_model_len
        too_long = (
            None if limit is None else context_exceeded(prompt_words, params.max_tokens, limit)
        )
        if too_long is not None:  # as the vLLM engine refuses it, words counted as tokens
            return refused(request, "context_length_exceeded", too_long, latency_s)
        text, finish_reason = _limit(params, prompt, prompt_words)
        tokens = max(1, prompt_words if text is prompt else len(text.split()))
        prompt_tokens = max(1, prompt_words)
        logprobs = _echo_logprobs(params, text)
        if params.echo:
            text = prompt + text
        tool_calls = None
        if params.forced_call is not None:
            # The forced call, with empty arguments, read back as the vLLM engine reads its own.
            text, tool_calls, finish_reason = forced_answer(
                params.forced_call,
                _forced_stub(params.forced_call, request),
                "stop",
                f"call_{hashlib.sha256(request.custom_id.encode()).hexdigest()[:24]}",
            )
        reasoning = None
        thinks = self.settings.reasoning_parser is not None and request.url in (CHAT, RESPONSES)
        if thinks:
            reasoning, text = _split_think(text)
        choice = Choice(
            text=text,
            finish_reason=finish_reason,
            token_count=tokens,
            logprobs=logprobs,
            tool_calls=tool_calls,
            reasoning=reasoning,
            reasoning_tokens=len(reasoning.split()) if reasoning else 0,
        )
        choices = [choice] * params.n  # frozen: one object serves every copy
        return success(
            request,
            choices,
            model=response_model(request, self.settings.model_name),
            prompt_tokens=prompt_tokens,
            reasoning=thinks,
            latency_s=latency_s,
        )

    def _embed(self, request: Request, latency_s: float) -> Outcome:
        fields = embedding_params(request)
        inputs = fields.inputs
        dimensions = fields.dimensions
        size = dimensions if dimensions is not None else ECHO_DIMENSIONS
        if not 1 <= size <= ECHO_MAX_DIMENSIONS:
            return refused(
                request,
                "invalid_request",
                f"body.dimensions must be between 1 and {ECHO_MAX_DIMENSIONS} for the echo "
                f"engine's embeddings, got {dimensions}",
                latency_s,
            )
        vectors = [echo_vector_bytes(item, size) for item in inputs]
        if self.nan_on and plain_id(request.custom_id) in self.nan_on:
            vectors = [_NON_FINITE[: len(v)] + v[len(_NON_FINITE) :] for v in vectors]
        prompt_tokens = sum(len(i) if isinstance(i, list) else len(i.split()) for i in inputs)
        return embedding_success(
            request,
            vectors,
            model=response_model(request, self.settings.model_name),
            prompt_tokens=prompt_tokens,
            latency_s=latency_s,
        )

    def _score(self, request: Request, latency_s: float) -> Outcome:
        fields = score_params(request)
        queries = [_words(fields, q, fields.max_tokens_per_query) for q in fields.queries]
        documents = [_words(fields, d, fields.max_tokens_per_doc) for d in fields.documents]
        scores = [word_cosine(queries[q], documents[d]) for q, d in fields.pairs()]
        return scoring_success(
            request,
            fields,
            scores,
            model=response_model(request, self.settings.model_name),
            # Each text counted once, the one query of 1:N too, as vLLM counts them.
            prompt_tokens=sum(len(w) for w in (*queries, *documents)),
            latency_s=latency_s,
        )

    def has_unfinished(self) -> bool:
        """Whether any request is still running."""
        return bool(self._running or self._hung)

    def close(self) -> None:
        """Release the record file."""
        self._running.clear()
        self._hung.clear()
        if self._record is not None:
            self._record.close()


def _speech(request: Request, latency_s: float) -> Outcome:
    """A transcription or translation in OpenAI's shape, without decoding the audio: the text is
    the line's `prompt` (empty without one), the duration 0 seconds."""
    text = str(request.body.get("prompt") or "")
    body: dict[str, Any] = {"text": text}
    if request.url == TRANSCRIPTIONS:
        body["usage"] = {"type": "duration", "seconds": 0}
    return answered(
        request,
        body,
        prompt_tokens=0,
        completion_tokens=len(text.split()),
        latency_s=latency_s,
    )


def echo_vector(item: str | list[int], size: int = ECHO_DIMENSIONS) -> list[float]:
    """A deterministic unit vector for an input: from the sha256 of its text or token ids; each
    value a float32 one, as a model's output is, so that base64 and float agree exactly."""
    return float32_values(echo_vector_bytes(item, size))


def echo_vector_bytes(item: str | list[int], size: int = ECHO_DIMENSIONS) -> bytes:
    """`echo_vector` as little-endian float32 bytes, as an engine hands a vector on."""
    key = item if isinstance(item, str) else ",".join(map(str, item))
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    if size <= ECHO_DIMENSIONS:
        raw = [(b - 127.5) / 127.5 for b in digest[:size]]
        norm = math.sqrt(sum(x * x for x in raw)) or 1.0
        return float32_bytes([x / norm for x in raw])
    # A rotation keeps a unit vector's norm: one slice of a table written out twice.
    table = _unit_tables(size)[digest[0] % _TABLES]
    start = int.from_bytes(digest[1:5], "little") % size * 4
    return table[start : start + size * 4]


@functools.lru_cache(maxsize=16)
def _unit_tables(size: int) -> tuple[bytes, ...]:
    """`_TABLES` fixed random unit vectors of `size` float32 values, each written twice over."""
    tables = []
    for j in range(_TABLES):
        rng = random.Random(f"batchrun-echo-{size}-{j}")  # a str seed: the same on every run
        values = [rng.gauss(0.0, 1.0) for _ in range(size)]
        norm = math.sqrt(sum(x * x for x in values))
        once = float32_bytes([x / norm for x in values])
        tables.append(once + once)
    return tuple(tables)


# NaN, +infinity and -infinity as little-endian float32 (BATCHRUN_ECHO_NAN_ON).
_NON_FINITE = struct.pack("<3f", math.nan, math.inf, -math.inf)


def _words(fields: ScoreParams, text: str, limit: int) -> list[str]:
    """A text's words as the echo engine's tokens, cut as the request's truncation fields say."""
    words = _TEXT_WORD.findall(text.lower())
    if limit > 0:
        words = words[:limit]
    keep = fields.truncate_prompt_tokens
    if keep is not None and keep > 0 and len(words) > keep:
        words = words[-keep:] if fields.truncation_side == "left" else words[:keep]
    return words


def word_cosine(a: list[str], b: list[str]) -> float:
    """The cosine similarity of two texts' word counts (0 when either has no word)."""
    ca, cb = Counter(a), Counter(b)
    dot = sum(n * cb[w] for w, n in ca.items())
    norm = math.sqrt(sum(n * n for n in ca.values())) * math.sqrt(sum(n * n for n in cb.values()))
    return dot / norm if norm else 0.0


def _split_think(text: str) -> tuple[str | None, str]:
    """The echo engine's stand-in for any --reasoning-parser: `<think>...</think>` in the reply
    is its reasoning, the rest its content."""
    before, start, rest = text.partition("<think>")
    if not start:
        return None, text
    reasoning, end, after = rest.partition("</think>")
    return reasoning.strip(), (before + after).strip() if end else before.strip()


def _forced_stub(forced: ForcedCall, request: Request) -> str:
    """What the echo engine "generates" under a forced call: the call with empty arguments."""
    if forced.name is not None:
        return "{}"
    first = request.body["tools"][0]["function"]["name"]
    return json.dumps([{"name": first, "parameters": {}}])


def _limit(params: Sampling, text: str, words: int | None = None) -> tuple[str, str]:
    """The reply cut at the first stop sequence (kept with include_stop_str_in_output) and at
    max_tokens words; its finish_reason.

    `words`: the number of words of `text`, when known. Uncut, `text` itself comes back.
    """
    keep = params.vllm is not None and params.vllm.include_stop_str_in_output
    for s in params.stop:
        if s and s in text:
            text = text[: text.index(s) + (len(s) if keep else 0)]
            words = None
    limit = params.max_tokens
    # Counting words is cheap; splitting into them (keeping the spaces between) is not.
    if limit is not None and (len(text.split()) if words is None else words) > limit:
        return "".join(_WORDS.findall(text)[:limit]), "length"
    return text, "stop"


def _echo_logprobs(params: Sampling, text: str) -> list[TokenLogprob] | None:
    """Logprobs for the echo reply when asked for: each word a token, certain (logprob 0)."""
    top = params.logprobs
    if top is None:
        return None
    result = []
    for word in _WORDS.findall(text):
        raw = word.encode("utf-8")
        result.append(TokenLogprob(word, raw, 0.0, ((word, raw, 0.0),) if top else ()))
    return result
