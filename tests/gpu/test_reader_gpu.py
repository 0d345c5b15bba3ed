"""The streamed checkpoint reader onto CUDA: pinned staging pieces, copies queued on the stream, casts and
restrides on the device. The loaded tensors must equal the file's values cast on the CPU, however the pieces
fall."""
from __future__ import annotations

import pytest
import torch

from engine.checkpoint import reader
from engine.checkpoint.loader import materialize
from engine.codec.config import CodecConfig
from engine.codec.decoder import CodecDecoder
from engine.config import ModelConfig
from engine.model.talker import Talker

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("piece", [4096, 1 << 20, reader.PIECE_BYTES])
def test_cuda_load_equals_cpu_load(tiny_checkpoints, monkeypatch, piece):
    monkeypatch.setattr(reader, "PIECE_BYTES", piece)
    ck = tiny_checkpoints["custom_voice"]
    cfg = ModelConfig.from_dir(ck)
    codec_cfg = CodecConfig.from_file(ck / "speech_tokenizer" / "config.json")
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    for build, weights, prefix in ((lambda: Talker(cfg.talker), ck / "model.safetensors", "talker."),
                                   (lambda: CodecDecoder(codec_cfg.decoder), ck / "speech_tokenizer" /
                                    "model.safetensors", "decoder.")):
        for dtype in (torch.bfloat16, torch.float32):
            on_gpu = materialize(build, cuda, dtype, weights, prefix)
            on_cpu = materialize(build, cpu, dtype, weights, prefix)
            got, want = on_gpu.state_dict(), on_cpu.state_dict()
            assert got.keys() == want.keys()
            for name, t in want.items():
                g = got[name]
                assert g.device.type == "cuda" and g.dtype == t.dtype and g.stride() == t.stride(), name
                assert torch.equal(g.cpu(), t), name
