#!/usr/bin/env bash
# Install the newest ComfyUI frontend that the package index serves, beside ComfyUI 0.3.75's own (idempotent).
#
#   scripts/setup_frontend_newest.sh VENV_DIR WORK_DIR
#
# The newest `comfyui-frontend-package` and `comfyui-workflow-templates` (with the template bundles it pins)
# go into WORK_DIR/frontend-newest as a pip --target folder; the venv keeps the versions 0.3.75 pins.
# scripts/setup_env.sh --full runs it; the browser tests start a second ComfyUI 0.3.75 on it
# (scripts/comfy_client.py start_comfy(frontend=...)):
#   --front-end-root WORK_DIR/frontend-newest/comfyui_frontend_package/static   (the frontend)
#   PYTHONPATH=WORK_DIR/frontend-newest                                          (the templates the backend serves)
# WORK_DIR/frontend-newest/VERSIONS names what was installed; a later run reinstalls only when the index
# serves something newer. docs/COMPATIBILITY.md says which versions were tested.
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 VENV_DIR WORK_DIR" >&2
  exit 2
fi
PY="$(realpath -m "$1")/bin/python"
DEST="$(realpath -m "$2")/frontend-newest"
PIP=("$PY" -m pip --disable-pip-version-check)
T0=$(date +%s)
log() { echo "[setup_frontend_newest $(( $(date +%s) - T0 ))s] $*"; }

# 1. Which versions are newest: a metadata-only dry run (no wheel is downloaded).
if ! wanted=$("${PIP[@]}" install -q --dry-run --ignore-installed --no-deps --report - \
      comfyui-frontend-package comfyui-workflow-templates 2>/dev/null | "$PY" -c '
import json, sys
print(" ".join(sorted(i["metadata"]["name"].replace("_", "-").lower() + "==" + i["metadata"]["version"]
                      for i in json.load(sys.stdin)["install"])))'); then
  if [ -f "$DEST/VERSIONS" ]; then
    echo "WARNING: the package index did not answer; the browser tests use the cached newest frontend: $(cat "$DEST/VERSIONS")" >&2
    exit 0
  fi
  echo "could not resolve the newest comfyui-frontend-package / comfyui-workflow-templates" >&2
  exit 1
fi

# 2. Install them (templates with the bundles they pin) unless that is what the folder already holds.
if [ "$(cat "$DEST/VERSIONS" 2>/dev/null || true)" != "$wanted" ]; then
  log "installing $wanted into $DEST"
  rm -rf "$DEST.tmp"
  # shellcheck disable=SC2086
  "${PIP[@]}" install -q --no-compile --target "$DEST.tmp" $wanted
  echo "$wanted" > "$DEST.tmp/VERSIONS"
  rm -rf "$DEST"
  mv "$DEST.tmp" "$DEST"
fi
[ -f "$DEST/comfyui_frontend_package/static/index.html" ] || { echo "no frontend in $DEST" >&2; exit 1; }
log "newest frontend ready: $(cat "$DEST/VERSIONS")"
