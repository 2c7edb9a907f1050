"""`batchrun serve` whose engine is a server the team already runs (`--base-url`): batches made
through the OpenAI client are answered by that server, line by line, as `submit --base-url`
answers them (tests/test_remote_engine.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import serving
from support.fakes.openai_server import MODEL, answer, fake_openai_server
from support.lines import chat_line, write_jsonl

pytestmark = pytest.mark.slow  # a serve process


def test_a_serve_root_on_a_remote_server_answers_a_batch_with_the_server_s_answers(
    tmp_path: Path,
) -> None:
    # Two keys: serve's own for its clients, and the remote server's (OPENAI_API_KEY). Only the
    # second may reach the server: it refuses any other.
    with fake_openai_server(key="server-key") as remote:
        env = {"BATCHRUN_API_KEY": serving.API_KEY, "OPENAI_API_KEY": "server-key"}
        server = serving.start_server(
            tmp_path / "root", "--base-url", remote.url, env=env, engine=None
        )
        try:
            client = server.client()
            # Lines that name the server's model, and lines that name none (the server's one).
            lines = [chat_line(f"req-{i:04d}", f"hello {i}", model=MODEL) for i in range(15)]
            lines += [chat_line(f"req-{i:04d}", f"hello {i}") for i in range(15, 30)]
            for line in lines[15:]:
                del line["body"]["model"]
            batch = serving.create_batch(client, write_jsonl(tmp_path / "in.jsonl", lines))
            done = serving.wait_done(client, batch.id, timeout=60)
            assert done.status == "completed", server.log.read_text()
            assert done.request_counts is not None and done.request_counts.completed == 30
            answered = serving.lines_of(client, done.output_file_id)
        finally:
            serving.stop_server(server)
        # Each line went to the server once, with the server's one model filled in.
        assert sorted(remote.answered_texts()) == sorted(f"hello {i}" for i in range(30))
        assert all(body["model"] == MODEL for _, body in remote.received)
    # And each answer is the server's own to that line's body.
    sent = {body["messages"][-1]["content"]: body for _, body in remote.received}
    assert len(answered) == 30
    for line in answered:
        i = int(line["custom_id"].rsplit("-", 1)[1])
        expected = answer("/v1/chat/completions", sent[f"hello {i}"])
        assert line["response"]["status_code"] == 200
        assert line["response"]["body"]["choices"] == expected["choices"]
    log = server.log.read_text()
    assert "model fake-model on remote" in log and serving.API_KEY not in log
    for path in (tmp_path / "root").rglob("*"):
        if path.is_file():
            assert "server-key" not in path.read_text(errors="replace"), path
