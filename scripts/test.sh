#!/usr/bin/env bash
# Set up (idempotently) and run the checks: ruff, mypy, then the test suite on the real engine.
#   bash scripts/test.sh [pytest args...]          everything (what CI runs: .ci/run)
#   bash scripts/test.sh --fast [pytest args...]   the fast tier: set-up and ruff, no mypy, and
#     the tests marked neither vllm, ray nor slow (docs/development.md, "Test tiers")
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
FAST=()
if [[ "${1:-}" == "--fast" ]]; then
  shift
  FAST=(-m "not vllm and not ray and not slow")
fi
bash scripts/setup.sh
PY="${BATCHRUN_VENV:-$ROOT/.venv}/bin/python"
echo "[test] ruff" >&2
"$PY" -m ruff check batchrun tests scripts
"$PY" -m ruff format --check batchrun tests scripts
if [[ ${#FAST[@]} -eq 0 ]]; then
  echo "[test] mypy" >&2
  "$PY" -m mypy
fi
echo "[test] pytest" >&2
# batchrun's own modules compiled to bytecode once, here: the suite starts some 1,400 Python
# processes, and where PYTHONDONTWRITEBYTECODE is set (as on this project's machines) each one compiled
# the ~110 modules it imports from source, 0.05-0.1 CPU-s apiece (`status` 0.21 -> 0.16 CPU-s).
# compileall writes the files whatever that variable says, and skips those already current.
"$PY" -m compileall -q batchrun tests scripts >/dev/null
# Three test processes (pytest-xdist) on any machine: part of the suite waits on timeouts and
# subprocesses, and a third process fills that time (on 2 cores the machine was busy 94% of the
# run against 84% with two, and the suite took 9:21 against 10:07). The tests of each shared
# real-engine job stay in one process (xdist groups: they share session-scoped vLLM jobs, see
# tests/conftest.py), as do the Ray tests (one local Ray at a time).
"$PY" -m pytest -n "${BATCHRUN_TEST_PROCESSES:-3}" --dist loadgroup ${FAST[@]+"${FAST[@]}"} "$@"
