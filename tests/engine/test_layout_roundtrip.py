"""The on-disk layout matches upstream in the other direction too: a checkpoint that the official
qwen-tts 0.1.1 saves (save_pretrained of its model, codec and processor) loads in our engine and
produces the same greedy codes as the checkpoint it was loaded from."""
import shutil

import torch

from engine import Engine, Request


def test_checkpoint_saved_by_qwen_tts_loads_in_our_engine(tiny_checkpoints, tmp_path, monkeypatch, qwen_tts):
    from transformers import PretrainedConfig

    # transformers 4.57.3 cannot diff these nested configs (KeyError 'dtype' in to_diff_dict): save them whole
    monkeypatch.setattr(PretrainedConfig, "to_diff_dict", PretrainedConfig.to_dict)
    src = tiny_checkpoints["custom_voice"]
    official = qwen_tts.Qwen3TTSModel.from_pretrained(str(src), device_map="cpu", dtype=torch.float32)
    out = tmp_path / "saved_by_qwen_tts"
    official.model.save_pretrained(str(out))
    official.processor.save_pretrained(str(out))
    official.model.speech_tokenizer.model.save_pretrained(str(out / "speech_tokenizer"))
    for name in ("preprocessor_config.json", "generation_config.json"):  # written by neither save call
        if not (out / name).is_file():
            shutil.copy(src / name, out / name)
    shutil.copy(src / "speech_tokenizer" / "preprocessor_config.json", out / "speech_tokenizer")

    req = Request(mode="custom", text="Saved by the official package.", language="English", speaker="ryan")
    mine = Engine.load(src, device="cpu", dtype="fp32")
    theirs = Engine.load(out, device="cpu", dtype="fp32")
    params = mine.defaults.greedy().replace(max_new_tokens=8)
    a, b = mine.generate(req, params=params), theirs.generate(req, params=params)
    assert torch.equal(a.codes[0], b.codes[0])
    assert torch.allclose(a.audio, b.audio, atol=1e-6)
