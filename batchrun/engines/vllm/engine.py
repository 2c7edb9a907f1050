"""The vLLM engine: OpenAI request bodies in, ChatCompletion / Completion / embedding outcomes out.

It drives vLLM's low-level step API (`LLMEngine.add_request` / `step`), so that the worker can keep
a window of requests in flight and top it up as each finishes, instead of handing vLLM fixed
batches and idling on the slowest member of each.

Prompts are tokenized by batchrun (`prompts.py`), not inside vLLM, so that a request that cannot fit in the context
becomes a per-request 400 outcome (as the OpenAI API answers it) before it reaches the engine.

Defaults follow the OpenAI API: temperature 1.0, top_p 1.0, n 1; `max_tokens` defaults to 16 for
`/v1/completions` (the legacy Completions API's documented default) and to the rest of the context
window (`max_model_len` minus the prompt) for `/v1/chat/completions`, as OpenAI and vLLM's own
server do. `max_model_len` (2048 by default in batchrun) is what bounds a runaway chat answer.

A pooling model (vLLM's pooling runner: chosen for an embeddings, score or rerank job, or by vLLM
itself for an encoder-only model such as BERT) answers those three (`embeddings.py`, `scoring.py`);
each input of a request is one vLLM request, and the request's outcome is built when the last of
them finishes. Its `max_model_len` is capped at the model's own limit (all-MiniLM-L6-v2: 256).

vLLM, torch and transformers are imported in the constructor only (and at use in the modules this
one calls): importing this module is cheap.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from batchrun import timeline
from batchrun.config import EngineSettings
from batchrun.engines.vllm.add_request import check_runner, submit
from batchrun.engines.vllm.args import engine_args
from batchrun.engines.vllm.audio import AudioWork, LanguageDetection, audio_work
from batchrun.engines.vllm.cache import PrefixCacheCounter
from batchrun.engines.vllm.embeddings import EmbeddingWork, embedding_work
from batchrun.engines.vllm.errors import BadRequest
from batchrun.engines.vllm.lazy_kv import install as install_fresh_kv_cache
from batchrun.engines.vllm.lora import LoraRoutes, lora_engine_args
from batchrun.engines.vllm.media import (
    check_modalities,
    media_engine_args,
    media_messages,
    modalities,
    prompt_length,
    render_media_chat,
    set_fetch_timeouts,
    warm_media_path,
)
from batchrun.engines.vllm.model_defaults import model_defaults, with_model_defaults
from batchrun.engines.vllm.outcome import generation_outcome
from batchrun.engines.vllm.params import sampling_params
from batchrun.engines.vllm.platform import on_cuda
from batchrun.engines.vllm.prompts import prompt_token_ids, request_template_kwargs
from batchrun.engines.vllm.reasoning import Reasoner
from batchrun.engines.vllm.release import release_vllm_globals
from batchrun.engines.vllm.scoring import Scorer, ScoreWork
from batchrun.engines.vllm.tokens import TokenText
from batchrun.engines.vllm.ttft import first_token_s
from batchrun.models import engine_model
from batchrun.openai.params import Sampling, sampling
from batchrun.openai.records import (
    AUDIO_ENDPOINTS,
    CHAT,
    EMBEDDINGS,
    POOLING_ENDPOINTS,
    RESPONSES,
    Outcome,
    Request,
)
from batchrun.openai.response_bodies import failure, refused, response_model


@dataclass
class _Pending:
    """A request inside vLLM: when it was added, and for pooling requests their outputs so far."""

    request: Request
    added: float
    params: Sampling | None = None  # generation requests: what generation_outcome reads back
    # The chat template's extra inputs the prompt was rendered with (a reasoning parser reads
    # them: Qwen3's knows from them whether thinking was on).
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    # Pooling requests: their vLLM inputs and how their outputs become the answer (`work`), and
    # one slot per input (an item, a text or a pair), filled with its pooled data as it finishes.
    work: EmbeddingWork | ScoreWork | AudioWork | LanguageDetection | None = None
    parts: list[Any] = field(default_factory=list)
    remaining: int = 0


class VllmEngine:
    """The Engine protocol over vLLM's `LLMEngine` (its engine core in this process on a CPU)."""

    def __init__(self, settings: EngineSettings) -> None:
        self._settings = settings
        # A directory (the default model or a .gguf file converted here if this machine has no
        # conversion yet), or a hub id that vLLM finds in this machine's cache or downloads.
        target = engine_model(
            settings.model,
            tokenizer=settings.tokenizer,
            revision=settings.model_commit or settings.revision,
        )
        # Set by prepare_model: --served-model-name, else the hub id or the directory's name.
        self.model_name = settings.model_name

        cuda = on_cuda()
        if not cuda:
            # On the CPU backend, vLLM's engine core runs in this process rather than in a child
            # it spawns: that child's scheduler polls without sleeping, a core of two. On a GPU
            # vLLM's own engine-core process stays (it overlaps scheduling and output handling
            # with the forward pass); it and the ranks are in the worker's process group, which
            # the parent kills whole (workers/process_group.py). Set before LLMEngine is
            # imported (vllm.envs reads it at use, but set early to be safe across versions).
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

        from vllm import LLMEngine
        from vllm.usage.usage_lib import UsageContext

        timeline.mark("vllm_imported")
        if not cuda:
            # The KV cache on fresh zero pages, faulted in as used, instead of written whole at
            # start: 3-11 s of a CPU engine's start (lazy_kv.py).
            install_fresh_kv_cache()

        args = engine_args(settings, target, self.model_name)
        for name, value in lora_engine_args(settings, cuda=cuda).items():
            setattr(args, name, value)
        for name, value in media_engine_args(settings).items():
            setattr(args, name, value)
        set_fetch_timeouts(settings)
        # A line naming an adapter in body.model runs with that adapter (lora.py).
        self._lora = LoraRoutes(settings)
        self._cache = PrefixCacheCounter()
        self._engine: Any = LLMEngine.from_engine_args(
            args,
            # vLLM's offline defaults for the device, its LLM class's: tokens per step 16384 on an
            # H100 and 4096 on a CPU, where an engine's own default is 2048 (on the CPU,
            # prefill-heavy work, questions over shared documents, ran 6-7% behind raw LLM.chat
            # at 2048 and 2-4% behind at 4096 in the next run: docs/benchmarks.md).
            usage_context=UsageContext.LLM_CLASS,
            stat_loggers=[self._cache.factory()],
        )
        timeline.mark("engine_built")
        self._tokenizer: Any = self._engine.get_tokenizer()
        model_config = self._engine.model_config
        self.max_model_len: int = int(model_config.max_model_len)
        self.pooling: bool = model_config.runner_type == "pooling"
        self.embedding_size: int = int(getattr(model_config, "embedding_size", 0) or 0)
        # Whether `dimensions` can shorten the embeddings (Matryoshka-trained models only).
        self.matryoshka: bool = bool(getattr(model_config, "is_matryoshka", False))
        self.vocab_size: int = int(model_config.get_vocab_size())
        # The model's generation-config defaults for what a request leaves unset (as vLLM's
        # server applies them); the worker's "ready" names them for the job's output.
        self.sampling_defaults: dict[str, Any] = (
            {} if self.pooling else model_defaults(model_config)
        )
        self._modalities = modalities(self._engine)  # what media parts the model takes
        if self._modalities:
            # Before the worker says it is ready: what the first media line would wait for.
            warm_media_path(self._engine, self._modalities)
            self._cache.reset()  # the warm-up's lookups are no line's
        template = getattr(self._tokenizer, "chat_template", None)
        self._template: str = template if isinstance(template, str) else ""
        self._tokens = TokenText(self._tokenizer)
        self._reasoner = (
            Reasoner(settings.reasoning_parser, self._tokenizer, model_config)
            if settings.reasoning_parser is not None and not self.pooling
            else None
        )
        # custom_id -> the request in flight: what step() needs to answer.
        self._in_flight: dict[str, _Pending] = {}
        # vLLM request id of one part of a pooling request -> (custom_id, part index).
        self._parts: dict[str, tuple[str, int]] = {}
        self._scorer = Scorer(
            self._engine,
            self._tokenizer,
            max_model_len=self.max_model_len,
            model_name=self.model_name,
        )

    def add(self, request: Request) -> Outcome | None:
        """Queue a request; return a 400 Outcome at once if it cannot run as written."""
        if request.custom_id in self._in_flight:
            # vLLM keys its outputs by this id; a second copy in flight would be answered twice.
            raise ValueError(f"request {request.custom_id!r} is already in flight")
        pending = _Pending(request, time.monotonic())
        try:
            check_runner(request, pooling=self.pooling, model_name=self.model_name)
            if request.url in POOLING_ENDPOINTS or request.url in AUDIO_ENDPOINTS:
                # Several vLLM requests answer it (an input, a pair, an audio clip each).
                self._add_pooled(pending)
            else:
                if request.url in (CHAT, RESPONSES):
                    pending.template_kwargs = request_template_kwargs(
                        request, template=self._template, model_name=self.model_name
                    )
                prompt_ids: Any
                media = media_messages(request)  # chat messages holding media parts
                if media is not None:
                    # Media parts: rendered and read by vLLM's own chat path (media.py).
                    check_modalities(media, self._modalities, self.model_name)
                    prompt_ids = render_media_chat(
                        self._engine, request, media, pending.template_kwargs
                    )
                    prompt_len = prompt_length(prompt_ids)
                else:
                    prompt_ids = prompt_token_ids(
                        self._tokenizer,
                        request,
                        template=self._template,
                        model_name=self.model_name,
                        kwargs=pending.template_kwargs,
                    )
                    prompt_len = len(prompt_ids)
                pending.params = with_model_defaults(
                    sampling(request), request.body, self.sampling_defaults
                )
                params = sampling_params(
                    pending.params,
                    prompt_len,
                    max_model_len=self.max_model_len,
                    vocab_size=self.vocab_size,
                    default_max_tokens=self.sampling_defaults.get("max_tokens"),
                )
                submit(
                    self._engine,
                    request.custom_id,
                    prompt_ids,
                    params,
                    lora=self._lora.request_for(request.body.get("model")),
                )
        except BadRequest as exc:
            return refused(request, exc.code, exc.message)
        self._in_flight[request.custom_id] = pending
        return None

    def step(self) -> list[Outcome]:
        """Run one engine iteration; return the outcomes of the requests that finished in it."""
        outputs = self._engine.step()
        now = time.monotonic()
        outcomes: list[Outcome] = []
        for output in outputs:
            if not getattr(output, "finished", False):
                continue  # FINAL_ONLY sends finished requests only; be safe all the same
            part = self._parts.pop(output.request_id, None)
            if part is not None:
                outcome = self._pooled_part(part, output, now)
                if outcome is not None:
                    outcomes.append(outcome)
                continue
            pending = self._in_flight.pop(output.request_id, None)
            if pending is None:
                continue
            outcome = generation_outcome(
                pending.request,
                pending.params,
                pending.template_kwargs,
                output,
                now - pending.added,
                tokens=self._tokens,
                reasoner=self._reasoner,
                model_name=self.model_name,
            )
            outcome.ttft_s = first_token_s(output)  # /metrics' time to first token
            outcomes.append(outcome)
        if self._in_flight and not self._engine.has_unfinished_requests():
            # vLLM holds none of them any more yet never answered them: fail them (retryable)
            # rather than let the caller step an idle engine forever.
            for pending in self._in_flight.values():
                outcomes.append(
                    failure(
                        pending.request,
                        "engine_error",
                        "vLLM dropped the request without an answer",
                        status_code=500,
                        retryable=True,
                        latency_s=now - pending.added,
                    )
                )
            self._in_flight.clear()
            self._parts.clear()
        return outcomes

    def has_unfinished(self) -> bool:
        """Whether any added request has not finished yet."""
        return bool(self._in_flight)

    def abort(self, custom_id: str) -> None:
        """Drop a running request from vLLM (--request-timeout); the caller records its outcome.
        A generation request is vLLM's request of the same id; a pooling request, one per input."""
        pending = self._in_flight.pop(custom_id, None)
        if pending is None:
            return
        if pending.work is None:
            ids = [custom_id]
        else:
            ids = [p for p, (cid, _) in self._parts.items() if cid == custom_id]
            for part_id in ids:
                del self._parts[part_id]
        if ids:
            # External ids: vLLM maps them to its internal ones (and a request's n children).
            self._engine.abort_request(ids)

    def prefix_cache_counters(self) -> tuple[int, int]:
        """vLLM's prefix-cache counters: prompt tokens looked up, and found cached."""
        return self._cache.counters()

    def kv_cache_size(self) -> tuple[int, int] | None:
        """The KV cache vLLM allocated, in tokens (its blocks times their size), and the tokens
        of a block; None when it caches no prefixes (prefix caching off, a pooling model)."""
        cache = self._engine.vllm_config.cache_config
        blocks, block = cache.num_gpu_blocks, cache.block_size
        if self.pooling or not cache.enable_prefix_caching or not blocks or not block:
            return None
        return int(blocks) * int(block), int(block)

    def close(self) -> None:
        """Shut the engine down and free its memory (idempotent)."""
        engine, self._engine = self._engine, None
        self._tokenizer = None
        self._scorer.close()  # it holds the engine too
        self._in_flight.clear()
        self._parts.clear()
        if engine is None:
            return
        try:
            engine.engine_core.shutdown()
        finally:
            del engine
            release_vllm_globals()

    # -- requests -> vLLM inputs ------------------------------------------------------------------

    def _add_pooled(self, pending: _Pending) -> None:
        """Submit each input of an embeddings, score or rerank request as its own vLLM pooling
        request: all of them, or (a BadRequest) none."""
        request = pending.request
        if request.url == EMBEDDINGS:
            work: EmbeddingWork | ScoreWork | AudioWork | LanguageDetection = embedding_work(
                self._tokenizer,
                request,
                max_model_len=self.max_model_len,
                vocab_size=self.vocab_size,
                embedding_size=self.embedding_size,
                matryoshka=self.matryoshka,
                model_name=self.model_name,
            )
        elif request.url in AUDIO_ENDPOINTS:
            work = audio_work(self._engine, request, self._settings)
        else:
            work = self._scorer.plan(request)
        self._submit_parts(pending, work)

    def _submit_parts(
        self, pending: _Pending, work: EmbeddingWork | ScoreWork | AudioWork | LanguageDetection
    ) -> None:
        """Submit each of `work`'s inputs as a vLLM request of its own: all, or (a BadRequest)
        none. A language detection's one part is `ID#lang`, the request's own parts `ID#i`."""
        request = pending.request
        pending.work, inputs = work, work.inputs
        pending.parts = [None] * len(inputs)
        pending.remaining = len(inputs)
        detecting = isinstance(work, LanguageDetection)
        submitted: list[str] = []
        try:
            for i, (prompt, params) in enumerate(inputs):
                part_id = f"{request.custom_id}#{'lang' if detecting else i}"
                submit(self._engine, part_id, prompt, params)
                submitted.append(part_id)
                self._parts[part_id] = (request.custom_id, i)
        except BadRequest:
            if submitted:
                self._engine.abort_request(submitted)
            for part_id in submitted:
                self._parts.pop(part_id, None)
            raise

    # -- vLLM outputs -> outcomes -----------------------------------------------------------------

    def _pooled_part(self, part: tuple[str, int], output: Any, now: float) -> Outcome | None:
        """Record one part's pooled data; return the request's outcome once its last one is in."""
        custom_id, index = part
        pending = self._in_flight.get(custom_id)
        if pending is None or pending.work is None:
            return None  # the request already failed on another of its inputs
        error = getattr(output, "error", None)
        if error is not None:
            self._in_flight.pop(custom_id)
            siblings = [p for p, (cid, _) in self._parts.items() if cid == custom_id]
            if siblings:
                self._engine.abort_request(siblings)
                for p in siblings:
                    self._parts.pop(p, None)
            return failure(
                pending.request,
                "engine_error",
                f"vLLM failed the {pending.work.what}: {getattr(error, 'message', error)}",
                status_code=500,
                retryable=True,
                latency_s=now - pending.added,
            )
        if isinstance(pending.work, LanguageDetection):
            # The language found: the request itself goes in now, its clips in that language.
            try:
                self._submit_parts(pending, pending.work.finish(output))
            except BadRequest as exc:
                self._in_flight.pop(custom_id)
                return refused(pending.request, exc.code, exc.message)
            return None
        # A clip's whole RequestOutput (its text and tokens); an input's pooled data.
        pending.parts[index] = (
            output if isinstance(pending.work, AudioWork) else output.outputs.data
        )
        pending.remaining -= 1
        if pending.remaining > 0:
            return None
        self._in_flight.pop(custom_id)
        request = pending.request
        return pending.work.outcome(
            request,
            pending.parts,
            model=response_model(request, self.model_name),
            latency_s=now - pending.added,
        )
