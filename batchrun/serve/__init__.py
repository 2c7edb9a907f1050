"""`batchrun serve`: the OpenAI Files and Batches API in front of batchrun's crash-safe jobs.

`ids`: the ids the server hands out (and the only ones it accepts); `files`: the file store;
`batches`: the batch records; `jobview`: the one place a job's manifest is read or stamped;
`router`: one engine pool shared by every batch, each result into its own batch's journal;
`runner`: the queue of batches (validate, run, cancel, expire, finalize); `uploads`: streaming
multipart uploads with a size cap; `app`: the FastAPI routes; `metrics`: Prometheus text;
`server`: what the CLI calls.
"""
