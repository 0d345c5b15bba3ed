"""SaveVoice writes through a fresh temporary file: a failed save leaves nothing behind, a link planted at a
temporary-looking name is never followed, and an existing voice is only replaced by a complete file."""
from __future__ import annotations

import importlib
import os

import pytest
import torch

from engine import Voice
from tests.support import comfy_inproc
from tests.support._q3support import need


@pytest.fixture(scope="module")
def node_voice():
    need(comfy_inproc.comfy_missing())
    with comfy_inproc.engine_cache():  # ComfyUI's modules and the pack alias
        yield importlib.import_module(f"{comfy_inproc.ALIAS}.nodes.node_voice")


@pytest.fixture
def save_voice(node_voice, tmp_path, monkeypatch):
    voices = tmp_path / "voices"
    monkeypatch.setattr(node_voice.comfy_paths, "voice_save_dir", lambda: str(voices))
    return node_voice.SaveVoice, voices


class _FailingVoice:
    """Writes half a file, then fails like a full disk."""

    def save(self, path):
        with open(path, "wb") as f:
            f.write(b"\0" * 100)
        raise OSError(28, "No space left on device")


def test_failed_save_leaves_no_file_and_keeps_the_old_voice(save_voice):
    node, voices = save_voice
    good = Voice(spk_embedding=torch.randn(32), model_size="0b6")
    node.execute(good, "keep", True)
    before = (voices / "keep.safetensors").read_bytes()
    with pytest.raises(RuntimeError, match="SaveVoice: could not write .*No space left"):  # a node message
        node.execute(_FailingVoice(), "keep", True)
    assert sorted(os.listdir(voices)) == ["keep.safetensors"]
    assert (voices / "keep.safetensors").read_bytes() == before


def test_a_planted_link_is_not_followed(save_voice, tmp_path):
    node, voices = save_voice
    voices.mkdir()
    target = tmp_path / "outside"
    os.symlink(target, voices / "v.safetensors.tmp")
    node.execute(Voice(spk_embedding=torch.randn(32), model_size="0b6"), "v", True)
    assert not target.exists()
    assert Voice.load(voices / "v.safetensors").width == 32
