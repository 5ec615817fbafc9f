#!/usr/bin/env bash
# One command on a GPU machine (<= 8 minutes on one H100/H200): MFU, tokens/s per GPU and peak
# memory of the llama3-1b preset in bf16, eager / compile / compile + selective AC, and the async
# checkpoint stall. Uses the python that has a CUDA torch, or installs TORCH_SPEC into .venv-gpu
# up front; installs trainops only when that python cannot import it already (GPU machines are
# often offline: carry trainops and pydantic as wheels there). Nothing is downloaded while
# measuring. Results: benchmarks/gpu-results/ (or $OUT). Arguments go to gpu_mfu.py.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  "$PY" -m venv .venv-gpu
  .venv-gpu/bin/pip install --quiet "${TORCH_SPEC:-torch==2.13.0}"
  PY=$ROOT/.venv-gpu/bin/python
fi
export TRAINOPS_HOME=${TRAINOPS_HOME:-$(mktemp -d)}
mkdir -p "$TRAINOPS_HOME"
# Run from TRAINOPS_HOME: in the checkout, its trainops/ folder would shadow an installed wheel's
# trainops package (python puts the working directory first on the path of `-c` and `-m`).
cd "$TRAINOPS_HOME"
if ! "$PY" -c "import trainops.trainer.train, trainops.benchmarks.harness" 2>/dev/null; then
  (cd "$ROOT" && "$PY" -m pip install --quiet -e .)
fi
"$PY" "$ROOT/benchmarks/gpu_mfu.py" --out "${OUT:-$ROOT/benchmarks/gpu-results}" "$@"
