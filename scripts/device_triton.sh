# The GPU image's Triton (torch 2.11's). scripts/setup_env.sh --full installs it beside the venv's, in
# DEVICE_TRITON_DIR; scripts/test.sh compiles every kernel for sm_90 with it a second time, because its passes
# reject some kernels the venv's newer Triton builds. Sourced, not run.
DEVICE_TRITON=3.6.0
DEVICE_TRITON_DIR=.cache/triton-$DEVICE_TRITON
