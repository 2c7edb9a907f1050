#!/usr/bin/env bash
# Set up (idempotently), run the sample job on the embedded default model, export, show answers.
#   bash scripts/run_sample.sh [job dir, default jobs/sample]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
BIN="${BATCHRUN_VENV:-$ROOT/.venv}/bin"
JOB="${1:-jobs/sample}"
if [[ -f "$JOB/manifest.json" ]]; then
  "$BIN/batchrun" resume --job-dir "$JOB"
else
  "$BIN/batchrun" submit sample_data/requests.jsonl --job-dir "$JOB"
fi
"$BIN/batchrun" export --job-dir "$JOB"
"$BIN/batchrun" export --job-dir "$JOB" --parquet
echo
echo "First answers ($JOB/output.jsonl):"
"$BIN/python" - "$JOB/output.jsonl" <<'PY'
import json, sys
inputs = {}
with open("sample_data/requests.jsonl") as f:
    for line in f:
        r = json.loads(line)
        inputs[r["custom_id"]] = r["body"]["messages"][-1]["content"]
with open(sys.argv[1]) as f:
    for line in list(f)[:5]:
        o = json.loads(line)
        answer = o["response"]["body"]["choices"][0]["message"]["content"].strip().replace("\n", " ")
        print(f"  {o['custom_id']}: {inputs[o['custom_id']]!r} -> {answer[:100]!r}")
PY
