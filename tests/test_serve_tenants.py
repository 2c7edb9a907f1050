"""`batchrun serve` for several teams (serve/tenants.py), through the `openai` client: each key is a
tenant that sees its own files and batches whole and nothing of another's (every cross-tenant
call answers as for an id that does not exist), keys are never on disk in clear, a restart keeps
the tenants, the keys file is read again on SIGHUP, /metrics and the log name tenants, never
keys, and one tenant's big batch does not starve another's small one."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest
from support import serving
from support.waits import results_at_least, wait_until

pytestmark = pytest.mark.slow  # out of the fast tier: docs/development.md

KEY_A = "sk-tenant-a-0123456789abcdef"
KEY_B = "sk-tenant-b-fedcba9876543210"
KEY_C = "sk-unnamed-c-5555555555555555"


def _keys_file(path: Path, *lines: str) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def _not_found(call: object) -> str:
    """The message of the 404 a call (a no-argument callable) answers."""
    assert callable(call)
    with pytest.raises(openai.NotFoundError) as e:
        call()
    return str(e.value.message)


def _no_key_on_disk(root: Path) -> None:
    """No file under the root holds a key in clear."""
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for key in (KEY_A, KEY_B, KEY_C):
                assert key.encode() not in data, (path, key)


def test_two_tenants_see_their_own_whole_and_nothing_of_each_others(tmp_path: Path) -> None:
    root = tmp_path / "root"
    keys = _keys_file(tmp_path / "keys", "# two teams", f"team-a {KEY_A}", f"team-b {KEY_B}")
    server = serving.start_server(root, "--api-keys-file", str(keys), "--api-key", KEY_C)
    try:
        a, b, c = server.client(KEY_A), server.client(KEY_B), server.client(KEY_C)
        ba = serving.wait_done(
            a, serving.create_batch(a, serving.requests_file(tmp_path / "a.jsonl", 30)).id
        )
        bb = serving.wait_done(
            b, serving.create_batch(b, serving.requests_file(tmp_path / "b.jsonl", 5, "b")).id
        )
        assert ba.status == bb.status == "completed"
        assert ba.output_file_id is not None
        # Each of a's ids, asked by b (and by c, a tenant without a name), is one it never saw.
        for other in (b, c):
            for file_id in (ba.input_file_id, ba.output_file_id):
                unknown = _not_found(lambda o=other: o.files.retrieve("file-" + "0" * 24))
                theirs = _not_found(lambda o=other, f=file_id: o.files.retrieve(f))
                assert theirs == unknown.replace("file-" + "0" * 24, file_id)
                _not_found(lambda o=other, f=file_id: o.files.content(f))
                _not_found(lambda o=other, f=file_id: o.files.delete(f))
            _not_found(lambda o=other: o.batches.retrieve(ba.id))
            _not_found(lambda o=other: o.batches.cancel(ba.id))
            # A batch of a's file: as of a file that does not exist.
            with pytest.raises(openai.NotFoundError) as mine:
                other.batches.create(
                    input_file_id=ba.input_file_id,
                    endpoint="/v1/chat/completions",
                    completion_window="24h",
                )
            with pytest.raises(openai.NotFoundError) as none:
                other.batches.create(
                    input_file_id="file-" + "f" * 24,
                    endpoint="/v1/chat/completions",
                    completion_window="24h",
                )
            assert mine.value.message == none.value.message.replace(
                "file-" + "f" * 24, ba.input_file_id
            )
            # A cursor of a's reveals nothing: an empty page, as an unknown id's.
            assert other.batches.list(after=ba.id).data == []
            assert other.files.list(after=ba.input_file_id).data == []
        # Lists hold one's own, whole.
        assert [x.id for x in b.batches.list().data] == [bb.id]
        assert {f.id for f in b.files.list()} == {bb.input_file_id, bb.output_file_id}
        assert c.batches.list().data == [] and list(c.files.list()) == []
        assert [x.id for x in a.batches.list().data] == [ba.id]
        assert {f.id for f in a.files.list()} == {ba.input_file_id, ba.output_file_id}
        assert len(serving.lines_of(a, ba.output_file_id)) == 30
        # /metrics and the log name tenants by name (or key- and 8 hex digits), never by key.
        metrics = httpx.get(
            f"{server.url}/metrics", headers={"Authorization": f"Bearer {KEY_B}"}, timeout=10
        ).text
        assert 'batchrun_tenant_batches{status="completed",tenant="team-a"} 1.0' in metrics
        assert 'batchrun_tenant_requests{outcome="succeeded",tenant="team-b"} 5.0' in metrics
    finally:
        serving.stop_server(server)
    log = server.log.read_text()
    assert "(tenant team-a)" in log and "(tenant team-b)" in log
    assert "API keys of 3 tenants (key-" in log and "team-a, team-b)" in log
    for key in (KEY_A, KEY_B, KEY_C):
        assert key not in log and key not in metrics
    _no_key_on_disk(root)
    # A restart with --root alone keeps the tenants: the keys (and the unnamed key's tenant).
    again = serving.start_server(root)
    try:
        a, b, c = again.client(KEY_A), again.client(KEY_B), again.client(KEY_C)
        assert [x.id for x in a.batches.list().data] == [ba.id]
        _not_found(lambda: b.batches.retrieve(ba.id))
        assert c.batches.list().data == []
        assert a.batches.retrieve(ba.id).status == "completed"
    finally:
        serving.stop_server(again)
    _no_key_on_disk(root)


def test_the_keys_file_is_read_again_on_sighup(tmp_path: Path) -> None:
    root = tmp_path / "root"
    keys = _keys_file(tmp_path / "keys", f"team-a {KEY_A}")
    server = serving.start_server(root, "--api-keys-file", str(keys))
    try:
        a = server.client(KEY_A)
        batch = serving.wait_done(
            a, serving.create_batch(a, serving.requests_file(tmp_path / "a.jsonl", 3)).id
        )
        with pytest.raises(openai.AuthenticationError):
            server.client(KEY_B).files.list()
        _reread(server, keys, f"team-a {KEY_A}", f"team-b {KEY_B}")
        assert list(server.client(KEY_B).files.list()) == []
        # team-a's key replaced: the old one is refused, the new one sees team-a's batch.
        _reread(server, keys, f"team-a {KEY_C}", f"team-b {KEY_B}")
        with pytest.raises(openai.AuthenticationError):
            a.files.list()
        assert server.client(KEY_C).batches.retrieve(batch.id).status == "completed"
        # A line that is not one: the keys stay as they were, the log says why (not the key).
        keys.write_text(f"team-a {KEY_A} oops\n", encoding="utf-8")
        os.kill(server.process.pid, signal.SIGHUP)
        wait_until(lambda: "the keys stay as they were" in server.log.read_text(), "refused")
        assert server.client(KEY_C).batches.retrieve(batch.id).status == "completed"
    finally:
        serving.stop_server(server)
    assert KEY_A not in server.log.read_text()
    _no_key_on_disk(root)


def _reread(server: serving.Server, keys: Path, *lines: str) -> None:
    """Write the keys file, send SIGHUP, wait until the server says it read it."""
    before = server.log.read_text().count("SIGHUP: read")
    _keys_file(keys, *lines)
    os.kill(server.process.pid, signal.SIGHUP)
    wait_until(
        lambda: server.log.read_text().count("SIGHUP: read") > before, "the keys file is read"
    )


def test_one_tenants_flood_does_not_starve_anothers_small_batch(tmp_path: Path) -> None:
    """A's batch of 3,000 lines (about 15 s on the slow engine) runs first; B's batch of 20,
    made once A's is under way, gets its turn at once: done in a few seconds, while A's runs."""
    root = tmp_path / "root"
    keys = _keys_file(tmp_path / "keys", f"team-a {KEY_A}", f"team-b {KEY_B}")
    server = serving.start_server(
        root, "--api-keys-file", str(keys), *serving.SLOW_ENGINE, env=serving.SLOW_ENV
    )
    try:
        a, b = server.client(KEY_A), server.client(KEY_B)
        big = serving.create_batch(a, serving.requests_file(tmp_path / "a.jsonl", 3000))
        wait_until(results_at_least(server.batch_dir(big.id), 100), "a's batch is under way")
        began = time.monotonic()
        small = serving.wait_done(
            b, serving.create_batch(b, serving.requests_file(tmp_path / "b.jsonl", 20, "b")).id
        )
        took = time.monotonic() - began
        assert small.status == "completed"
        assert a.batches.retrieve(big.id).status == "in_progress", "a's batch ended first"
        assert took < 6, took
    finally:
        serving.stop_server(server)
