"""Score and rerank requests on vLLM's pooling runner, scored the way vLLM's own server does.

vLLM chooses how a model scores from its pooling task (`vllm.tasks.SCORE_TYPE_MAP`):

- an embedding model (task "embed", a bi-encoder): each text of both sides is embedded on its own,
  one vLLM request each (the one query of a 1:N request once), and a pair scores the cosine
  similarity of its two embeddings, computed as vLLM's `BiEncoderIOProcessor` computes it. The
  texts are tokenized here, as embeddings inputs are, so that a text too long for the model is a
  400 naming its field before anything reaches the engine.
- a cross-encoder (task "classify", one label): each pair is one vLLM request whose prompt vLLM's
  own `CrossEncoderIOProcessor` renders (the tokenizer's text pair with its token type ids, or the
  model's score template), and the pair scores the classifier's output.

Late-interaction models (ColBERT-style token embeddings) and classifiers of several labels are
refused with a 400, as vLLM's server has no scoring for the latter either.

vLLM is imported at use only, as in the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from batchrun.engines.vllm.errors import BadRequest
from batchrun.openai.params import ScoreParams, score_params
from batchrun.openai.records import Outcome, Request
from batchrun.openai.scoring_body import scoring_success

# vLLM's TokenizeParams names these parameters in its length errors.
_LENGTH_PARAMETERS = ("input_tokens", "input_text")


@dataclass
class ScoreWork:
    """A score or rerank request inside vLLM: its (prompt, PoolingParams) inputs, and how their
    outputs become its scores."""

    fields: ScoreParams
    cross: bool  # one vLLM request a pair (cross-encoder), else one a text (bi-encoder)
    inputs: list[tuple[Any, Any]]
    prompt_tokens: int
    what: str = "scoring"  # what vLLM failed, for the message of a failed part

    def outcome(
        self, request: Request, outputs: list[Any], *, model: str, latency_s: float
    ) -> Outcome:
        """The request's answer, from its inputs' pooled data in order."""
        return scoring_success(
            request,
            self.fields,
            self.scores(outputs),
            model=model,
            prompt_tokens=self.prompt_tokens,
            latency_s=latency_s,
        )

    def scores(self, outputs: list[Any]) -> list[float]:
        """Each pair's score, from its vLLM requests' pooled data in the order they were added."""
        if self.cross:
            # vLLM's ScoringOutput.from_base: the classifier's one output, as a float.
            return [float(data.squeeze().item()) for data in outputs]
        import torch.nn.functional as F

        n = len(self.fields.queries)
        queries, documents = outputs[:n], outputs[n:]
        return [
            float(F.cosine_similarity(queries[q].float(), documents[d].float(), dim=0).item())
            for q, d in self.fields.pairs()
        ]


class Scorer:
    """Turns score and rerank requests into vLLM inputs for the loaded pooling model."""

    def __init__(self, engine: Any, tokenizer: Any, *, max_model_len: int, model_name: str) -> None:
        self._engine = engine
        self._tokenizer = tokenizer
        self._max_model_len = max_model_len
        self._model_name = model_name
        self._task: str | None = None
        self._kind: str | None = None  # vLLM's score type; "" once known to be none
        self._processor: Any = None

    def close(self) -> None:
        """Let go of the engine (the engine's close frees its memory)."""
        self._engine = self._tokenizer = self._processor = None

    def kind(self) -> str:
        """How vLLM scores with this model: "bi-encoder", "cross-encoder", "late-interaction", or
        "" when it does not (asked of vLLM once, at the first score request)."""
        if self._kind is None:
            from vllm.entrypoints.pooling.utils import enable_scoring_api
            from vllm.tasks import SCORE_TYPE_MAP

            model_config = self._engine.model_config
            supported = self._engine.get_supported_tasks()
            self._task = model_config.get_pooling_task(supported)
            # vLLM's own rule for which models its server scores (a classifier: one label only).
            enabled = self._task is not None and enable_scoring_api(supported, model_config)
            score_type: Any = SCORE_TYPE_MAP.get(self._task) if enabled else None  # type: ignore[arg-type]
            self._kind = str(score_type or "")
        return self._kind

    def plan(self, request: Request) -> ScoreWork:
        """The request's vLLM inputs and how their outputs become its scores; raises BadRequest
        for a request the model cannot score as written."""
        kind = self.kind()
        fields = score_params(request)
        self._check_limits(fields)
        if kind == "bi-encoder":
            return self._bi_encoder(fields)
        if kind == "cross-encoder":
            return self._cross_encoder(fields)
        if kind == "late-interaction":
            raise BadRequest(
                f"{self._model_name} is a late-interaction model (token embeddings, scored by "
                "MaxSim), which batchrun does not score; use an embedding model or a cross-encoder"
            )
        raise BadRequest(
            f"{self._model_name} cannot score: vLLM runs it for the pooling task "
            f"{self._task!r}, and scoring needs an embedding model (its pairs score the cosine "
            "similarity of their embeddings) or a cross-encoder (a classifier of one label)"
        )

    def _check_limits(self, fields: ScoreParams) -> None:
        """The token limits vLLM checks against the model's context length."""
        limit = self._max_model_len
        for name in ("max_tokens_per_query", "max_tokens_per_doc"):
            value = getattr(fields, name)
            if value >= limit:
                raise BadRequest(f"body.{name} ({value}) must be less than max_model_len ({limit})")
        keep = fields.truncate_prompt_tokens
        if keep is not None and keep > limit:
            raise BadRequest(
                f"body.truncate_prompt_tokens {keep} is more than this model's maximum context "
                f"length, {limit} tokens"
            )

    # -- bi-encoder: embed every text, cosine of each pair ------------------------------------

    def _bi_encoder(self, fields: ScoreParams) -> ScoreWork:
        from vllm.pooling_params import PoolingParams

        sides = (
            (0, fields.queries, fields.max_tokens_per_query),
            (1, fields.documents, fields.max_tokens_per_doc),
        )
        prompts = [
            self._encode(fields, self._cut(text, cut), _where(fields, side, i))
            for side, texts, cut in sides
            for i, text in enumerate(texts)
        ]
        params = PoolingParams(task="embed", use_activation=fields.use_activation)
        inputs: list[tuple[Any, Any]] = [(ids, params) for ids in prompts]
        return ScoreWork(fields, False, inputs, prompt_tokens=sum(len(p) for p in prompts))

    def _cut(self, text: str, tokens: int) -> str:
        """A query or document cut to `tokens` tokens first, by vLLM's own helper (0: uncut)."""
        if tokens <= 0:
            return text
        from vllm.entrypoints.pooling.scoring.utils import truncate_text_to_tokens

        return str(truncate_text_to_tokens(text, self._tokenizer, tokens))

    def _encode(self, fields: ScoreParams, text: str, where: str) -> list[int]:
        """A text's token ids, truncated as vLLM's renderer truncates a pooling prompt."""
        keep = fields.truncate_prompt_tokens
        if keep == -1:
            keep = self._max_model_len
        tokenizer = self._tokenizer
        if keep is None:
            ids = tokenizer.encode(text)
        elif fields.truncation_side is None:
            # The tokenizer truncates, its special tokens kept (TokenizeParams.get_encode_kwargs).
            ids = tokenizer.encode(text, truncation=True, max_length=keep)
        else:
            # An explicit side: vLLM slices the whole prompt's tokens (_token_truncation).
            ids = tokenizer.encode(text)
            ids = ids[-keep:] if fields.truncation_side == "left" else ids[:keep]
        ids = [int(t) for t in ids]
        if not ids:
            raise BadRequest(f"{where} has no tokens")
        if len(ids) > self._max_model_len:
            raise BadRequest(
                f"this model's maximum context length is {self._max_model_len} tokens; "
                f"{where} has {len(ids)} tokens",
                code="context_length_exceeded",
            )
        return ids

    # -- cross-encoder: one prompt a pair, rendered by vLLM ------------------------------------

    def _cross_encoder(self, fields: ScoreParams) -> ScoreWork:
        from vllm.entrypoints.pooling.typing import ScoringRenderParams
        from vllm.exceptions import VLLMValidationError
        from vllm.pooling_params import PoolingParams
        from vllm.renderers import TokenizeParams

        processor = self._cross_processor()
        encoder_config = self._engine.model_config.encoder_config or {}
        # As a ScoreRequest's build_tok_params: the context length, no output, the truncation.
        tok_params = TokenizeParams(
            max_total_tokens=self._max_model_len,
            max_output_tokens=0,
            truncate_prompt_tokens=fields.truncate_prompt_tokens,
            truncation_side=fields.truncation_side,
            do_lower_case=encoder_config.get("do_lower_case", False),
            add_special_tokens=True,
            max_total_tokens_param="max_model_len",
        )
        params = PoolingParams(task="classify", use_activation=fields.use_activation)
        inputs: list[tuple[Any, Any]] = []
        for q, d in fields.pairs():
            render = ScoringRenderParams(
                data_1=fields.queries[q],
                data_2=fields.documents[d],
                chat_template=None,  # batchrun loads no score template (nor does vLLM unasked)
                max_tokens_per_query=fields.max_tokens_per_query,
                max_tokens_per_doc=fields.max_tokens_per_doc,
                tok_params=tok_params,
                prompt_extras=None,
                skip_mm_cache=False,
                params=params,
                lora_requests=None,
                priorities=0,
            )
            try:
                rendered = processor.render(render)
            except (VLLMValidationError, ValueError, TypeError) as exc:
                # vLLM's validation error names the parameter: a length one is the context's.
                length = getattr(exc, "parameter", None) in _LENGTH_PARAMETERS
                pair = f"{_where(fields, 0, q)} with {_where(fields, 1, d)}"
                code = "context_length_exceeded" if length else "invalid_request"
                raise BadRequest(f"{pair}: {exc}", code=code) from exc
            inputs.append((rendered["prompts"], rendered["params"]))
        tokens = sum(len(prompt["prompt_token_ids"]) for prompt, _ in inputs)
        return ScoreWork(fields, True, inputs, prompt_tokens=tokens)

    def _cross_processor(self) -> Any:
        """vLLM's cross-encoder IO processor over this engine's config and renderer (made once)."""
        if self._processor is None:
            from vllm.entrypoints.pooling.scoring.io_processor import CrossEncoderIOProcessor
            from vllm.renderers.chat_utils import ChatTemplateConfig

            self._processor = CrossEncoderIOProcessor(  # type: ignore[no-untyped-call]
                vllm_config=self._engine.vllm_config,
                renderer=self._engine.renderer,
                chat_template_config=ChatTemplateConfig(),
            )
        return self._processor


def _where(fields: ScoreParams, side: int, index: int) -> str:
    """The body field of a text, for messages: `body.text_2[3]`, or `body.query` when one string."""
    name = f"body.{fields.names[side]}"
    return name if fields.single[side] else f"{name}[{index}]"
