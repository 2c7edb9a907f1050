"""Logprobs: each generated token's text and exact UTF-8 bytes, as OpenAI reports them."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from batchrun.openai.response_bodies import TokenLogprob


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, reversed: the character that stands for each byte."""
    # transformers' own table, the one its byte-level tokenizers are built with; imported here so
    # that importing this module stays cheap.
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    table: dict[int, str] = bytes_to_unicode()  # type: ignore[no-untyped-call]  # untyped there
    return {char: byte for byte, char in table.items()}


_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenText:
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

    def logprobs(self, completion: Any, top: int) -> list[TokenLogprob]:
        """One completion's logprobs: per generated token, itself and the `top` likeliest."""
        result: list[TokenLogprob] = []
        token_ids = list(completion.token_ids)
        steps = completion.logprobs or []
        # The end-of-sequence token that stopped generation is not part of the answer's text;
        # OpenAI's logprobs cover the answer's tokens only.
        if token_ids and completion.finish_reason == "stop" and self.is_special(token_ids[-1]):
            token_ids = token_ids[:-1]
        for token_id, step in zip(token_ids, steps, strict=False):
            chosen = step.get(token_id) if step else None
            logprob = float(chosen.logprob) if chosen is not None else float("-inf")
            ranked = sorted(step.items(), key=lambda kv: -kv[1].logprob) if step else []
            result.append(
                TokenLogprob(
                    token=self.text(token_id, chosen),
                    token_bytes=self.raw(token_id, chosen),
                    logprob=logprob,
                    top=tuple(
                        (self.text(tid, lp), self.raw(tid, lp), float(lp.logprob))
                        for tid, lp in ranked[:top]
                    ),
                )
            )
        return result

    def _piece_bytes(self, token_id: int, text: str) -> bytes | None:
        try:
            piece = self._tokenizer.convert_ids_to_tokens(token_id)
        except Exception:
            piece = None
        if isinstance(piece, str) and piece:
            match = _BYTE_TOKEN.fullmatch(piece)  # SentencePiece byte fallback: <0xE2>
            if match:
                return bytes([int(match.group(1), 16)])
            decoder = byte_decoder()
            if all(c in decoder for c in piece):  # byte-level BPE (GPT-2, Llama 3, SmolLM)
                return bytes(decoder[c] for c in piece)
        return text.encode("utf-8") if text else None
