#!/usr/bin/env bash
# The main job, end to end: set up the runtime environment and synthesise speech to out/demo.wav.
# Without a model directory a tiny RANDOM-weight checkpoint is generated: its audio is noise.
#   bash scripts/demo.sh [path/to/Qwen3-TTS-12Hz-checkpoint] [extra `python -m engine synth` flags]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
mkdir -p out
args=()
if [ $# -gt 0 ] && [ -d "$1" ]; then args+=(--model "$1"); shift; fi
.venv/bin/python -m engine synth "${args[@]}" --takes 2 --out out/demo.wav "$@"
ls -l out/demo*.wav
