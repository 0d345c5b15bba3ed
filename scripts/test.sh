#!/usr/bin/env bash
# Set up .venv with everything (the official qwen-tts oracle, a headless ComfyUI 0.3.75 and Debian's
# chromium included) and run all tests. GPU tests (tests/gpu) are skipped without CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/setup_env.sh --full
if ! command -v chromium >/dev/null 2>&1 && [ -z "${CHROMIUM:-}" ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "warning: could not install chromium; the browser test will fail"
fi
echo "setup took $(( $(date +%s) - start )) s"
export COMFYUI_DIR="$PWD/.cache/comfyui/ComfyUI" QWEN3TTS_STRICT_TESTS=1
set +e
# One thread a process: the tiny models gain nothing from more, and two runs share the cores without spinning.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# Triton kernels under the interpreter need TRITON_INTERPRET=1 for their whole process: a run of their own, beside
# the main suite (each keeps one core busy); its output is printed when it ends.
kernel_log=$(mktemp)
TRITON_INTERPRET=1 .venv/bin/python -m pytest -q -p no:cacheprovider tests/kernels/test_kernels.py > "$kernel_log" 2>&1 &
kernel_pid=$!
# Every kernel compiled for sm_90 again with the device image's Triton (scripts/device_triton.sh): a radix
# search in the sampler compiled with the venv's Triton and failed in 3.6's layout pass on the GPU.
source scripts/device_triton.sh
tdev=(env PYTHONPATH="$PWD/$DEVICE_TRITON_DIR:$PWD" .venv/bin/python)
"${tdev[@]}" -c "import triton, sys; sys.exit(triton.__version__ != '$DEVICE_TRITON')" \
  && "${tdev[@]}" -m pytest -q tests/kernels/test_kernel_compile.py
rc_compile_dev=$?
.venv/bin/python -m pytest -q -rs tests --ignore=tests/kernels/test_kernels.py "$@"
rc=$?
wait "$kernel_pid"
rc_kernels=$?
echo "kernel tests under the interpreter:"; tail -n 25 "$kernel_log"; rm -f "$kernel_log"
# Mixed-prompt batch rows must never be slower than the same pieces one by one (tiny checkpoint, CPU;
# fastest of 3 alternating runs per mode, so a busy CI machine's noise cannot decide it).
.venv/bin/python bench/batch_bench.py --device cpu --size tiny --words 150 --lines 8 --repeats 3 --out "$(mktemp -d)"
rc_batch=$?
set -e
[ $rc_batch -ne 0 ] && { echo "batch bench failed (exit $rc_batch)"; [ $rc -eq 0 ] && rc=$rc_batch; }
[ $rc_kernels -ne 0 ] && { echo "kernel tests failed (exit $rc_kernels)"; [ $rc -eq 0 ] && rc=$rc_kernels; }
[ $rc_compile_dev -ne 0 ] && { echo "the compile check with Triton $DEVICE_TRITON failed (exit $rc_compile_dev)"; \
  [ $rc -eq 0 ] && rc=1; }
echo "tests took $(( $(date +%s) - start )) s in all (setup included)"
[ $rc -eq 5 ] && { echo "no tests were collected"; exit 1; }
exit $rc
