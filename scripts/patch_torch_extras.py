"""Make the PyPI (CUDA) torchvision 0.28.0 / torchaudio 2.11.0 wheels importable next to a CPU torch.

Used only by scripts/setup_comfyui.sh for the test ComfyUI (COMFYUI_PLATFORM.md section 8, step 4):
* torchaudio: delete its compiled extensions, so it treats them as "not built" and its pure-torch API
  (resample, MelSpectrogram) keeps working;
* torchvision: register the fake nms/qnms kernels only when its C++ ops were loaded.
Idempotent. Locates the packages without importing them (importing is exactly what fails).
"""
from __future__ import annotations

import importlib.util
import pathlib
import sys

MARK = "# qwen3tts-fast: fake ops only when the C++ ops exist\n"


def package_dir(name: str) -> pathlib.Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"{name} is not installed")
    return pathlib.Path(list(spec.submodule_search_locations)[0])


def patch_torchaudio() -> None:
    for so in (package_dir("torchaudio") / "lib").glob("*.so"):
        so.unlink()
        print(f"removed {so}")


def patch_torchvision() -> None:
    path = package_dir("torchvision") / "_meta_registrations.py"
    src = path.read_text()
    if MARK in src:
        return
    helper = (
        MARK
        + "def _fake_if_ops(name):\n"
        + "    from torchvision.extension import _has_ops\n"
        + "    return torch.library.register_fake(name) if _has_ops() else (lambda fn: fn)\n\n\n"
    )
    count = 0
    for op in ("torchvision::nms", "torchvision::qnms"):
        old = f'@torch.library.register_fake("{op}")'
        if old in src:
            src = src.replace(old, f'@_fake_if_ops("{op}")')
            count += 1
    if count == 0:
        sys.exit(f"{path}: expected register_fake decorators not found; torchvision version changed?")
    # Insert the helper after the imports (before the first decorator that uses it).
    first = src.index('@_fake_if_ops("')
    head = src.rfind("\n\n", 0, first)
    src = src[: head + 2] + helper + src[head + 2:]
    path.write_text(src)
    print(f"patched {path} ({count} decorators)")


if __name__ == "__main__":
    patch_torchaudio()
    patch_torchvision()
