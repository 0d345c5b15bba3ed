#!/usr/bin/env bash
# Create (or reuse) the project virtual environment.
#   scripts/setup_env.sh          runtime only: torch, numpy, safetensors, tokenizers
#   scripts/setup_env.sh --full   everything the tests need: pytest, ruff, hypothesis, the official
#                                 qwen-tts 0.1.1 as a test-only parity oracle, a headless ComfyUI 0.3.75 and the newest
#                                 ComfyUI frontend beside its own (browser tests)
# VENV (default .venv), PYTHON (default python3) and TORCH_SPEC (default torch==2.13.0) can be overridden.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
full=0
[ "${1:-}" = "--full" ] && full=1

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
py="$VENV/bin/python"
pip() { "$py" -m pip install -q --disable-pip-version-check "$@"; }

stamp="$VENV/.qwen3tts-setup-$full-$(cat scripts/setup_env.sh requirements.txt | cksum | cut -d' ' -f1)"
if [ ! -f "$stamp" ]; then
  "$py" -c "import torch" 2>/dev/null || pip "${TORCH_SPEC:-torch==2.13.0}"
  pip -r requirements.txt
  if [ "$full" = 1 ]; then
    pip pytest ruff hypothesis
    pip "ray[serve]==2.60.0"  # serve --ray's tests start a local Ray cluster (the extra "ray" in pyproject.toml)
    pip --no-deps triton==3.9.0  # the kernel tests run it through its interpreter on CPU
    # The oracle: never let pip resolve qwen-tts' own requirements (gradio, torchaudio, a CUDA torch...).
    # Its model code's requirements go in first: pip checks the requirements of every installed package that
    # depends on what it installs, so installing them after qwen-tts would print its resolver ERROR block.
    pip transformers==4.57.3 accelerate==1.12.0 einops soundfile librosa
    pip --no-deps qwen-tts==0.1.1
    echo "note: qwen-tts 0.1.1 (the tests' parity oracle) is installed without its demo app's requirements" \
      "(gradio, onnxruntime, sox); if pip later prints \"ERROR: pip's dependency resolver ...\" naming them," \
      "that is expected and harmless: nothing here uses them."
  fi
  touch "$stamp"
fi
if [ "$full" = 1 ]; then
  # The device image's Triton, beside the venv's, for a second compile check of the kernels (scripts/test.sh).
  source scripts/device_triton.sh
  [ -d "$DEVICE_TRITON_DIR/triton" ] || "$py" -m pip install -q --disable-pip-version-check --no-deps \
    --target "$DEVICE_TRITON_DIR" "triton==$DEVICE_TRITON" \
    || echo "WARNING: Triton $DEVICE_TRITON could not be installed; its compile check fails under CI" >&2
  bash scripts/setup_comfyui.sh "$VENV" .cache/comfyui
  # The newest frontend beside 0.3.75's own, for the browser test matrix (not needed by scripts/demo.sh).
  bash scripts/setup_frontend_newest.sh "$VENV" .cache/comfyui \
    || echo "WARNING: the newest ComfyUI frontend could not be installed; its browser tests fail under CI" >&2
fi
