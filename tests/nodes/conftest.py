"""Node tests. `test_unit_*.py` test the pack's pure helpers and always run (torch is the only requirement);
`test_contract.py` loads the pack in-process with a real ComfyUI 0.3.75 (`COMFYUI_DIR`, made by
`scripts/setup_comfyui.sh VENV WORK`) and is skipped without it, with the reason."""
from pathlib import Path

from tests.support._q3support import skip_comfy_tier


def pytest_collection_modifyitems(config, items):
    skip_comfy_tier(items, Path(__file__).resolve().parent)
