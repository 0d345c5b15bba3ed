"""Shared test setup: marker handling, the parity oracle, tiny random checkpoints built once per run, and the
reliability figures (the `figure` fixture) printed together at the end of the run."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False,
                     help="also run tests marked slow (or set RUN_SLOW=1)")


def pytest_collection_modifyitems(config, items):
    if not (config.getoption("--runslow") or os.environ.get("RUN_SLOW") == "1"):
        skip_slow = pytest.mark.skip(reason="slow: pass --runslow (or RUN_SLOW=1) to run")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip_slow)
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def qwen_tts():
    """The official qwen-tts package, the parity oracle (skipped when missing; a failure under
    QWEN3TTS_STRICT_TESTS=1, as in CI)."""
    from tests.support.oracle import require_qwen_tts

    return require_qwen_tts()


@pytest.fixture(scope="session")
def talker_oracle(qwen_tts):
    """(modeling_qwen3_tts, Qwen3TTSConfig) of the official package."""
    from qwen_tts.core.models import modeling_qwen3_tts as m
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig

    return m, Qwen3TTSConfig


def _official_builder(main_cfg: dict, codec_cfg: dict):
    """Meta-device modules from the official qwen-tts classes (same state-dict names as ours). Test-only."""
    from engine.checkpoint.writer import CODEC_WEIGHTS, MAIN_WEIGHTS
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2Config,
    )
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2Model,
    )

    return {MAIN_WEIGHTS: [("", Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**main_cfg)))],
            CODEC_WEIGHTS: [("", Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(**codec_cfg)))]}


@pytest.fixture(scope="session")
def official_builder(qwen_tts):
    """A writer builder using the official qwen-tts classes (test-only)."""
    return _official_builder


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> dict[str, Path]:
    """{model_type: Path} of tiny random-weight checkpoints (seed 0, EOS off), written once per session from our
    own modules (tests compare them with the official classes)."""
    from engine.checkpoint.presets import MODEL_TYPES
    from engine.checkpoint.writer import write_random_checkpoint

    root = tmp_path_factory.mktemp("tiny_ckpt")
    return {mt: write_random_checkpoint(root / mt, "tiny", mt, seed=0)
            for mt in MODEL_TYPES}


@pytest.fixture(scope="session")
def eos_checkpoint(tmp_path_factory) -> Path:
    """A tiny CustomVoice checkpoint whose EOS row is live and scaled up (x4), so EOS comes early."""
    from engine.checkpoint.writer import write_random_checkpoint

    root = tmp_path_factory.mktemp("tiny_eos")
    return write_random_checkpoint(root / "custom_voice", "tiny", "custom_voice", seed=0, eos=True, eos_scale=4.0)


@pytest.fixture(scope="session")
def eos_base_checkpoint(tmp_path_factory) -> Path:
    """A tiny Base checkpoint with the same live, scaled-up EOS row."""
    from engine.checkpoint.writer import write_random_checkpoint

    root = tmp_path_factory.mktemp("tiny_eos_base")
    return write_random_checkpoint(root / "base", "tiny", "base", seed=0, eos=True, eos_scale=4.0)


_FIGURES: list[tuple[str, dict]] = []


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny checkpoints are overhead-bound: one intra-op thread is as fast and keeps these long runs from
    oversubscribing a busy 2-core CI machine (measured: the interrupt test took 13 s CPU with one thread,
    193 s with two on a loaded machine). Autouse in tests/robustness."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture
def figure(request):
    """figure(**values): record (and print) this test's measured figures (docs/RELIABILITY.md); they are
    printed together at the end of the run (also without -s), so CI logs always show them."""
    def record(**values):
        _FIGURES.append((request.node.nodeid.split("::", 1)[-1], values))
        print(json.dumps(values, default=str))
    return record


def pytest_terminal_summary(terminalreporter):
    if not _FIGURES:
        return
    terminalreporter.section("reliability figures")
    for name, values in _FIGURES:
        terminalreporter.write_line(f"{name}: {json.dumps(values, default=str)}")
