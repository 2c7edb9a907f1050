"""Writing the results: output.jsonl + errors.jsonl (OpenAI batch output format), results.parquet.

`job` exports a job (`export_job`); `index` finds each request's last journal record; `jsonl`
and `parquet` write the files from it.
"""
