"""/v1/audio/transcriptions and /v1/audio/translations lines, as vLLM's speech-to-text server runs
them (vllm/entrypoints/speech_to_text/base/serving.py), in the worker.

The audio of `body.file_url` is read when the line is dispatched (a data URL decoded, an http(s)
URL fetched with the fetch timeout, a file:// path under --allowed-local-media-path), decoded and
resampled by vLLM's `load_audio` (soundfile), cut into the model's clip length where it is longer
(vLLM's `split_audio`), and each clip made into the model's own prompt
(`get_generation_prompt`). Each clip is a vLLM request of its own; the answer joins their texts
as vLLM does, in OpenAI's transcription shape: `{"text", "usage": {"type": "duration",
"seconds"}}` (a translation: `{"text"}`). With `response_format: "verbose_json"` the model writes
timestamps and the answer is vLLM's verbose object, `{"duration", "language", "text",
"segments", "words"}`, its segments cut by vLLM's own code from the tokens and their logprobs.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from batchrun.config import EngineSettings
from batchrun.engines.vllm.errors import BadRequest
from batchrun.openai.media import DEFAULT_FETCH_TIMEOUTS
from batchrun.openai.records import TRANSLATIONS, Outcome, Request
from batchrun.openai.response_bodies import answered

# The body fields vLLM's speech-to-text request takes (file_url read here; model reported).
_FIELDS = (
    "language",
    "to_language",
    "prompt",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "max_completion_tokens",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "response_format",
)


@dataclass
class AudioWork:
    """A speech-to-text request's clips as vLLM inputs, and how their outputs become the answer."""

    inputs: list[tuple[Any, Any]]  # (engine input, sampling params), one per clip
    duration_s: float
    separator: str
    translate: bool
    post_process: Any  # the model class's post_process_output
    what: str = "transcription"
    texts: list[str] = field(default_factory=list)
    verbose: Verbose | None = None  # response_format verbose_json: what its segments need

    def outcome(
        self, request: Request, parts: list[Any], *, model: str, latency_s: float
    ) -> Outcome:
        """The answer from each clip's RequestOutput, in order."""
        tokens = sum(len(p.outputs[0].token_ids) for p in parts)
        prompt_tokens = sum(len(p.prompt_token_ids or ()) for p in parts)
        body: dict[str, Any]
        if self.verbose is not None:
            body = self.verbose.body(parts, self.separator, self.duration_s, self.translate)
        else:
            texts = [self.post_process(p.outputs[0].text) for p in parts]
            body = {"text": self.separator.join(texts)}
            if not self.translate:
                # Rounded up, as OpenAI (and vLLM) count audio.
                body["usage"] = {"type": "duration", "seconds": math.ceil(self.duration_s)}
        return answered(
            request,
            body,
            prompt_tokens=prompt_tokens,
            completion_tokens=tokens,
            latency_s=latency_s,
        )


@dataclass
class Verbose:
    """What a verbose_json answer needs beyond the clips' outputs: vLLM's request (language,
    temperature), each clip's start in the audio, and the tokenizer that reads timestamps."""

    stt: Any
    starts: list[float]
    tokenizer: Any

    def body(
        self, parts: list[Any], separator: str, duration_s: float, translate: bool
    ) -> dict[str, Any]:
        """vLLM's TranscriptionResponseVerbose (TranslationResponseVerbose) of the clips."""
        from types import SimpleNamespace

        from vllm.entrypoints.speech_to_text.base.serving import SpeechToTextBaseServing
        from vllm.entrypoints.speech_to_text.transcription.protocol import (
            TranscriptionResponseVerbose,
            TranscriptionSegment,
        )
        from vllm.entrypoints.speech_to_text.translation.protocol import (
            TranslationResponseVerbose,
            TranslationSegment,
        )

        # vLLM's own segmenting, which reads only the tokenizer of its server.
        server: Any = SimpleNamespace(tokenizer=self.tokenizer)
        segments: list[Any] = []
        for start, part in zip(self.starts, parts, strict=True):
            out = part.outputs[0]
            segments.extend(
                SpeechToTextBaseServing._get_verbose_segments(
                    server,
                    tokens=tuple(out.token_ids),
                    segment_class=TranslationSegment if translate else TranscriptionSegment,
                    request=self.stt,
                    start_time=start,
                    log_probs=out.logprobs,
                )
            )
        kind: Any = TranslationResponseVerbose if translate else TranscriptionResponseVerbose
        answer = kind(
            text=separator.join(segment.text for segment in segments),
            language=self.stt.language,
            duration=duration_s,
            segments=segments,
        )
        return dict(answer.model_dump(mode="json"))


@dataclass
class LanguageDetection:
    """A speech-to-text request with no `language`, for a model that must be told one (Whisper):
    first one vLLM request of one token, the model's guess among its language tokens (vLLM's
    server's `_detect_language`, on the first clip), then the request itself (`finish`)."""

    inputs: list[tuple[Any, Any]]  # the one detection request (engine input, sampling params)
    finish: Callable[[Any], AudioWork]  # the detection's RequestOutput -> the request's work
    what: str = "language detection"


def audio_work(
    engine: Any, request: Request, settings: EngineSettings
) -> AudioWork | LanguageDetection:
    """Read, decode and cut the request's audio; its clips as vLLM's prompts and params (first
    the detection of its language, where the model needs one and the line gives none)."""
    import vllm.envs as envs
    from vllm.entrypoints.speech_to_text.transcription.protocol import TranscriptionRequest
    from vllm.entrypoints.speech_to_text.translation.protocol import TranslationRequest
    from vllm.model_executor.model_loader.utils import get_model_cls
    from vllm.multimodal.audio import get_audio_duration, split_audio
    from vllm.multimodal.media.audio import load_audio

    model_config = engine.model_config
    model_cls: Any = get_model_cls(model_config)
    if not getattr(model_cls, "supports_transcription", False):
        raise BadRequest(
            f"{request.url} needs a speech-to-text model (such as Whisper); the model loaded "
            "is not one",
            code="invalid_request",
        )
    translate = request.url == TRANSLATIONS
    task = "translate" if translate else "transcribe"
    body = request.body
    fields = {k: body[k] for k in _FIELDS if body.get(k) is not None}
    kind = TranslationRequest if translate else TranscriptionRequest
    stt: Any = kind.model_construct(**fields)  # the file is read here, not by pydantic
    try:
        stt.language = model_cls.validate_language(stt.language)
    except ValueError as e:
        raise BadRequest(str(e)) from e
    detect = stt.language is None and getattr(
        model_cls, "supports_explicit_language_detection", False
    )
    verbose = stt.response_format == "verbose_json"
    if verbose and not getattr(model_cls, "supports_segment_timestamp", False):
        # vLLM's server refuses it the same way.
        raise BadRequest(
            "body.response_format 'verbose_json' needs a model that writes segment timestamps "
            "(such as Whisper); the model loaded does not"
        )
    asr = model_cls.get_speech_to_text_config(model_config, task)
    data = read_audio(str(body["file_url"]), settings)
    try:
        with io.BytesIO(data) as buf:
            y, sr = load_audio(
                buf,
                sr=asr.sample_rate,
                mono=True,
                max_duration_s=envs.VLLM_MAX_AUDIO_DECODE_DURATION_S,
                max_decode_bytes=envs.VLLM_MAX_AUDIO_DECODE_BYTES,
            )
    except ValueError as e:  # vLLM's own limits (too long, too big): its message
        raise BadRequest(f"cannot decode the audio: {e}", "invalid_media") from e
    except Exception as e:  # as vLLM's server says it, whichever decoder failed last
        raise BadRequest(
            "cannot decode the audio: Invalid or unsupported audio file.", "invalid_media"
        ) from e
    duration = get_audio_duration(y=y, sr=sr)
    clips = [y]
    if asr.allow_audio_chunking and asr.max_audio_clip_s and duration > asr.max_audio_clip_s:
        clips = split_audio(
            audio_data=y,
            sample_rate=int(sr),
            max_clip_duration_s=asr.max_audio_clip_s,
            overlap_duration_s=asr.overlap_chunk_second,
            min_energy_window_size=asr.min_energy_split_window_size,
        )
    # Where each clip starts in the audio, in seconds (a verbose answer's segment times).
    starts = [0.0]
    for clip in clips[:-1]:
        starts.append(starts[-1] + clip.shape[-1] / asr.sample_rate)
    tokenizer = engine.get_tokenizer()
    if detect:
        # As vLLM's server: the first clip, a decoder prompt of <|startoftranscript|> alone, one
        # greedy token among the language tokens.
        from vllm import SamplingParams
        from vllm.renderers.inputs.preprocess import parse_model_prompt as parse

        try:
            prompt = model_cls.get_language_detection_prompt(clips[0], asr)
            detection = engine.renderer.render_cmpl([parse(model_config, prompt)])[0]
            allowed = model_cls.get_language_token_ids(tokenizer)
        except Exception as e:
            raise BadRequest(f"the model cannot detect the language: {e}") from e
        params = SamplingParams(max_tokens=1, temperature=0.0, allowed_token_ids=allowed)

        def finish(output: Any) -> AudioWork:
            try:
                stt.language = model_cls.parse_language_detection_output(
                    list(output.outputs[0].token_ids), tokenizer
                )
            except Exception as e:  # vLLM's own asserts: not a language token
                raise BadRequest(f"the model's language detection failed: {e!r}") from e
            return _clips_work(engine, model_cls, stt, asr, clips, starts, duration, translate)

        return LanguageDetection(inputs=[(detection, params)], finish=finish)
    return _clips_work(engine, model_cls, stt, asr, clips, starts, duration, translate)


def _clips_work(
    engine: Any,
    model_cls: Any,
    stt: Any,
    asr: Any,
    clips: list[Any],
    starts: list[float],
    duration: float,
    translate: bool,
) -> AudioWork:
    """The request's clips as vLLM's prompts and params, its language known."""
    from vllm.entrypoints.serve.utils.api_utils import get_max_tokens
    from vllm.entrypoints.speech_to_text.base.serving import (
        SpeechToTextBaseServing,
        asr_inter_chunk_separator,
    )
    from vllm.renderers.inputs.preprocess import parse_enc_dec_prompt, parse_model_prompt

    model_config = engine.model_config
    task = "translate" if translate else "transcribe"
    verbose = stt.response_format == "verbose_json"
    try:
        prompts = []
        for clip in clips:
            prompt = model_cls.get_generation_prompt(
                stt.build_stt_params(
                    audio=clip, stt_config=asr, model_config=model_config, task_type=task
                )
            )
            if verbose:  # as vLLM's server: the decoder starts at timestamp <|0.00|>
                # (vLLM's method reads nothing of its server.)
                unbound: Any = SpeechToTextBaseServing._preprocess_verbose_prompt
                prompts.append(unbound(None, parse_enc_dec_prompt(prompt)))
            else:
                prompts.append(parse_model_prompt(model_config, prompt))
        engine_inputs = engine.renderer.render_cmpl(prompts)
    except Exception as e:  # the model's own refusal (Whisper: a language it needs, ...)
        raise BadRequest(f"the model cannot take this request: {e}") from e
    defaults = model_config.get_diff_sampling_param()
    max_tokens = get_max_tokens(model_config.max_model_len, stt.max_completion_tokens, 0, defaults)
    inputs = []
    for inp in engine_inputs:
        params = stt.to_sampling_params(max_tokens, defaults)
        if verbose:
            params.logprobs = 1  # the segments' avg_logprob, as vLLM's server asks for
        inputs.append((inp, params))
    return AudioWork(
        inputs=inputs,
        duration_s=float(duration),
        separator=asr_inter_chunk_separator(stt.language, model_cls.no_space_languages),
        translate=translate,
        post_process=model_cls.post_process_output,
        what="translation" if translate else "transcription",
        verbose=Verbose(stt, starts, engine.get_tokenizer()) if verbose else None,
    )


def read_audio(url: str, settings: EngineSettings) -> bytes:
    """The bytes `file_url` names: a data URL's, an http(s) URL's (fetched with the fetch
    timeout, at most --max-media-bytes), or a file's under --allowed-local-media-path."""
    limit = settings.max_media_bytes
    if url.startswith("data:"):
        try:
            return base64.b64decode(url.partition(",")[2], validate=True)
        except (binascii.Error, ValueError) as e:
            raise BadRequest(f"body.file_url is not valid base64: {e}", "invalid_media") from e
    parsed = urlparse(url)
    if parsed.scheme == "file":
        root = settings.allowed_local_media_path
        path = Path(os.path.realpath(unquote(parsed.path)))
        if root is None or not path.is_relative_to(os.path.realpath(root)):
            raise BadRequest(
                f"body.file_url: {path} is not under --allowed-local-media-path", "invalid_media"
            )
        try:
            return path.read_bytes()
        except OSError as e:
            raise BadRequest(
                f"body.file_url: cannot read {path}: {e.strerror}", "invalid_media"
            ) from e
    timeout = settings.media_fetch_timeout or DEFAULT_FETCH_TIMEOUTS["audio"]
    try:
        with urllib.request.urlopen(
            url, timeout=timeout
        ) as response:  # http(s) only: checked at validation
            data = bytes(response.read(limit + 1))
    except urllib.error.HTTPError as e:
        raise BadRequest(
            f"body.file_url: {url} answered {e.code} {e.reason}", "invalid_media"
        ) from e
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise BadRequest(f"body.file_url: cannot fetch {url}: {reason}", "invalid_media") from e
    if len(data) > limit:
        raise BadRequest(
            f"body.file_url: {url} is over --max-media-bytes {limit:,}", "invalid_media"
        )
    return data
