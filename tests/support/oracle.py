"""Import the official `qwen-tts` 0.1.1 package as a test-only parity oracle.

`import qwen_tts` pulls in the unused 25 Hz tokenizer, which imports sox, onnxruntime and torchaudio
at module level. None of them is used by the 12 Hz models, so, only while importing, missing ones are
replaced by stand-ins that raise if anything is ever called on them; afterwards the stand-ins are
removed again so availability probes still see "not installed".
"""
from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types

_STANDINS = ("sox", "onnxruntime", "torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi")


class _Unusable(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(f"stand-in module {self.__name__} was used ({name}); the oracle should never need it")


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
        return True
    except Exception:  # a broken install (e.g. torchaudio without its CUDA libs) counts as missing
        sys.modules.pop(name, None)
        return False


def require_qwen_tts():
    """The oracle for a test: skipped when it is not installed, except under QWEN3TTS_STRICT_TESTS=1 (CI),
    where a missing oracle fails the test instead of hiding a parity check."""
    import os

    import pytest

    try:
        return import_qwen_tts()
    except ImportError as exc:
        if os.environ.get("QWEN3TTS_STRICT_TESTS") == "1":
            pytest.fail(f"QWEN3TTS_STRICT_TESTS=1 but the qwen-tts oracle cannot be imported: {exc}")
        pytest.skip(f"official qwen-tts not installed: {exc}")


def import_qwen_tts():
    """Return the `qwen_tts` module, or raise ImportError if the oracle is not installed."""
    if "qwen_tts" in sys.modules:
        return sys.modules["qwen_tts"]
    import torch  # noqa: F401  (must come before the stand-ins)
    import transformers  # noqa: F401

    added = []
    for name in _STANDINS:
        root = name.split(".")[0]
        if name == root and _importable(name):
            continue
        if name != root and root not in added:
            continue
        mod = _Unusable(name)
        mod.__path__ = []  # behave as a package so submodule imports resolve
        mod.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
        sys.modules[name] = mod
        added.append(name)
        if "." in name:
            parent, child = name.rsplit(".", 1)
            types.ModuleType.__setattr__(sys.modules[parent], child, mod)
    try:
        import qwen_tts
    finally:
        for name in added:
            sys.modules.pop(name, None)
    return qwen_tts
