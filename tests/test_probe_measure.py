"""The batch-size search measures what each endpoint's work is: generated tokens per second for
generation, prompt tokens per second for a pooling job (embeddings, score, rerank), which generates
none; `tune` and `status` name the unit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import cli
from support.paths import ROOT


@pytest.mark.parametrize(
    ("sample", "unit"),
    [
        ("requests.jsonl", "generated tok/s"),
        ("embeddings.jsonl", "prompt tok/s"),
        ("score.jsonl", "prompt tok/s"),
        ("rerank.jsonl", "prompt tok/s"),
    ],
)
def test_every_probe_has_a_measure_in_the_endpoint_s_unit(
    tmp_path: Path, sample: str, unit: str
) -> None:
    job = tmp_path / "job"
    r = cli("tune", str(ROOT / "sample_data" / sample), "--job-dir", str(job), "--engine", "echo")
    assert r.returncode == 0, r.stderr
    probes = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)["probes"]
    assert probes and all(p["ok"] for p in probes)
    for probe in probes:
        assert probe["unit"] == unit and probe["tokens_per_s"] > 0, probe
        assert f"probe size {probe['size']}: " in r.stderr
    assert f" {unit} on " in r.stderr
    # The probe table names the unit in its header, in tune's output and status'.
    assert unit in r.stdout
    assert unit in cli("status", "--job-dir", str(job)).stdout
