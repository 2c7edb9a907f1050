"""Export's files sent to a URL prefix (`export --to s3://BUCKET/PREFIX/`).

Each file is one object under the prefix, named as the file is; a rerun overwrites. On S3 an
object appears whole or not at all: a file smaller than two parts goes up in one PUT, a larger
one as a multipart upload that s3fs completes only once every part is in, and aborts when a
part fails. A process killed mid-upload leaves at most an unfinished multipart upload, which no
listing shows as an object (a bucket lifecycle rule, AbortIncompleteMultipartUpload, reclaims
its parts).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

from batchrun.errors import BatchrunError
from batchrun.storage.filesystems import (
    PROCESS_SCHEMES,
    READ_ONLY_SCHEMES,
    S3_SCHEMES,
    cause,
    open_filesystem,
    url_scheme,
)

# Multipart uploads in parts of this size (the AWS CLI's default), larger for a file that would
# need more than S3's 10,000 parts.
PART_SIZE = 8 << 20
MAX_PARTS = 10_000


def check_destination(url: str) -> str:
    """Check, before anything is written, that export's files can go to `url`; returns the
    prefix to put them under (ending in "/").

    Raises BatchrunError for a URL that names no writable place that outlives this process
    (exit 2: a local path, a read-only scheme, an in-memory one, an S3 URL with no bucket, a URL
    its filesystem cannot be opened on), and for a bucket that does not exist or cannot be
    reached (exit 1).
    """
    scheme = url_scheme(url)
    if scheme is None or scheme == "file":
        raise BatchrunError(
            f"--to takes a URL (s3://BUCKET/PREFIX/); for a local directory use --output-dir: {url}",
            exit_code=2,
        )
    if scheme in READ_ONLY_SCHEMES:
        raise BatchrunError(f"cannot write to {url}: {scheme}:// URLs are read-only", exit_code=2)
    if scheme in PROCESS_SCHEMES:
        # "uploaded" would be a promise broken when the process exits.
        raise BatchrunError(
            f"cannot write to {url}: a {scheme}:// filesystem lives in this process and keeps "
            "nothing after it exits",
            exit_code=2,
        )
    bucket = url.split("://", 1)[1].split("/", 1)[0]
    if scheme in S3_SCHEMES and not bucket:
        raise BatchrunError(
            f"--to {url} names no bucket; give one: {scheme}://BUCKET/PREFIX/", exit_code=2
        )
    fs, _ = open_filesystem(url, bad_url_exit=2)
    if scheme in S3_SCHEMES:
        try:
            fs.call_s3("head_bucket", Bucket=bucket)
        except FileNotFoundError:
            raise BatchrunError(
                f"cannot write to {url}: the bucket {bucket} does not exist"
            ) from None
        except PermissionError:
            pass  # credentials that may write objects but not look at the bucket: the upload tells
        except Exception as e:  # no credentials, an endpoint that does not answer
            raise BatchrunError(f"cannot write to {url}: {cause(e)}") from None
    return url if url.endswith("/") else url + "/"


def upload_files(files: Iterable[Path], prefix: str) -> list[str]:
    """Upload each file to `prefix` + its name, overwriting; returns the URLs written.

    Raises BatchrunError naming the file, the URL and the cause at the first that fails.
    """
    fs, _ = open_filesystem(prefix)
    s3 = url_scheme(prefix) in S3_SCHEMES
    written = []
    for file in files:
        url = prefix + file.name
        options = {"chunksize": part_size(file.stat().st_size)} if s3 else {}
        try:
            fs.put_file(str(file), fs._strip_protocol(url), **options)
        except Exception as e:  # each backend raises its own kinds
            raise BatchrunError(
                f"cannot upload {file} to {url}: {cause(e)}; the file is still at {file}, "
                "export again with --to to retry"
            ) from None
        written.append(url)
    return written


def part_size(size: int) -> int:
    """The multipart part size for a file of `size` bytes: PART_SIZE, or more for a huge file."""
    return max(PART_SIZE, math.ceil(size / MAX_PARTS))
