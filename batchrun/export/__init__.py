"""Writing the results: output.jsonl + errors.jsonl (OpenAI batch output format), results.parquet."""
