"""OpenAI batch lines: typed records, the streaming reader, per-line validation, response bodies."""
