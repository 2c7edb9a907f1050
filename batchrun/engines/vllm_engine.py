"""The vLLM engine: OpenAI request bodies in, ChatCompletion / Completion / embedding outcomes out.

It drives vLLM's low-level step API (`LLMEngine.add_request` / `step`), so that the worker can keep
a window of requests in flight and top it up as each finishes, instead of handing vLLM fixed
batches and idling on the slowest member of each.

Prompts are tokenized here, not inside vLLM, so that a request that cannot fit in the context
becomes a per-request 400 outcome (as the OpenAI API answers it) before it reaches the engine.

Defaults follow the OpenAI API: temperature 1.0, top_p 1.0, n 1; `max_tokens` defaults to 16 for
`/v1/completions` (the legacy Completions API's documented default) and to the rest of the context
window (`max_model_len` minus the prompt) for `/v1/chat/completions`, as OpenAI and vLLM's own
server do. `max_model_len` (2048 by default in batchrun) is what bounds a runaway chat answer.

An embedding model (vLLM's pooling runner: chosen for a `/v1/embeddings` job, or by vLLM itself for
an encoder-only model such as BERT) answers `/v1/embeddings`; each input of a request is one vLLM
request, and the request's outcome is built when the last of them finishes. Its `max_model_len`
is capped at the model's own limit (all-MiniLM-L6-v2 takes 256 tokens).

vLLM, torch and transformers are imported in the constructor only: importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from batchrun.config import EngineSettings
from batchrun.models import DEFAULT_MODEL_NAME, resolve_model
from batchrun.records import CHAT, COMPLETIONS, EMBEDDINGS, Outcome, Request
from batchrun.responses import (
    Choice,
    TokenLogprob,
    embedding_success,
    failure,
    response_model,
    success,
)
from batchrun.validation import embedding_inputs

# On the CPU backend `gpu_memory_utilization` is the fraction of host memory vLLM reserves, and
# vLLM's default (0.92) is refused at start-up on a machine that runs anything else.
CPU_MEMORY_UTILIZATION = 0.4

_OPENAI_FINISH_REASONS = {"stop": "stop", "length": "length"}


class _BadRequest(Exception):
    """A request that can never succeed as written: it becomes a 400 outcome, never retried."""

    def __init__(self, message: str, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class _Pending:
    """A request inside vLLM: when it was added, and for embeddings the vectors so far."""

    request: Request
    added: float
    # /v1/embeddings: one slot per input, filled as each input's vLLM request finishes.
    vectors: list[list[float] | None] = field(default_factory=list)
    remaining: int = 0
    prompt_tokens: int = 0


class VllmEngine:
    """The Engine protocol over vLLM's `LLMEngine`, running its engine core in this process."""

    def __init__(self, settings: EngineSettings) -> None:
        self._settings = settings
        model_dir, display_name = resolve_model(settings.model)
        # settings.model_name names the default model unless the user set it; for a model
        # directory given without a name, report the directory's name instead.
        if settings.model is not None and settings.model_name == DEFAULT_MODEL_NAME:
            self.model_name = display_name
        else:
            self.model_name = settings.model_name

        # Run vLLM's engine core in this process rather than in a child it spawns: the worker is
        # then the only process holding the model, so killing it (kill -9 included) frees the
        # accelerator with no orphaned engine process left behind. Must be set before vllm is
        # imported (vllm.envs reads it at use, but set early to be safe across versions).
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

        import torch
        from vllm import EngineArgs, LLMEngine

        memory_utilization = settings.gpu_memory_utilization
        if memory_utilization is None and not torch.cuda.is_available():
            memory_utilization = CPU_MEMORY_UTILIZATION
        extra: dict[str, Any] = {}
        if memory_utilization is not None:
            extra["gpu_memory_utilization"] = memory_utilization
        # An embeddings job runs the model as a pooling model (vLLM converts a generative one);
        # otherwise vLLM picks the runner from the architecture (an encoder-only model pools).
        if settings.endpoint == EMBEDDINGS:
            extra["runner"] = "pooling"

        # EngineArgs types dtype as a Literal; the value is validated by vLLM itself.
        dtype: Any = resolve_dtype(settings.dtype, cuda=torch.cuda.is_available())
        if settings.max_model_len is not None:
            extra["max_model_len"] = _max_model_len(
                EngineArgs(model=model_dir, tokenizer=model_dir, dtype=dtype, **extra),
                settings.max_model_len,
            )
        args = EngineArgs(
            model=model_dir,
            tokenizer=model_dir,
            dtype=dtype,
            tensor_parallel_size=settings.tensor_parallel_size,
            # Unset: eager on the CPU backend, where compiling costs more start-up than it saves.
            enforce_eager=(
                settings.enforce_eager
                if settings.enforce_eager is not None
                else not torch.cuda.is_available()
            ),
            seed=settings.seed,
            max_num_seqs=settings.max_num_seqs,
            # Periodic throughput lines on stderr are noise in a batch job; batchrun reports
            # its own progress.
            disable_log_stats=True,
            **extra,
        )
        self._engine: Any = LLMEngine.from_engine_args(args)
        self._tokenizer: Any = self._engine.get_tokenizer()
        model_config = self._engine.model_config
        self.max_model_len: int = int(model_config.max_model_len)
        self.pooling: bool = model_config.runner_type == "pooling"
        self.embedding_size: int = int(getattr(model_config, "embedding_size", 0) or 0)
        # Whether `dimensions` can shorten the embeddings (Matryoshka-trained models only).
        self.matryoshka: bool = bool(getattr(model_config, "is_matryoshka", False))
        self.vocab_size: int = int(model_config.get_vocab_size())
        template = getattr(self._tokenizer, "chat_template", None)
        self._template: str = template if isinstance(template, str) else ""
        self._tokens = _TokenText(self._tokenizer)
        # custom_id -> the request in flight: what step() needs to answer.
        self._in_flight: dict[str, _Pending] = {}
        # vLLM request id of one embeddings input -> (custom_id, input index).
        self._parts: dict[str, tuple[str, int]] = {}

    def add(self, request: Request) -> Outcome | None:
        """Queue a request; return a 400 Outcome at once if it cannot run as written."""
        if request.custom_id in self._in_flight:
            # vLLM keys its outputs by this id; a second copy in flight would be answered twice.
            raise ValueError(f"request {request.custom_id!r} is already in flight")
        pending = _Pending(request, time.monotonic())
        try:
            self._check_runner(request)
            if request.url == EMBEDDINGS:
                self._add_embeddings(pending)
            else:
                prompt_ids = self._prompt_token_ids(request)
                params = self._sampling_params(request, len(prompt_ids))
                self._submit(request.custom_id, prompt_ids, params)
        except _BadRequest as exc:
            return failure(request, exc.code, exc.message, status_code=400, retryable=False)
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
                outcome = self._embedding_part(part, output, now)
                if outcome is not None:
                    outcomes.append(outcome)
                continue
            pending = self._in_flight.pop(output.request_id, None)
            if pending is None:
                continue
            outcomes.append(self._outcome(pending.request, output, now - pending.added))
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

    def close(self) -> None:
        """Shut the engine down and free its memory (idempotent)."""
        engine, self._engine = self._engine, None
        self._tokenizer = None
        self._in_flight.clear()
        self._parts.clear()
        if engine is None:
            return
        try:
            engine.engine_core.shutdown()
        finally:
            del engine
            _release_vllm_globals()

    # -- requests -> vLLM inputs ------------------------------------------------------------------

    def _check_runner(self, request: Request) -> None:
        """Refuse a request the loaded model cannot answer (an embedding model cannot chat)."""
        if request.url == EMBEDDINGS and not self.pooling:
            raise _BadRequest(
                f"{self.model_name} was started as a generative model, which gives no embeddings; "
                "/v1/embeddings needs an embedding model (a job whose url is /v1/embeddings "
                "starts the model as one)"
            )
        if request.url != EMBEDDINGS and self.pooling:
            raise _BadRequest(
                f"{self.model_name} runs as an embedding (pooling) model, which generates no "
                f"text; {request.url} needs a generative model"
            )

    def _prompt_token_ids(self, request: Request) -> list[int]:
        """Tokenize the request's prompt (chat messages through the model's chat template)."""
        body = request.body
        if request.url == CHAT:
            messages = _chat_messages(body.get("messages"))
            kwargs = self._template_kwargs(body)
            try:
                text = self._tokenizer.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=True, **kwargs
                )
            except Exception as exc:  # a template may raise on roles or orders it rejects
                raise _BadRequest(
                    f"the model's chat template rejected the messages: {exc}"
                ) from exc
            # The template already wrote the special tokens the model expects.
            ids = self._tokenizer.encode(str(text), add_special_tokens=False)
        elif request.url == COMPLETIONS:
            ids = self._tokenizer.encode(_completion_prompt(body.get("prompt")))
        else:
            raise _BadRequest(f"unsupported endpoint {request.url!r}")
        if not ids:
            raise _BadRequest("the prompt is empty")
        return [int(i) for i in ids]

    def _template_kwargs(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The chat template's extra inputs (tools, reasoning_effort), if the template takes them."""
        kwargs: dict[str, Any] = {}
        tools = body.get("tools")
        if tools:
            if not template_takes(self._template, "tools"):
                raise _BadRequest(
                    f"body.tools is not supported with {self.model_name}: its chat template has "
                    "no place for tools, so the model would never see them; remove body.tools "
                    "or use a model whose chat template takes tools"
                )
            kwargs["tools"] = tools
        effort = body.get("reasoning_effort")
        if effort is not None:
            if not template_takes(self._template, "reasoning_effort"):
                raise _BadRequest(
                    f"body.reasoning_effort is not supported with {self.model_name}: its chat "
                    "template takes no reasoning effort (it is not a reasoning model); remove it"
                )
            kwargs["reasoning_effort"] = effort
        return kwargs

    def _sampling_params(self, request: Request, prompt_tokens: int) -> Any:
        """Build vLLM SamplingParams from the body's OpenAI sampling fields."""
        from vllm.exceptions import VLLMClientError
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        body = request.body
        remaining = self.max_model_len - prompt_tokens
        if request.url == CHAT:
            # max_completion_tokens replaced max_tokens in the chat API; honour either.
            max_tokens = _int_field(body, "max_completion_tokens")
            if max_tokens is None:
                max_tokens = _int_field(body, "max_tokens")
        else:
            max_tokens = _int_field(body, "max_tokens", default=16)
        needed = max_tokens if max_tokens is not None else 1
        if prompt_tokens + needed > self.max_model_len:
            asked = f"{max_tokens} completion tokens" if max_tokens is not None else "1 token"
            raise _BadRequest(
                f"this model's maximum context length is {self.max_model_len} tokens; the prompt "
                f"has {prompt_tokens} tokens and {asked} were requested",
                code="context_length_exceeded",
            )
        n = _int_field(body, "n")
        try:
            return SamplingParams(
                n=n if n is not None else 1,
                temperature=_float_field(body, "temperature", 1.0),
                top_p=_float_field(body, "top_p", 1.0),
                presence_penalty=_float_field(body, "presence_penalty", 0.0),
                frequency_penalty=_float_field(body, "frequency_penalty", 0.0),
                seed=_int_field(body, "seed"),
                stop=_stop_field(body.get("stop")),
                max_tokens=max_tokens if max_tokens is not None else remaining,
                logprobs=_logprobs_field(request),
                logit_bias=self._logit_bias(body.get("logit_bias")),
                structured_outputs=_structured_outputs(body.get("response_format")),
                # Only the final output of each request is wanted: no per-token RequestOutputs.
                output_kind=RequestOutputKind.FINAL_ONLY,
            )
        except (ValueError, TypeError, VLLMClientError) as exc:
            raise _BadRequest(str(exc)) from exc

    def _logit_bias(self, value: object) -> dict[int, float] | None:
        """`logit_bias` with int token ids; an id outside the vocabulary is a 400."""
        if not isinstance(value, Mapping) or not value:
            return None
        bias: dict[int, float] = {}
        for key, weight in value.items():
            try:
                token = int(key)
            except (TypeError, ValueError):
                raise _BadRequest(f"body.logit_bias key {key!r} is not a token id") from None
            if not 0 <= token < self.vocab_size:
                raise _BadRequest(
                    f"body.logit_bias names token id {token}, outside this model's vocabulary "
                    f"(ids 0 to {self.vocab_size - 1})"
                )
            bias[token] = float(weight)
        return bias

    def _add_embeddings(self, pending: _Pending) -> None:
        """Submit each input of an embeddings request as its own vLLM pooling request."""
        from vllm.pooling_params import PoolingParams

        request = pending.request
        body = request.body
        prompts: list[list[int]] = []
        for i, item in enumerate(embedding_inputs(body.get("input"))):
            if isinstance(item, str):
                ids = [int(t) for t in self._tokenizer.encode(item)]
            else:
                ids = [int(t) for t in item]
                bad = next((t for t in ids if t >= self.vocab_size), None)
                if bad is not None:
                    raise _BadRequest(
                        f"body.input holds token id {bad}, outside this model's vocabulary "
                        f"(ids 0 to {self.vocab_size - 1})"
                    )
            if len(ids) > self.max_model_len:
                where = (
                    "body.input"
                    if i == 0 and isinstance(body.get("input"), str)
                    else (f"body.input[{i}]")
                )
                raise _BadRequest(
                    f"this model's maximum context length is {self.max_model_len} tokens; "
                    f"{where} has {len(ids)} tokens",
                    code="context_length_exceeded",
                )
            prompts.append(ids)
        dimensions = _int_field(body, "dimensions")
        if dimensions is not None and dimensions == self.embedding_size:
            dimensions = None  # the model's own size: nothing to reduce
        if dimensions is not None and not self.matryoshka:
            raise _BadRequest(
                f"body.dimensions {dimensions} is not supported with {self.model_name}: its "
                f"embeddings have {self.embedding_size} dimensions and cannot be shortened (it is "
                f"not a Matryoshka model); remove body.dimensions or set it to "
                f"{self.embedding_size}"
            )
        pending.vectors = [None] * len(prompts)
        pending.remaining = len(prompts)
        pending.prompt_tokens = sum(len(p) for p in prompts)
        submitted: list[str] = []
        try:
            for i, ids in enumerate(prompts):
                part_id = f"{request.custom_id}#{i}"
                self._submit(part_id, ids, PoolingParams(task="embed", dimensions=dimensions))
                submitted.append(part_id)
                self._parts[part_id] = (request.custom_id, i)
        except _BadRequest:
            if submitted:
                self._engine.abort_request(submitted)
            for part_id in submitted:
                self._parts.pop(part_id, None)
            raise

    def _submit(self, request_id: str, prompt_ids: list[int], params: Any) -> None:
        """Hand the tokenized request to vLLM; its own input checks become 400s too."""
        from vllm.exceptions import VLLMClientError
        from vllm.inputs import TokensPrompt

        prompt: Any = TokensPrompt(prompt_token_ids=prompt_ids)
        try:
            # vLLM 0.32 deprecates raw prompts in add_request in favour of the renderer's output;
            # older versions have no renderer and take the raw prompt.
            renderer = getattr(self._engine, "renderer", None)
            if renderer is not None and hasattr(renderer, "render_cmpl"):
                prompt = renderer.render_cmpl([prompt])[0]
            self._engine.add_request(request_id, prompt, params)
        except (ValueError, TypeError, VLLMClientError) as exc:
            raise _BadRequest(str(exc)) from exc

    # -- vLLM outputs -> outcomes -----------------------------------------------------------------

    def _outcome(self, request: Request, output: Any, latency_s: float) -> Outcome:
        """Turn a finished RequestOutput into a success, or a retryable failure if vLLM failed."""
        completions = sorted(output.outputs, key=lambda c: int(c.index))
        reasons = [
            str(c.finish_reason) if c.finish_reason is not None else "stop" for c in completions
        ]
        # "error" is vLLM's retryable internal failure (e.g. a lost KV block); "abort" means the
        # request was cancelled inside vLLM. Neither is an answer; another attempt may be.
        for reason in ("error", "abort"):
            if reason in reasons:
                return failure(
                    request,
                    "engine_error" if reason == "error" else "aborted",
                    f"vLLM finished the request with finish_reason={reason!r}",
                    status_code=500,
                    retryable=True,
                    latency_s=latency_s,
                )
        body = request.body
        top = _logprobs_field(request)
        parse_tools = bool(body.get("tools")) and body.get("tool_choice") != "none"
        prefix = ""
        if request.url == COMPLETIONS and body.get("echo") is True:
            prefix = _completion_prompt(body.get("prompt"))
        choices = []
        for c, reason in zip(completions, reasons, strict=True):
            text = c.text
            tool_calls = None
            if parse_tools:
                text, tool_calls = parse_tool_calls(text)
            choices.append(
                Choice(
                    text=prefix + text,
                    # OpenAI knows "stop" and "length"; vLLM's "repetition" (an early stop on a
                    # detected loop, only when asked for) is a stop.
                    finish_reason=_OPENAI_FINISH_REASONS.get(reason, "stop"),
                    token_count=len(c.token_ids),
                    logprobs=None if top is None else self._logprobs(c, top),
                    tool_calls=tool_calls,
                )
            )
        prompt_ids = output.prompt_token_ids
        return success(
            request,
            choices,
            model=response_model(request, self.model_name),
            prompt_tokens=len(prompt_ids) if prompt_ids is not None else 0,
            latency_s=latency_s,
        )

    def _logprobs(self, completion: Any, top: int) -> list[TokenLogprob]:
        """One completion's logprobs: per generated token, itself and the `top` likeliest."""
        result: list[TokenLogprob] = []
        token_ids = list(completion.token_ids)
        steps = completion.logprobs or []
        # The end-of-sequence token that stopped generation is not part of the answer's text;
        # OpenAI's logprobs cover the answer's tokens only.
        if (
            token_ids
            and completion.finish_reason == "stop"
            and self._tokens.is_special(token_ids[-1])
        ):
            token_ids = token_ids[:-1]
        for token_id, step in zip(token_ids, steps, strict=False):
            chosen = step.get(token_id) if step else None
            logprob = float(chosen.logprob) if chosen is not None else float("-inf")
            ranked = sorted(step.items(), key=lambda kv: -kv[1].logprob) if step else []
            result.append(
                TokenLogprob(
                    token=self._tokens.text(token_id, chosen),
                    token_bytes=self._tokens.raw(token_id, chosen),
                    logprob=logprob,
                    top=tuple(
                        (self._tokens.text(tid, lp), self._tokens.raw(tid, lp), float(lp.logprob))
                        for tid, lp in ranked[:top]
                    ),
                )
            )
        return result

    def _embedding_part(self, part: tuple[str, int], output: Any, now: float) -> Outcome | None:
        """Record one input's vector; return the request's outcome once its last one is in."""
        custom_id, index = part
        pending = self._in_flight.get(custom_id)
        if pending is None:
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
                f"vLLM failed the embedding: {getattr(error, 'message', error)}",
                status_code=500,
                retryable=True,
                latency_s=now - pending.added,
            )
        data = output.outputs.data
        pending.vectors[index] = [float(x) for x in data.float().tolist()]
        pending.remaining -= 1
        if pending.remaining > 0:
            return None
        self._in_flight.pop(custom_id)
        vectors = [v for v in pending.vectors if v is not None]
        return embedding_success(
            pending.request,
            vectors,
            model=response_model(pending.request, self.model_name),
            prompt_tokens=pending.prompt_tokens,
            latency_s=now - pending.added,
        )


def _release_vllm_globals() -> None:
    """Free what a closed in-process engine leaves behind, so that a new one can start."""
    try:
        from vllm.distributed import parallel_state

        destroy: Any
        for destroy in (
            parallel_state.destroy_model_parallel,
            parallel_state.destroy_distributed_environment,
        ):
            destroy()
    except Exception:  # best effort: the process usually exits right after close()
        pass
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# -- body fields ----------------------------------------------------------------------------------


def _chat_messages(messages: object) -> list[dict[str, Any]]:
    """The messages for the chat template: text content (parts joined), tool fields kept."""
    if not isinstance(messages, list) or not messages:
        raise _BadRequest("`messages` must be a non-empty list")
    result: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise _BadRequest(f"messages[{i}] must be an object with a string `role`")
        content = message.get("content")
        if content is None:
            text = ""  # e.g. an assistant turn that only called tools
        elif isinstance(content, str):
            text = content
        elif isinstance(content, list):
            text = _join_text_parts(content, i)
        else:
            raise _BadRequest(f"messages[{i}].content must be a string or a list of parts")
        entry: dict[str, Any] = {"role": str(message["role"]), "content": text}
        for key in ("name", "tool_call_id"):
            if isinstance(message.get(key), str):
                entry[key] = message[key]
        if isinstance(message.get("tool_calls"), list):
            entry["tool_calls"] = [_template_tool_call(c) for c in message["tool_calls"]]
        result.append(entry)
    return result


def _template_tool_call(call: object) -> object:
    """An earlier assistant tool call, with its JSON `arguments` string parsed (as templates want)."""
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        return call
    function = dict(call["function"])
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        # Not JSON: the template gets the string as it is.
        with contextlib.suppress(ValueError):
            function["arguments"] = json.loads(arguments)
    return {**call, "function": function}


def template_takes(template: str, name: str) -> bool:
    """Whether a chat template reads the variable `name` (e.g. tools), so it can be honoured."""
    return re.search(rf"\b{re.escape(name)}\b", template) is not None


_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]] | None]:
    """Split `<tool_call>{"name", "arguments"}</tool_call>` blocks (the Hermes format that most
    tool-trained open models and their chat templates use) from a reply.

    Returns the remaining text and OpenAI-shaped tool calls, or the text untouched and None when
    the reply holds no well-formed call.
    """
    calls: list[dict[str, Any]] = []
    for match in _TOOL_CALL.finditer(text):
        try:
            call = json.loads(match.group(1))
        except ValueError:
            return text, None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return text, None
        arguments = call.get("arguments", call.get("parameters", {}))
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": arguments
                    if isinstance(arguments, str)
                    else json.dumps(arguments, ensure_ascii=False),
                },
            }
        )
    if not calls:
        return text, None
    return _TOOL_CALL.sub("", text).strip(), calls


def _max_model_len(probe: Any, wanted: int) -> int:
    """`wanted`, capped at the model's own limit when the model runs as a pooling model.

    Embedding models are small-context (all-MiniLM-L6-v2: 256 tokens) and vLLM refuses a larger
    `max_model_len` at start-up; batchrun's default of 2048 is meant for generative models.
    `probe` is an EngineArgs without max_model_len: its model config derives the model's limit.
    """
    try:
        config = probe.create_model_config()
    except Exception:
        return wanted  # the real start-up reports what is wrong
    if config.runner_type == "pooling":
        return min(wanted, int(config.max_model_len))
    return wanted


def _logprobs_field(request: Request) -> int | None:
    """How many top logprobs vLLM must return per token, or None when none were asked for.

    Chat asks with `logprobs: true` (+ `top_logprobs`), completions with `logprobs: <int>`.
    """
    body = request.body
    if request.url == CHAT:
        if body.get("logprobs") is not True:
            return None
        return _int_field(body, "top_logprobs", default=0)
    return _int_field(body, "logprobs")


def _structured_outputs(response_format: object) -> Any:
    """vLLM's structured output constraint for an OpenAI `response_format` (None for text)."""
    if not isinstance(response_format, Mapping):
        return None
    from vllm.sampling_params import StructuredOutputsParams

    kind = response_format.get("type")
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if schema is None:
            return StructuredOutputsParams(json_object=True)  # no schema: any JSON object
        return StructuredOutputsParams(json=dict(schema))
    return None


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, reversed: the character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class _TokenText:
    """A token's text and exact UTF-8 bytes, for logprobs (cached per token id)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._special = {int(i) for i in getattr(tokenizer, "all_special_ids", None) or []}
        self._raw: dict[int, bytes | None] = {}

    def is_special(self, token_id: int) -> bool:
        """Whether the token is a special one (end of sequence, chat markers)."""
        return token_id in self._special

    def text(self, token_id: int, logprob: Any) -> str:
        """The token as text: vLLM's decoding of it, else the tokenizer's."""
        decoded = getattr(logprob, "decoded_token", None)
        if isinstance(decoded, str):
            return decoded
        return str(self._tokenizer.decode([token_id]))

    def raw(self, token_id: int, logprob: Any) -> bytes | None:
        """The token's UTF-8 bytes; for a piece of a multi-byte character, that piece's bytes."""
        text = self.text(token_id, logprob)
        if text and "\ufffd" not in text:
            return text.encode("utf-8")
        if token_id not in self._raw:
            self._raw[token_id] = self._piece_bytes(token_id, text)
        return self._raw[token_id]

    def _piece_bytes(self, token_id: int, text: str) -> bytes | None:
        try:
            piece = self._tokenizer.convert_ids_to_tokens(token_id)
        except Exception:
            piece = None
        if isinstance(piece, str) and piece:
            match = _BYTE_TOKEN.fullmatch(piece)  # SentencePiece byte fallback: <0xE2>
            if match:
                return bytes([int(match.group(1), 16)])
            decoder = _byte_decoder()
            if all(c in decoder for c in piece):  # byte-level BPE (GPT-2, Llama 3, SmolLM)
                return bytes(decoder[c] for c in piece)
        return text.encode("utf-8") if text else None


def resolve_dtype(dtype: str, *, cuda: bool, cpuinfo: str | None = None) -> str:
    """The dtype to load: "auto" becomes float32 on a CPU without native bf16 arithmetic.

    vLLM's "auto" takes the checkpoint's bf16, which a CPU without AVX512-BF16 or AMX emulates
    (oneDNN falls back to plain torch linear layers); float32 measured faster there. Anything the
    user names is passed through untouched.
    """
    if dtype != "auto" or cuda:
        return dtype
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            return dtype
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
            break
    if not flags:
        return dtype
    return dtype if {"avx512_bf16", "amx_bf16"} & flags else "float32"


def _join_text_parts(parts: list[Any], index: int) -> str:
    """Join a message's text parts (with newlines, as vLLM's server does); refuse other parts."""
    texts: list[str] = []
    for j, part in enumerate(parts):
        if not isinstance(part, Mapping):
            raise _BadRequest(f"messages[{index}].content[{j}] must be an object")
        kind = part.get("type")
        if kind != "text":
            raise _BadRequest(
                f"messages[{index}].content[{j}]: content parts of type {kind!r} are not "
                "supported (text only)"
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise _BadRequest(f"messages[{index}].content[{j}].text must be a string")
        texts.append(text)
    return "\n".join(texts)


def _completion_prompt(prompt: object) -> str:
    """The completions prompt: a string, or a list holding exactly one string."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    if isinstance(prompt, list):
        raise _BadRequest(
            "`prompt` must be a string or a list of one string (one prompt per batch line)"
        )
    raise _BadRequest("`prompt` must be a string")


def _int_field(body: Mapping[str, Any], key: str, default: int | None = None) -> int | None:
    """An optional integer field (null means the default)."""
    value = body.get(key)
    if value is None:
        return default
    # JSON has one number type: accept 3.0 for 3, refuse 3.5 and booleans.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise _BadRequest(f"`{key}` must be an integer, got {value!r}")
    return value


def _float_field(body: Mapping[str, Any], key: str, default: float) -> float:
    """An optional number field (null means the default)."""
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise _BadRequest(f"`{key}` must be a number, got {value!r}")
    return float(value)


def _stop_field(value: object) -> list[str] | None:
    """`stop`: null, a string, or a list of strings."""
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return list(value)
    raise _BadRequest("`stop` must be a string or a list of strings")
