#!/usr/bin/env bash
# Everything in batchrun that needs a real GPU and PyTorch only, in one command (docs/gpu.md):
#   bash scripts/gpu_check.sh [--no-gpu]
# nvidia-smi parsed by batchrun (`batchrun doctor --json`), NVML readings, CUDA_VISIBLE_DEVICES,
# real CUDA out-of-memory errors through batchrun's real workers and restart policy, a stuck rank's
# GPU memory after its worker stops, and the sample job when vLLM is importable. Without a GPU it
# checks what it can on the CPU and names what it skipped. Exit 0 when nothing failed.
#
# Python: $BATCHRUN_PYTHON, else this checkout's .venv, else python3. batchrun itself comes from
# this checkout (PYTHONPATH), installed or not. Its core needs msgspec; a GPU machine with PyTorch
# alone may lack it: then the missing ones come from
# $BATCHRUN_WHEELHOUSE (wheels downloaded elsewhere: nothing is fetched from the network here),
# installed into a folder put on PYTHONPATH.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${BATCHRUN_PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"; else PY="$(command -v python3)"; fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# The CLI's (doctor) and the core's packages: what `pip install -e .` would bring, less the heavy ones.
NEEDED=(msgspec typer rich tqdm psutil)
missing=()
for module in "${NEEDED[@]}"; do
  "$PY" -c "import $module" 2>/dev/null || missing+=("$module")
done
if ((${#missing[@]})); then
  if [[ -n "${BATCHRUN_WHEELHOUSE:-}" ]]; then
    # A folder on PYTHONPATH, not a venv: a venv made from a Python that is itself a venv's (as
    # PyTorch images ship it) sees the base interpreter's packages, not that venv's torch.
    SITE="${TMPDIR:-/tmp}/batchrun-gpu-check-site"
    echo "[gpu_check] ${missing[*]} missing: installing them from $BATCHRUN_WHEELHOUSE into $SITE" >&2
    # typer as pyproject.toml pins it: the CLI's help and messages are those of typer 0.28.
    specs=("${missing[@]/#typer/typer>=0.28,<0.29}")
    "$PY" -m pip install -q --no-index --no-compile --upgrade --target "$SITE" \
      --find-links "$BATCHRUN_WHEELHOUSE" "${specs[@]}" &&
      export PYTHONPATH="$PYTHONPATH:$SITE"
  fi
  if ! "$PY" -c "import msgspec" 2>/dev/null; then
    # The checks that need PyTorch alone still run; those that need batchrun say they skipped.
    echo "[gpu_check] batchrun's core needs msgspec, which $PY cannot import: set BATCHRUN_WHEELHOUSE" >&2
    echo "[gpu_check] to a folder of wheels (pip download msgspec 'typer>=0.28,<0.29' rich tqdm psutil -d DIR)" >&2
  fi
fi
exec "$PY" scripts/gpu_check.py "$@"
