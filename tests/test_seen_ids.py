"""The reader's duplicate custom_id check in compact form (openai/seen_ids.py): exact even when
hashes collide, since a match is checked against the file's own line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.lines import write_jsonl

from batchrun.openai import seen_ids
from batchrun.openai.reader import read_input
from batchrun.openai.records import LineError, Request


def line(cid: str) -> dict[str, object]:
    return {"custom_id": cid, "method": "POST", "url": "/v1/completions",
            "body": {"model": "m", "prompt": "p"}}  # fmt: skip


def errors(path: Path) -> list[tuple[int, str | None, str, str]]:
    return [(e.line, e.custom_id, e.code, e.message) for e in read_input(path)
            if isinstance(e, LineError)]  # fmt: skip


def test_colliding_hashes_are_not_duplicates_and_duplicates_are_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every custom_id hashes alike (and to the empty slot's value): only the file tells them apart.
    monkeypatch.setattr(seen_ids, "_hash", lambda s: 0)
    ids = [f"id-{i}" for i in range(300)]  # past several offset blocks and table growths
    src = tmp_path / "in.jsonl"
    write_jsonl(src, [line(c) for c in ids] + [line("id-7"), line("id-250")])
    assert errors(src) == [
        (301, "id-7", "duplicate_custom_id",
         "custom_id 'id-7' already appeared on line 8; custom_id must be unique within the file"),
        (302, "id-250", "duplicate_custom_id",
         "custom_id 'id-250' already appeared on line 251; custom_id must be unique within the file"),
    ]  # fmt: skip
    assert [r.custom_id for r in read_input(src) if isinstance(r, Request)] == ids


def test_a_bom_blank_lines_and_a_big_file_keep_their_line_numbers(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    rows = [json.dumps(line(f"c{i}")) for i in range(5000)]
    rows.insert(3000, "")  # a blank line counts
    text = "\ufeff" + "\n".join(rows) + "\n" + json.dumps(line("c0")) + "\n"
    src.write_text(text, encoding="utf-8")
    assert errors(src) == [
        (5002, "c0", "duplicate_custom_id",
         "custom_id 'c0' already appeared on line 1; custom_id must be unique within the file"),
    ]  # fmt: skip


def test_the_table_stays_small(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    write_jsonl(src, [line(f"r{i:07d}") for i in range(20_000)])
    seen = seen_ids.SeenIds(src, lambda raw: None)
    for i in range(20_000):
        assert seen.first(f"r{i:07d}", i + 1) is None
    held = seen.keys.itemsize * len(seen.keys) + seen.lines.itemsize * len(seen.lines)
    assert held / 20_000 <= 12 * 2 * seen_ids.SLACK  # at most one doubling past its load
