#!/usr/bin/env bash
# Set up (idempotently) and run the checks: ruff, mypy, then the test suite on the real engine.
#   bash scripts/test.sh [pytest args...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
PY="${BATCHRUN_VENV:-$ROOT/.venv}/bin/python"
echo "[test] ruff" >&2
"$PY" -m ruff check batchrun tests scripts
"$PY" -m ruff format --check batchrun tests scripts
echo "[test] mypy" >&2
"$PY" -m mypy
echo "[test] pytest" >&2
# Two test processes (pytest-xdist): much of the suite waits on subprocesses, so two share the
# cores well. The real-engine tests stay together in one of them (one xdist group: they share
# session-scoped vLLM jobs, see tests/conftest.py), as do the Ray tests (one local Ray at a time).
"$PY" -m pytest -n "${BATCHRUN_TEST_PROCESSES:-2}" --dist loadgroup "$@"
