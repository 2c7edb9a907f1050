"""The vLLM engine, one concern a module.

`engine` (the Engine over vLLM's `LLMEngine`: requests in, outcomes out), `prompts` (a request's
prompt tokens: chat messages through the chat template, or the completions prompt), `params` (a
body's OpenAI sampling fields as vLLM `SamplingParams`), `embeddings` (an embeddings request's
inputs and `dimensions`), `scoring` (score and rerank requests: a bi-encoder's texts or a
cross-encoder's pairs, and their scores), `tools` (tool calls in and out of the chat template), `tokens` (a token's
text and exact bytes, for logprobs), `dtype` (the dtype to load), `errors` (the per-request 400).

No module here imports vLLM or torch at import time (the process that owns the journal must never
load them); this package re-exports nothing, so importing it loads none of its modules.
"""
