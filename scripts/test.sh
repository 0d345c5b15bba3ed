#!/usr/bin/env bash
# Set up .venv with everything (the official qwen-tts oracle and a headless ComfyUI included) and run
# all CPU tests. GPU tests (tests/gpu) are skipped without CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/setup_env.sh --full
echo "setup took $(( $(date +%s) - start )) s"
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider tests "$@"
rc=$?
set -e
echo "tests took $(( $(date +%s) - start )) s in all"
[ $rc -eq 5 ] && { echo "no tests were collected"; exit 1; }
exit $rc
