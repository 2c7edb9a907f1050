"""A serve root remembers how it was started (serve/settings.py): `batchrun serve --root R` alone,
the command a stopped server advises, brings back the same service (its key, engine, model and
port); an option given again with another value is applied from then on, or refused in one line
naming both values when it would answer an unfinished batch with another model."""

from __future__ import annotations

import json
import shlex
import signal
from pathlib import Path

import httpx
import pytest
from support import serving
from support.cli import cli
from support.lines import write_jsonl
from support.waits import results_at_least, wait_until

from batchrun.config import GivenOptions
from batchrun.errors import BatchrunError
from batchrun.run.options import RunOptions
from batchrun.serve.batches import RECORD_NAME
from batchrun.serve.keys import Keys, entries_for, read_keys_file
from batchrun.serve.settings import SETTINGS_NAME, Given, Saved, _other_model, resolve, save


def _settings(**given: object):  # type: ignore[no-untyped-def]
    return RunOptions.from_given(GivenOptions(**given), progress=False, ray=None).settings  # type: ignore[arg-type]


@pytest.mark.slow
def test_stopped_with_sigterm_then_run_as_advised_keeps_key_engine_model_and_port(
    tmp_path: Path,
) -> None:
    """The issue's case: `--engine echo --api-key K --batch-size 2`, SIGTERM mid-batch, then the
    printed command run as printed: the key is still required, the engine, model and port are
    the same, and every line of the batch is answered by the echo engine."""
    root = tmp_path / "root"
    first = serving.start_server(
        root, "--api-key", serving.API_KEY, "--batch-size", "2", env=serving.SLOW_ENV
    )
    client = first.client()
    models = [m.id for m in client.models.list()]
    n = 300
    batch = serving.create_batch(client, serving.requests_file(tmp_path / "in.jsonl", n))
    job = first.batch_dir(batch.id)
    wait_until(results_at_least(job, 30), "30 requests of the batch finish")
    serving.stop_server(first, signal.SIGTERM)
    assert first.process.returncode == 143
    command = serving.continue_with(first)
    assert command == f"batchrun serve --root {shlex.quote(str(root))}"
    again = serving.run_printed(
        command, root, first.url, env=serving.SLOW_ENV
    )  # the same port, or no answer
    try:
        assert httpx.get(f"{again.url}/v1/files", timeout=10).status_code == 401
        wrong = {"Authorization": "Bearer not-the-key"}
        assert httpx.get(f"{again.url}/v1/files", headers=wrong, timeout=10).status_code == 401
        keyed = {"Authorization": f"Bearer {serving.API_KEY}"}
        assert httpx.get(f"{again.url}/v1/files", headers=keyed, timeout=10).status_code == 200
        client = again.client()
        assert [m.id for m in client.models.list()] == models
        done = serving.wait_done(client, batch.id, timeout=60)
        assert done.status == "completed"
        assert done.request_counts is not None
        assert (done.request_counts.total, done.request_counts.completed) == (n, n)
        output = serving.lines_of(client, done.output_file_id)
    finally:
        serving.stop_server(again)
    # The echo engine answered every line, before the stop and after: its answer is the prompt.
    answers = {x["custom_id"]: x["response"]["body"]["choices"][0]["message"] for x in output}
    assert {c: a["content"] for c, a in answers.items()} == {
        f"req-{i:04d}": f"hello {i}" for i in range(n)
    }
    first_banner = first.log.read_text().splitlines()[0]
    again_banner = again.log.read_text().splitlines()[0]
    assert again_banner == first_banner, (first_banner, again_banner)
    assert "on echo; API keys of 1 tenant" in again_banner
    # The key is kept as a salted hash only: no file under the root holds it.
    for path in root.rglob("*"):
        if path.is_file():
            assert serving.API_KEY.encode() not in path.read_bytes(), path


@pytest.mark.slow
def test_another_engine_is_refused_while_a_batch_is_unfinished_other_options_apply(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    first = serving.start_server(root, "--batch-size", "2", env=serving.SLOW_ENV)
    batch = serving.create_batch(first.client(), serving.requests_file(tmp_path / "in.jsonl", 300))
    wait_until(results_at_least(first.batch_dir(batch.id), 30), "30 requests finish")
    serving.stop_server(first, signal.SIGTERM)
    assert (
        first.log.read_text()
        .splitlines()[0]
        .endswith("; no API key: open to anyone who can reach this loopback address")
    )
    refused = cli("serve", "--root", str(root), "--engine", "vllm")
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "error: --engine vllm differs from this root's --engine echo, which its 1 unfinished "
        "batch was accepted on (a batch is never answered by two models): start it with "
        "--engine echo (or with --root alone) to finish them, or use another --root"
    )
    again = serving.start_server(root, "--batch-size", "4", env=serving.SLOW_ENV)
    try:
        done = serving.wait_done(again.client(), batch.id, timeout=60)
    finally:
        serving.stop_server(again)
    assert done.status == "completed"
    log = again.log.read_text()
    assert "[batchrun serve] --batch-size 4 (this root had 2): applied from now on" in log
    saved = json.loads((root / SETTINGS_NAME).read_text())
    assert (saved["options"]["engine"], saved["options"]["batch_size"]) == ("echo", 4)
    # Every batch ended: another model is taken, for the batches to come.
    later = serving.start_server(root, "--model", "other-model")
    serving.stop_server(later)
    assert "--model other-model (this root had (the default)): applied from now on" in (
        later.log.read_text()
    )


@pytest.mark.slow  # 2 s: the first serve in this process imports the server
def test_no_key_is_refused_on_an_address_that_is_not_loopback(tmp_path: Path) -> None:
    root = tmp_path / "root"
    refused = cli("serve", "--root", str(root), "--engine", "echo", "--host", "0.0.0.0")
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "error: --host 0.0.0.0 is not a loopback address: give --api-key KEY (or "
        "--api-keys-file FILE), so that only your clients reach the server"
    )
    assert not root.exists()


def test_a_model_given_where_the_root_had_the_default_is_refused_while_a_batch_runs(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    save(root, Saved(options={"engine": "echo"}))
    record = root / "batches" / "batch_0123456789abcdef01234567" / RECORD_NAME
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"batch": {"status": "in_progress"}}), encoding="utf-8")
    given = Given(GivenOptions(engine="echo", model="org/other"))
    with pytest.raises(BatchrunError) as e:
        resolve(root, given)
    assert e.value.exit_code == 2
    assert str(e.value) == (
        "--model org/other differs from this root's --model (the default), which its 1 "
        "unfinished batch was accepted on (a batch is never answered by two models): start it "
        "without --model (or with --root alone) to finish them, or use another --root"
    )
    record.write_text(json.dumps({"batch": {"status": "completed"}}), encoding="utf-8")
    taken = resolve(root, given)  # every batch ended: taken, and said
    assert taken.changes == ["--model org/other (this root had (the default))"]
    assert taken.saved.options == {"engine": "echo", "model": "org/other"}


def test_which_changes_would_answer_a_line_with_another_model() -> None:
    two = _settings(engine="echo", models=["a=org/a", "b=org/b"])
    assert _other_model(two, _settings(engine="echo", models=["a=org/a"])) is None
    assert _other_model(two, _settings(engine="echo", models=["a=org/a", "c=org/c"])) is None
    assert _other_model(two, _settings(engine="echo", models=["a=org/x", "b=org/b"])) == "model"
    assert _other_model(two, _settings(engine="vllm", models=["a=org/a"])) == "engine"
    one = _settings(engine="echo", model="org/m")
    assert _other_model(one, _settings(engine="echo", model="org/m", batch_size=8)) is None
    assert _other_model(one, _settings(engine="echo", model="org/n")) == "model"
    # One model answered every name: named models now must all be it.
    assert _other_model(one, _settings(engine="echo", models=["a=org/m", "b=org/m"])) is None
    assert _other_model(one, _settings(engine="echo", models=["a=org/m", "b=org/b"])) == "model"
    # Named models before, one now: it answers the lines naming it, so it must be one of them.
    assert _other_model(two, _settings(engine="echo", model="org/b")) is None
    assert _other_model(two, _settings(engine="echo", model="org/z")) == "model"
    assert _other_model(one, _settings(engine="echo", model="org/m", dtype="float32")) == "dtype"
    lora = _settings(engine="echo", lora_modules=["x=/tmp/x"])
    assert _other_model(lora, _settings(engine="echo", lora_modules=["x=/tmp/y"])) == (
        "lora_modules"
    )
    assert _other_model(lora, _settings(engine="echo", lora_modules=["y=/tmp/y"])) is None


def test_a_key_given_again_keeps_its_tenant_and_salt_and_a_new_one_gets_its_own() -> None:
    first = entries_for([(None, "k1"), ("team-a", "k2")], "option", [])
    assert first[0].tenant.startswith("key-") and first[1].tenant == "team-a"
    assert "k1" not in json.dumps([e.digest + e.salt for e in first])
    again = entries_for([(None, "k1"), ("team-a", "k3")], "option", first)
    assert again[0] == first[0]  # the same key: the same entry
    assert again[1].tenant == "team-a" and again[1].digest != first[1].digest  # rotated
    keys = Keys(again)
    assert keys.tenant("k1") == first[0].tenant
    assert keys.tenant("k3") == "team-a"
    assert keys.tenant("k2") is None and keys.tenant("") is None
    assert not keys.open() and Keys([]).open() and not Keys([], required=True).open()
    # A key is compared as the bytes sent: UTF-8, as given on the command line.
    accented = Keys(entries_for([("t", "sk-clé")], "option", []))
    assert accented.tenant("sk-clé".encode()) == "t" and accented.tenant(b"sk-cl\xe9") is None
    # Two salts: the same key has two digests in two roots.
    assert entries_for([(None, "k1")], "option", [])[0].digest != first[0].digest


def test_a_keys_file_line_that_is_not_one_is_refused_naming_the_line_not_the_key(
    tmp_path: Path,
) -> None:
    good = write_jsonl(tmp_path / "keys", ["# tenants", "", "team-a sk-aaa", "sk-bbb"])
    assert read_keys_file(good) == [("team-a", "sk-aaa"), (None, "sk-bbb")]
    bad = write_jsonl(tmp_path / "bad", ["team-a sk-aaa extra"])
    with pytest.raises(Exception) as e:
        read_keys_file(bad)
    assert str(e.value) == (
        f"--api-keys-file {bad}, line 1: has 3 words; a line is NAME KEY or KEY"
    )
    odd = write_jsonl(tmp_path / "odd", ["key-0123abcd sk-ccc"])
    with pytest.raises(Exception) as e:
        read_keys_file(odd)
    assert "sk-ccc" not in str(e.value) and "line 1" in str(e.value)


def test_a_key_in_the_keys_file_and_given_with_api_key_is_refused(tmp_path: Path) -> None:
    keys = write_jsonl(tmp_path / "keys", ["team-a sk-same"])
    given = Given(GivenOptions(engine="echo"), api_keys=["sk-same"], api_keys_file=keys)
    with pytest.raises(BatchrunError) as e:
        resolve(tmp_path / "root", given)
    assert e.value.exit_code == 2
    assert str(e.value) == (
        f"--api-keys-file {keys} holds a key given with --api-key (a key is one tenant)"
    )
    assert "sk-same" not in str(e.value)
    first = resolve(tmp_path / "root", Given(GivenOptions(), api_keys=["sk-1"]))
    (tmp_path / "root").mkdir()
    save(tmp_path / "root", first.saved)
    again = resolve(tmp_path / "root", Given(GivenOptions(), api_keys=["sk-1", "sk-2"]))
    assert again.changes == ["--api-key: 2 given (this root had 1 other)"]
    assert again.keys[0] == first.keys[0]  # sk-1 keeps its tenant


def test_the_gpu_hour_cost_is_remembered_and_a_new_one_applies_from_then_on(
    tmp_path: Path,
) -> None:
    first = resolve(tmp_path, Given(GivenOptions(engine="echo"), gpu_hour_cost=2.5))
    assert first.gpu_hour_cost == 2.5 and first.changes == []
    save(tmp_path, first.saved)
    again = resolve(tmp_path, Given(GivenOptions()))
    assert again.gpu_hour_cost == 2.5 and again.changes == []
    changed = resolve(tmp_path, Given(GivenOptions(), gpu_hour_cost=4.0))
    assert changed.gpu_hour_cost == 4.0
    assert changed.changes == ["--gpu-hour-cost 4.0 (this root had 2.5)"]
