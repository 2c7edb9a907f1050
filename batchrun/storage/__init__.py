"""Object storage at the edge: an input URL (s3://, gs://, https://, ...) brought into the job
directory once (`fetch.py`), and export's files sent to a URL prefix (`upload.py`), both through
fsspec (`filesystems.py`). Nothing else in batchrun knows of buckets: a job holds its own copy of
its input, so resume, retry-failed, status and export never need the store again."""
