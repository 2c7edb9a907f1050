"""The vLLM engine: OpenAI request bodies in, ChatCompletion / Completion outcomes out.

It drives vLLM's low-level step API (`LLMEngine.add_request` / `step`), so that the worker can keep
a window of requests in flight and top it up as each finishes, instead of handing vLLM fixed
batches and idling on the slowest member of each.

Prompts are tokenized here, not inside vLLM, so that a request that cannot fit in the context
becomes a per-request 400 outcome (as the OpenAI API answers it) before it reaches the engine.

Defaults follow the OpenAI API: temperature 1.0, top_p 1.0, n 1; `max_tokens` defaults to 16 for
`/v1/completions` (the legacy Completions API's documented default) and to the rest of the context
window (`max_model_len` minus the prompt) for `/v1/chat/completions`, as OpenAI and vLLM's own
server do. `max_model_len` (2048 by default in batchrun) is what bounds a runaway chat answer.

vLLM, torch and transformers are imported in the constructor only: importing this module is cheap.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Mapping
from typing import Any

from batchrun.config import EngineSettings
from batchrun.models import DEFAULT_MODEL_NAME, resolve_model
from batchrun.records import CHAT, COMPLETIONS, Outcome, Request
from batchrun.responses import Choice, failure, response_model, success

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
        if settings.max_model_len is not None:
            extra["max_model_len"] = settings.max_model_len

        # EngineArgs types dtype as a Literal; the value is validated by vLLM itself.
        dtype: Any = resolve_dtype(settings.dtype, cuda=torch.cuda.is_available())
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
        self.max_model_len: int = int(self._engine.model_config.max_model_len)
        # custom_id -> (request, monotonic time it was added): what step() needs to answer.
        self._in_flight: dict[str, tuple[Request, float]] = {}

    def add(self, request: Request) -> Outcome | None:
        """Queue a request; return a 400 Outcome at once if it cannot run as written."""
        if request.custom_id in self._in_flight:
            # vLLM keys its outputs by this id; a second copy in flight would be answered twice.
            raise ValueError(f"request {request.custom_id!r} is already in flight")
        added = time.monotonic()
        try:
            prompt_ids = self._prompt_token_ids(request)
            params = self._sampling_params(request, len(prompt_ids))
            self._submit(request.custom_id, prompt_ids, params)
        except _BadRequest as exc:
            return failure(request, exc.code, exc.message, status_code=400, retryable=False)
        self._in_flight[request.custom_id] = (request, added)
        return None

    def step(self) -> list[Outcome]:
        """Run one engine iteration; return the outcomes of the requests that finished in it."""
        outputs = self._engine.step()
        now = time.monotonic()
        outcomes: list[Outcome] = []
        for output in outputs:
            if not getattr(output, "finished", False):
                continue  # FINAL_ONLY sends finished requests only; be safe all the same
            entry = self._in_flight.pop(output.request_id, None)
            if entry is None:
                continue
            request, added = entry
            outcomes.append(self._outcome(request, output, now - added))
        if self._in_flight and not self._engine.has_unfinished_requests():
            # vLLM holds none of them any more yet never answered them: fail them (retryable)
            # rather than let the caller step an idle engine forever.
            for request, added in self._in_flight.values():
                outcomes.append(
                    failure(
                        request,
                        "engine_error",
                        "vLLM dropped the request without an answer",
                        status_code=500,
                        retryable=True,
                        latency_s=now - added,
                    )
                )
            self._in_flight.clear()
        return outcomes

    def has_unfinished(self) -> bool:
        """Whether any added request has not finished yet."""
        return bool(self._in_flight)

    def close(self) -> None:
        """Shut the engine down and free its memory (idempotent)."""
        engine, self._engine = self._engine, None
        self._tokenizer = None
        self._in_flight.clear()
        if engine is None:
            return
        try:
            engine.engine_core.shutdown()
        finally:
            del engine
            _release_vllm_globals()

    # -- requests -> vLLM inputs ------------------------------------------------------------------

    def _prompt_token_ids(self, request: Request) -> list[int]:
        """Tokenize the request's prompt (chat messages through the model's chat template)."""
        body = request.body
        if request.url == CHAT:
            messages = _chat_messages(body.get("messages"))
            try:
                text = self._tokenizer.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=True
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
                # Only the final output of each request is wanted: no per-token RequestOutputs.
                output_kind=RequestOutputKind.FINAL_ONLY,
            )
        except (ValueError, TypeError, VLLMClientError) as exc:
            raise _BadRequest(str(exc)) from exc

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
        choices = [
            Choice(
                text=c.text,
                # OpenAI knows "stop" and "length"; vLLM's "repetition" (an early stop on a
                # detected loop, only when asked for) is a stop.
                finish_reason=_OPENAI_FINISH_REASONS.get(reason, "stop"),
                token_count=len(c.token_ids),
            )
            for c, reason in zip(completions, reasons, strict=True)
        ]
        prompt_ids = output.prompt_token_ids
        return success(
            request,
            choices,
            model=response_model(request, self.model_name),
            prompt_tokens=len(prompt_ids) if prompt_ids is not None else 0,
            latency_s=latency_s,
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


def _chat_messages(messages: object) -> list[dict[str, str]]:
    """The messages as role/content strings, with text content parts joined."""
    if not isinstance(messages, list) or not messages:
        raise _BadRequest("`messages` must be a non-empty list")
    result: list[dict[str, str]] = []
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
        result.append({"role": str(message["role"]), "content": text})
    return result


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
