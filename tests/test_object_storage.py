"""Inputs from and results to object storage, on a real S3-compatible server (SeaweedFS's
`weed mini` on 127.0.0.1, tests/support/s3_store.py): a job submitted from a bucket needs the bucket no
more once it exists (it resumes with the server stopped), `export --to` puts the files in the
bucket and an interrupted upload never leaves an object that looks complete; every bad input is
one line naming the URL and the cause, exit 1, and no job directory."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli import cli, cli_process, start_cli
from support.jobs import journal_records, rerun, start_echo, submit_echo
from support.lines import chat_input, read_jsonl
from support.ports import free_ports
from support.processes import kill_9_after
from support.s3_store import ACCESS_KEY, SECRET_KEY, Proxy, S3Store
from support.waits import wait_until

from batchrun.errors import BatchrunError
from batchrun.storage.upload import upload_files


@pytest.fixture(scope="session", autouse=True)
def no_aws_settings_of_the_machine() -> Iterator[None]:
    """The developer's or CI's own AWS_* settings (a profile, a session token, an endpoint) must
    not reach the store's client or the commands these tests run: each test gives its own."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("AWS_") and k != "AWS_CA_BUNDLE"}
    for key in saved:
        del os.environ[key]
    yield
    os.environ.update(saved)


@pytest.fixture(scope="session")
def s3(
    tmp_path_factory: pytest.TempPathFactory, no_aws_settings_of_the_machine: None
) -> Iterator[S3Store]:
    """One store for the session's tests (each test makes its own bucket)."""
    store = S3Store(tmp_path_factory.mktemp("s3-store"))
    store.start()
    yield store
    store.stop()


@pytest.fixture
def bucket(s3: S3Store) -> str:
    """A new, empty bucket of the session's store."""
    name = f"t{uuid.uuid4().hex[:16]}"
    s3.fs().mkdir(name)
    return name


def put(s3: S3Store, local: Path, url: str) -> None:
    """Upload a test's input file to the store."""
    s3.fs().put_file(str(local), url)


def no_job(job: Path) -> None:
    """Nothing was made: no job directory."""
    assert not job.exists(), sorted(p.name for p in job.iterdir())


# --- a job from a bucket, to a bucket ------------------------------------------------------


def test_a_job_from_a_bucket_resumes_with_the_store_stopped_and_exports_to_a_bucket(
    tmp_path: Path, s3: S3Store, bucket: str
) -> None:
    """Submit from s3://, kill -9 mid-job, stop the store, resume (the job's own copy of its
    input is all it needs), then export --to a bucket and read every result back, once each."""
    ids = [f"r{i}" for i in range(400)]
    src = chat_input(tmp_path / "batch.jsonl", len(ids), "hello")
    own = S3Store(tmp_path / "own-store")  # this test stops it: not the session's
    own.start()
    try:
        own.fs().mkdir("inputs")
        put(own, src, "inputs/batch.jsonl")
        job = tmp_path / "job"
        p = start_echo(
            "s3://inputs/batch.jsonl",
            job,
            "--batch-size",
            "4",
            env={**own.env(), "BATCHRUN_ECHO_DELAY_MS": "50"},
        )
        kill_9_after(p, job, 20)
        assert 20 <= len(journal_records(job)) < len(ids)
    finally:
        own.stop()

    manifest = json.loads((job / "manifest.json").read_text())
    data = src.read_bytes()
    assert manifest["input_url"] == "s3://inputs/batch.jsonl"
    assert manifest["input_relpath"] == "input.jsonl"
    assert manifest["input_bytes"] == len(data)
    assert manifest["input_sha256"] == hashlib.sha256(data).hexdigest()
    assert (job / "input.jsonl").read_bytes() == data
    # The store is down (its endpoint still in the environment): the job needs it no more.
    r = rerun("resume", job, env=own.env())
    assert r.returncode == 0, r.stderr
    r = cli("status", "--job-dir", str(job), "--json", env=own.env())
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["status"] == "completed"

    r = cli("export", "--job-dir", str(job), "--to", f"s3://{bucket}/results/", env=s3.env())
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "400 succeeded, 0 failed, 0 invalid lines",
        f"wrote {job / 'output.jsonl'}",
        f"wrote {job / 'errors.jsonl'}",
        f"uploaded s3://{bucket}/results/output.jsonl",
        f"uploaded s3://{bucket}/results/errors.jsonl",
    ]
    fs = s3.fs()
    lines = [json.loads(x) for x in fs.cat(f"{bucket}/results/output.jsonl").splitlines()]
    assert sorted(line["custom_id"] for line in lines) == sorted(ids)
    assert all(line["response"]["status_code"] == 200 for line in lines)
    assert fs.cat(f"{bucket}/results/errors.jsonl") == b""
    assert fs.cat(f"{bucket}/results/output.jsonl") == (job / "output.jsonl").read_bytes()

    # The job's copy is its input: gone, resume says where it came from.
    copy = job / "input.jsonl"
    copy.rename(tmp_path / "elsewhere.jsonl")
    r = rerun("resume", job, env=own.env())
    assert r.returncode == 1
    assert r.stderr.startswith(
        f"error: the job's input file {copy} (fetched from s3://inputs/batch.jsonl) is gone; "
    ), r.stderr
    (tmp_path / "elsewhere.jsonl").rename(copy)

    # --parquet, to a prefix without its trailing slash; a rerun overwrites.
    for _ in range(2):
        r = cli("export", "--job-dir", str(job), "--parquet", "--to", f"s3://{bucket}/results", env=s3.env())  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines()[-1] == f"uploaded s3://{bucket}/results/results.parquet"
    import pandas as pd

    with fs.open(f"{bucket}/results/results.parquet", "rb") as f:
        frame = pd.read_parquet(f)
    assert sorted(frame["custom_id"]) == sorted(ids)


@pytest.mark.ray
def test_on_ray_the_driver_fetches_the_input_and_the_actors_only_run_engines(
    tmp_path: Path, s3: S3Store, bucket: str
) -> None:
    """submit --ray with an s3:// input: the driver brings the input into the job directory and
    the actors are fed from it as from a local input; export --to from the driver."""
    ids = [f"r{i}" for i in range(200)]
    put(s3, chat_input(tmp_path / "in.jsonl", len(ids), "hello"), f"{bucket}/in.jsonl")
    job = tmp_path / "job"
    r = submit_echo(
        f"s3://{bucket}/in.jsonl",
        job,
        "--ray",
        "local",
        "--workers",
        "2",
        "--batch-size",
        "16",
        env=s3.env(),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "[batchrun] ray worker 0 starting echo engine (batch size 16)" in r.stderr.splitlines()
    r = cli("export", "--job-dir", str(job), "--to", f"s3://{bucket}/out/", env=s3.env())
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in s3.fs().cat(f"{bucket}/out/output.jsonl").splitlines()]
    assert sorted(line["custom_id"] for line in lines) == sorted(ids)


def test_credentials_from_a_profile_and_the_s3_endpoint_variable(
    tmp_path: Path, s3: S3Store, bucket: str
) -> None:
    """As the AWS tools take them: keys from AWS_PROFILE's credentials file, and
    AWS_ENDPOINT_URL_S3 before AWS_ENDPOINT_URL (which points at nothing here)."""
    put(s3, chat_input(tmp_path / "in.jsonl", 5, "hello"), f"{bucket}/in.jsonl")
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"[batch]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n"
    )
    (dead,) = free_ports(1)
    env = s3.env(
        f"http://127.0.0.1:{dead}",
        AWS_ENDPOINT_URL_S3=s3.endpoint,
        AWS_SHARED_CREDENTIALS_FILE=str(credentials),
        AWS_PROFILE="batch",
        AWS_ACCESS_KEY_ID="",  # no keys but the profile's
        AWS_SECRET_ACCESS_KEY="",
    )
    job = tmp_path / "job"
    r = submit_echo(f"s3://{bucket}/in.jsonl", job, env=env)
    assert r.returncode == 0, r.stderr
    r = cli("export", "--job-dir", str(job), "--to", f"s3://{bucket}/out/", env=env)
    assert r.returncode == 0, r.stderr
    assert s3.fs().cat(f"{bucket}/out/output.jsonl") == (job / "output.jsonl").read_bytes()


def test_an_input_over_http_is_read_too_and_read_again_from_the_start_when_cut(
    tmp_path: Path,
) -> None:
    """Any fsspec URL: an http(s) input (read-only) is fetched into the job the same way. Python's
    own server serves no ranges, so a download cut off starts over, to an exact copy."""
    served = tmp_path / "site"
    served.mkdir()
    src = chat_input(served / "in.jsonl", 3000, "x" * 400)  # about 1.5 MB
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy = Proxy(server.server_address[1])
    # The break comes after the first 300 kB were taken in: the copy has begun.
    proxy.cut_down_after, proxy.cuts, proxy.cut_pause = 300_000, 1, 0.5
    url = f"{proxy.endpoint}/in.jsonl"
    try:
        job = tmp_path / "job"
        r = submit_echo(url, job)
        assert r.returncode == 0, r.stderr
    finally:
        proxy.close()
        server.shutdown()
    assert proxy.cuts_made == 1
    assert (job / "input.jsonl").read_bytes() == src.read_bytes()
    manifest = json.loads((job / "manifest.json").read_text())
    assert manifest["input_url"] == url
    assert manifest["input_sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()


# --- bad input: one line, exit 1, no job directory -----------------------------------------


@pytest.mark.parametrize(
    ("where", "env", "cause"),
    [
        ("nosuchbucket{u}/in.jsonl", {}, "the bucket does not exist"),
        ("{bucket}/missing.jsonl", {}, "no such object"),
        (
            "{bucket}/in.jsonl",
            {"AWS_SECRET_ACCESS_KEY": "wrong"},
            "access denied (Forbidden); check the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE)",
        ),
        ("{bucket}", {}, "it is a directory (a prefix), not an object"),
    ],
    ids=["missing-bucket", "missing-key", "denied-credentials", "a-bucket-not-an-object"],
)
def test_an_input_that_cannot_be_read_is_one_line_and_no_job(
    tmp_path: Path, s3: S3Store, bucket: str, where: str, env: dict[str, str], cause: str
) -> None:
    put(s3, chat_input(tmp_path / "in.jsonl", 3, "hello"), f"{bucket}/in.jsonl")
    url = "s3://" + where.format(bucket=bucket, u=uuid.uuid4().hex[:8])
    job = tmp_path / "job"
    r = submit_echo(url, job, env=s3.env(**env))
    assert (r.returncode, r.stdout) == (1, ""), r.stderr
    assert r.stderr == f"error: cannot read {url}: {cause}\n"
    no_job(job)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    """Python's file server without its request log: the command's stderr is what is checked."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("where", "why"),
    [
        ("{served}/missing.jsonl", "no such object"),
        ("http://127.0.0.1:{closed}/in.jsonl", "the endpoint does not answer (Cannot connect to host 127.0.0.1:{closed} "),
        # The resolver's own words differ (no such name, or no resolver at all): the start is ours.
        ("http://no-such-host.invalid/in.jsonl", "the host is not known (Cannot connect to host no-such-host.invalid:80 "),
    ],
    ids=["missing", "server-down", "host-not-known"],
)  # fmt: skip
def test_an_http_input_not_there_is_told_from_a_server_not_there(
    tmp_path: Path, where: str, why: str
) -> None:
    """fsspec's HTTP filesystem raises FileNotFoundError for a server it cannot reach too: only
    the server's own 404 is "no such object"."""
    served = tmp_path / "site"
    served.mkdir()
    handler = functools.partial(_Quiet, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (closed,) = free_ports(1)  # nothing listens there
    base = f"http://127.0.0.1:{server.server_address[1]}"
    url = where.format(served=base, closed=closed)
    job = tmp_path / "job"
    try:
        r = submit_echo(url, job)
    finally:
        server.shutdown()
    assert (r.returncode, r.stdout) == (1, ""), r.stderr
    assert r.stderr.startswith(f"error: cannot read {url}: {why.format(closed=closed)}"), r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    no_job(job)


@pytest.mark.parametrize(
    ("content", "cause"),
    [
        (b"", "input file is empty: {url}"),
        (b"  \n\n", "input file is empty: {url}"),
        (b"id,text\n1,hello\n", "{url} is not a JSONL file of requests (line 1: line is not valid JSON: Expecting value at column 1)"),
    ],
    ids=["empty", "blank", "csv"],
)  # fmt: skip
def test_an_object_that_is_not_an_input_is_refused_by_its_url_and_no_job(
    tmp_path: Path, s3: S3Store, bucket: str, content: bytes, cause: str
) -> None:
    s3.fs().pipe(f"{bucket}/in.jsonl", content)
    url = f"s3://{bucket}/in.jsonl"
    job = tmp_path / "job"
    r = submit_echo(url, job, env=s3.env())
    assert (r.returncode, r.stdout) == (1, ""), r.stderr
    assert r.stderr.splitlines()[-1] == "error: " + cause.format(url=url)
    no_job(job)


def test_an_endpoint_that_does_not_answer_is_one_line_and_no_job(
    tmp_path: Path, s3: S3Store
) -> None:
    (port,) = free_ports(1)  # nothing listens there
    endpoint = f"http://127.0.0.1:{port}"
    job = tmp_path / "job"
    r = submit_echo("s3://inputs/in.jsonl", job, env=s3.env(endpoint, AWS_MAX_ATTEMPTS="2"))
    assert (r.returncode, r.stdout) == (1, ""), r.stderr
    assert r.stderr == (
        "error: cannot read s3://inputs/in.jsonl: the endpoint does not answer (Could not "
        f'connect to the endpoint URL: "{endpoint}/inputs/in.jsonl")\n'
    )
    no_job(job)


def test_an_endpoint_that_takes_connections_and_never_answers_is_given_up_on(
    tmp_path: Path, s3: S3Store
) -> None:
    """A connection is made (the kernel's backlog takes it) and no answer ever comes: one try
    (AWS_MAX_ATTEMPTS=1) ends at batchrun's 30 s read time-out, not botocore's 60 s times 25."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # never accepted, never answered
    endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
    job = tmp_path / "job"
    started = time.monotonic()
    try:
        r = submit_echo("s3://inputs/in.jsonl", job, env=s3.env(endpoint, AWS_MAX_ATTEMPTS="1"))
    finally:
        silent.close()
    took = time.monotonic() - started
    assert (r.returncode, r.stderr) == (
        1,
        "error: cannot read s3://inputs/in.jsonl: the endpoint does not answer (Read timeout "
        f'on endpoint URL: "{endpoint}/inputs/in.jsonl")\n',
    )
    assert 30 <= took < 55, took
    no_job(job)


def test_a_scheme_whose_filesystem_is_not_installed_names_the_package(tmp_path: Path) -> None:
    import importlib.util

    assert importlib.util.find_spec("gcsfs") is None  # what this test is about
    job = tmp_path / "job"
    r = submit_echo("gs://bucket/in.jsonl", job)
    assert (r.returncode, r.stderr) == (
        1,
        "error: gs://bucket/in.jsonl: gs:// URLs need the package gcsfs: pip install gcsfs\n",
    )
    no_job(job)
    r = submit_echo("nosuch://bucket/in.jsonl", job)
    assert (
        r.stderr
        == "error: nosuch://bucket/in.jsonl: no installed filesystem reads nosuch:// URLs\n"
    )
    no_job(job)


def test_without_s3fs_an_s3_url_names_the_extra(tmp_path: Path, s3: S3Store) -> None:
    """A batchrun installed without its s3 extra: s3fs cannot be imported."""
    blocker = tmp_path / "blocker" / "s3fs"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('No module named s3fs')\n")
    path = os.pathsep.join([str(tmp_path / "blocker"), os.environ.get("PYTHONPATH", "")])
    job = tmp_path / "job"
    # A real process: what it can import is the subject (PYTHONPATH puts the blocker first).
    r = submit_echo("s3://b/in.jsonl", job, env=s3.env(PYTHONPATH=path), process=True)
    assert (r.returncode, r.stderr) == (
        1,
        "error: s3://b/in.jsonl: s3:// URLs need s3fs: install it with pip install 'batchrun[s3]'\n",
    )
    no_job(job)
    r = cli_process(
        "export", "--job-dir", str(job), "--to", "s3://b/out/", env=s3.env(PYTHONPATH=path)
    )
    assert r.stderr == (
        "error: s3://b/out/: s3:// URLs need s3fs: install it with pip install 'batchrun[s3]'\n"
    )


def test_a_download_broken_once_is_read_again_to_an_exact_copy(
    tmp_path: Path, s3: S3Store, bucket: str
) -> None:
    src = chat_input(tmp_path / "in.jsonl", 3000, "x" * 400)  # about 1.5 MB
    put(s3, src, f"{bucket}/in.jsonl")
    proxy = Proxy(int(s3.endpoint.rsplit(":", 1)[1]))
    proxy.cut_down_after, proxy.cuts = 300_000, 1
    try:
        job = tmp_path / "job"
        r = submit_echo(f"s3://{bucket}/in.jsonl", job, env=s3.env(proxy.endpoint))
        assert r.returncode == 0, r.stderr
    finally:
        proxy.close()
    assert proxy.cuts_made == 1
    assert (job / "input.jsonl").read_bytes() == src.read_bytes()
    manifest = json.loads((job / "manifest.json").read_text())
    assert manifest["input_sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()


def test_a_large_object_broken_mid_way_is_read_on_from_where_it_broke(
    tmp_path: Path, s3: S3Store, bucket: str
) -> None:
    """An object of more than one block (8 MiB) cut off in its second: the copy goes on from the
    offset reached (a ranged GET), not from the start, and is exact."""
    from batchrun.storage.fetch import BLOCK, fetch_input

    data = os.urandom(BLOCK + (3 << 20))  # 11 MiB
    s3.fs().pipe(f"{bucket}/big.jsonl", data)
    proxy = Proxy(int(s3.endpoint.rsplit(":", 1)[1]))
    proxy.cut_down_after, proxy.cuts = BLOCK + (1 << 20), 1  # 1 MiB into the second block
    saved = os.environ.copy()
    os.environ.update(s3.env(proxy.endpoint))
    try:
        fetched = fetch_input(f"s3://{bucket}/big.jsonl", tmp_path)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        proxy.close()
    assert proxy.cuts_made == 1
    assert fetched.path.read_bytes() == data
    assert (fetched.size, fetched.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["input.jsonl"]
    # The second block was asked for again, not the whole object: 11 MiB + the 1 MiB lost.
    assert proxy.down_bytes < len(data) + (2 << 20), proxy.down_bytes


def test_a_download_that_keeps_breaking_is_an_error_and_no_job(
    tmp_path: Path, s3: S3Store, bucket: str
) -> None:
    src = chat_input(tmp_path / "in.jsonl", 3000, "x" * 400)
    put(s3, src, f"{bucket}/in.jsonl")
    proxy = Proxy(int(s3.endpoint.rsplit(":", 1)[1]))
    proxy.cut_down_after = 300_000  # every time
    url = f"s3://{bucket}/in.jsonl"
    try:
        job = tmp_path / "job"
        r = submit_echo(url, job, env=s3.env(proxy.endpoint))
    finally:
        proxy.close()
    assert (r.returncode, r.stdout) == (1, ""), r.stderr
    assert r.stderr.startswith(f"error: cannot read {url}: the connection was lost ("), r.stderr
    assert r.stderr.endswith(" (read 4 times); no job was made\n"), r.stderr
    assert r.stderr.count("\n") == 1
    assert proxy.cuts_made >= 4
    no_job(job)


# --- export --to: errors, and uploads that never look complete when cut ---------------------


@pytest.fixture
def finished_job(tmp_path: Path) -> Path:
    """A small finished local job."""
    job = tmp_path / "job"
    r = submit_echo(chat_input(tmp_path / "in.jsonl", 20, "hello"), job)
    assert r.returncode == 0, r.stderr
    return job


def test_export_to_a_missing_bucket_refuses_before_writing(finished_job: Path, s3: S3Store) -> None:
    r = cli("export", "--job-dir", str(finished_job), "--to", "s3://nosuchbucket39/out/", env=s3.env())  # fmt: skip
    assert (r.returncode, r.stdout, r.stderr) == (
        1,
        "",
        "error: cannot write to s3://nosuchbucket39/out/: the bucket nosuchbucket39 does not exist\n",
    )
    assert not (finished_job / "output.jsonl").exists()


def test_export_to_an_endpoint_that_does_not_answer_refuses_before_writing(
    finished_job: Path, s3: S3Store
) -> None:
    (port,) = free_ports(1)
    endpoint = f"http://127.0.0.1:{port}"
    r = cli("export", "--job-dir", str(finished_job), "--to", "s3://out/x/", env=s3.env(endpoint, AWS_MAX_ATTEMPTS="1"))  # fmt: skip
    assert (r.returncode, r.stdout, r.stderr) == (
        1,
        "",
        "error: cannot write to s3://out/x/: the endpoint does not answer (Could not connect "
        f'to the endpoint URL: "{endpoint}/out")\n',
    )
    assert not (finished_job / "output.jsonl").exists()


def test_export_with_denied_credentials_says_so_and_keeps_the_files(
    finished_job: Path, s3: S3Store, bucket: str
) -> None:
    """Credentials that may not look at the bucket are not refused up front (they may still
    write objects); the upload's refusal is the one line, and the files stay on disk."""
    env = s3.env(AWS_SECRET_ACCESS_KEY="wrong")
    r = cli("export", "--job-dir", str(finished_job), "--to", f"s3://{bucket}/out/", env=env)
    output = finished_job / "output.jsonl"
    assert r.returncode == 1
    assert r.stderr == (
        f"error: cannot upload {output} to s3://{bucket}/out/output.jsonl: access denied (The "
        "request signature we calculated does not match the signature you provided. Check your "
        "key and signing method.); check the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE); the "
        f"file is still at {output}, export again with --to to retry\n"
    )
    assert output.exists() and s3.fs().ls(bucket) == []
    # The advice followed, the credentials put right: the files go up.
    r = cli("export", "--job-dir", str(finished_job), "--to", f"s3://{bucket}/out/", env=s3.env())
    assert r.returncode == 0, r.stderr
    assert s3.fs().cat(f"{bucket}/out/output.jsonl") == output.read_bytes()


@pytest.mark.parametrize(
    ("to", "message"),
    [
        ("out/", "--to takes a URL (s3://BUCKET/PREFIX/); for a local directory use --output-dir: out/"),
        ("https://example.com/out/", "cannot write to https://example.com/out/: https:// URLs are read-only"),
        # Files in this process's memory: "uploaded", then gone when it exits.
        ("memory://x/", "cannot write to memory://x/: a memory:// filesystem lives in this process and keeps nothing after it exits"),
        ("s3://", "--to s3:// names no bucket; give one: s3://BUCKET/PREFIX/"),
        ("s3:///out/", "--to s3:///out/ names no bucket; give one: s3://BUCKET/PREFIX/"),
    ],
)  # fmt: skip
def test_export_to_what_is_not_a_writable_url_is_a_usage_error(
    finished_job: Path, to: str, message: str
) -> None:
    r = cli("export", "--job-dir", str(finished_job), "--to", to)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"error: {message}\n")
    assert not (finished_job / "output.jsonl").exists()  # refused before anything is written


@pytest.mark.slow
@pytest.mark.parametrize(
    ("to", "why"),
    [
        ("ftp://127.0.0.1:{port}/x/", "the endpoint does not answer ([Errno 111] Connection refused)"),
        # The resolver's own words differ (no such name, or no resolver at all): the start is ours.
        ("ftp://no-such-host.invalid/x/", "the host is not known ([Errno "),
    ],
)  # fmt: skip
def test_export_to_a_url_its_filesystem_cannot_open_is_one_line(
    finished_job: Path, to: str, why: str
) -> None:
    """A real process: the half-made FTPFileSystem's finaliser printed a traceback at exit,
    after a false "missing host" (the URL's own host was never given to it)."""
    (port,) = free_ports(1)
    url = to.format(port=port)
    r = cli_process("export", "--job-dir", str(finished_job), "--to", url)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.startswith(f"error: {url}: {why}") and r.stderr.endswith(")\n"), r.stderr
    assert r.stderr.count("\n") == 1, r.stderr  # no traceback after it
    assert not (finished_job / "output.jsonl").exists()


def test_an_upload_cut_off_is_aborted_and_the_old_object_stays_whole(
    tmp_path: Path, s3: S3Store, bucket: str
) -> None:
    """A multipart upload whose parts keep failing is aborted: the key keeps the object a
    previous export put there, whole, and no unfinished upload is left in the bucket."""
    fs = s3.fs()
    fs.pipe(f"{bucket}/out/output.jsonl", b"the previous export\n")
    big = tmp_path / "output.jsonl"
    with big.open("wb") as f:
        for _ in range(20):
            f.write(os.urandom(1 << 20))  # 20 MiB: three parts of 8 MiB
    proxy = Proxy(int(s3.endpoint.rsplit(":", 1)[1]))
    proxy.cut_up_after = 3 << 20  # every connection that carries a part is cut
    saved = os.environ.copy()
    os.environ.update(s3.env(proxy.endpoint, AWS_MAX_ATTEMPTS="2"))
    try:
        with pytest.raises(BatchrunError) as raised:
            upload_files([big], f"s3://{bucket}/out/")
    finally:
        os.environ.clear()
        os.environ.update(saved)
        proxy.close()
    message = str(raised.value)
    assert message.startswith(f"cannot upload {big} to s3://{bucket}/out/output.jsonl: "), message
    assert message.endswith(f"; the file is still at {big}, export again with --to to retry")
    assert proxy.cuts_made >= 1
    assert fs.cat(f"{bucket}/out/output.jsonl") == b"the previous export\n"
    uploads = fs.call_s3("list_multipart_uploads", Bucket=bucket)
    assert uploads.get("Uploads", []) == []


def test_an_export_killed_mid_upload_leaves_no_object(
    tmp_path: Path, s3: S3Store, bucket: str
) -> None:
    """kill -9 of export while it uploads: the key has no object at all (S3 objects appear whole
    on PUT); the export run again puts it there, whole."""
    ids = [f"r{i}" for i in range(2000)]
    src = chat_input(tmp_path / "in.jsonl", len(ids), "y" * 1000)  # output.jsonl ~2.5 MB
    job = tmp_path / "job"
    assert submit_echo(src, job).returncode == 0
    assert cli("export", "--job-dir", str(job)).returncode == 0
    size = (job / "output.jsonl").stat().st_size
    assert size > 2_000_000
    proxy = Proxy(int(s3.endpoint.rsplit(":", 1)[1]))
    proxy.up_rate = 1_000_000  # bytes a second: the upload takes seconds
    key = f"{bucket}/out/output.jsonl"
    try:
        p = start_cli("export", "--job-dir", str(job), "--to", f"s3://{bucket}/out/", env=s3.env(proxy.endpoint))  # fmt: skip
        try:
            wait_until(lambda: proxy.up_bytes > size // 3, "a third of output.jsonl went up")
        finally:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    finally:
        proxy.close()
    assert not s3.fs().exists(key)
    r = cli("export", "--job-dir", str(job), "--to", f"s3://{bucket}/out/", env=s3.env())
    assert r.returncode == 0, r.stderr
    lines: list[dict[str, Any]] = [json.loads(x) for x in s3.fs().cat(key).splitlines()]
    assert sorted(line["custom_id"] for line in lines) == sorted(ids)
    assert read_jsonl(job / "output.jsonl") == lines


# --- what is a URL ---------------------------------------------------------------------------


def test_what_is_fetched_and_what_is_read_where_it_is() -> None:
    from batchrun.storage.fetch import local_path, remote_input
    from batchrun.storage.upload import MAX_PARTS, PART_SIZE, part_size

    assert remote_input("s3://bucket/dir/in.jsonl") == "s3://bucket/dir/in.jsonl"
    assert remote_input("https://example.com/in.jsonl") == "https://example.com/in.jsonl"
    for local in ("in.jsonl", "/data/in.jsonl", "C:\\data\\in.jsonl", "file:///data/in.jsonl"):
        assert remote_input(local) is None, local
    assert local_path("file:///data/in.jsonl") == Path("/data/in.jsonl")
    assert part_size(1) == PART_SIZE
    huge = 200 << 30  # 200 GiB: 8 MiB parts would be 25,600 of them
    assert part_size(huge) > PART_SIZE and -(-huge // part_size(huge)) <= MAX_PARTS


def test_a_file_url_is_read_where_it_is_not_copied(tmp_path: Path) -> None:
    src = chat_input(tmp_path / "in.jsonl", 3, "hello")
    job = tmp_path / "job"
    r = submit_echo(src.as_uri(), job)
    assert r.returncode == 0, r.stderr
    manifest = json.loads((job / "manifest.json").read_text())
    assert (manifest["input_path"], manifest["input_url"]) == (str(src), None)
    assert not (job / "input.jsonl").exists()
