"""Random-weight checkpoints: writer layout, loading in the official qwen-tts, init roles, determinism, reader errors."""
from __future__ import annotations

import json
import logging
import re
import shutil
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from engine.checkpoint import presets, random_init, writer
from engine.checkpoint.reader import REQUIRED_FILES, check_layout, load_state_dict_into
from engine.errors import CheckpointError

LOAD_PROBLEMS = re.compile(r"not initialized|were not used|newly initialized|missing|unexpected|mismatch", re.IGNORECASE)


def _official():
    from tests.support.oracle import require_qwen_tts

    return require_qwen_tts()


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _load_official(path: Path):
    """Qwen3TTSModel.from_pretrained with every transformers log record captured."""
    qwen_tts = _official()
    handler = _Capture()
    log = logging.getLogger("transformers")
    old = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        model = qwen_tts.Qwen3TTSModel.from_pretrained(str(path), device_map="cpu", dtype=torch.float32)
    finally:
        log.removeHandler(handler)
        log.setLevel(old)
    return model, [m for m in handler.messages if LOAD_PROBLEMS.search(m)]


def _loading_info(path: Path) -> dict:
    """Structured loading info of the main model and the codec, straight from transformers."""
    _official()
    from qwen_tts.core.models import Qwen3TTSForConditionalGeneration
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2Model,
    )
    from transformers import PreTrainedModel

    # The subclass' from_pretrained also loads the codec and cannot return loading info: call the base one.
    _, main = PreTrainedModel.from_pretrained.__func__(Qwen3TTSForConditionalGeneration, str(path),
                                                       output_loading_info=True, dtype=torch.float32)
    _, codec = Qwen3TTSTokenizerV2Model.from_pretrained(str(path / "speech_tokenizer"), output_loading_info=True,
                                                        dtype=torch.float32)
    return {"main": main, "codec": codec}


# --------------------------------------------------------------------------------------------------
# The writer's output loads in the official package
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model_type", presets.MODEL_TYPES)
def test_tiny_checkpoint_loads_in_official(model_type, tiny_checkpoints):
    path = tiny_checkpoints[model_type]
    model, problems = _load_official(path)
    assert problems == [], problems
    for part, info in _loading_info(path).items():
        for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
            assert not info.get(kind), (part, kind, info[kind])
    # the loaded values are the file's values (nothing re-initialised after loading)
    sd = load_file(str(path / "model.safetensors"))
    official = model.model.state_dict()
    assert set(sd) == set(official)
    for k, v in sd.items():
        assert torch.equal(official[k], v), k
    codec = load_file(str(path / "speech_tokenizer" / "model.safetensors"))
    official_codec = model.model.speech_tokenizer.model.state_dict()
    assert set(codec) == set(official_codec)
    for k, v in codec.items():
        assert torch.equal(official_codec[k], v), k
    assert (model.model.speaker_encoder is not None) == (model_type == "base")
    assert model.model.talker.codec_head.weight[2150].abs().sum() == 0  # EOS off by default


def test_capture_detects_missing_key(tiny_checkpoints, tmp_path):
    """Negative control: the log capture of the load test does see a missing tensor."""
    path = tmp_path / "ck"
    shutil.copytree(tiny_checkpoints["custom_voice"], path)
    sd = load_file(str(path / "model.safetensors"))
    del sd["talker.model.norm.weight"]
    save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
    _, problems = _load_official(path)
    assert any("talker.model.norm.weight" in p for p in problems), problems


def test_layout_and_manifest(tiny_checkpoints):
    for model_type, path in tiny_checkpoints.items():
        check_layout(path)
        for rel in REQUIRED_FILES + ("speech_tokenizer/configuration.json", writer.MANIFEST):
            assert (path / rel).is_file(), rel
        manifest = json.loads((path / writer.MANIFEST).read_text())
        assert manifest["random_weights"] is True and manifest["model_type"] == model_type
        assert json.loads((path / "config.json").read_text()) == presets.main_config("tiny", model_type)
        assert json.loads((path / "preprocessor_config.json").read_text())["processor_class"] == "Qwen3TTSProcessor"
        fe = json.loads((path / "speech_tokenizer" / "preprocessor_config.json").read_text())
        assert fe["feature_extractor_type"] == "EncodecFeatureExtractor" and fe["sampling_rate"] == 24000
        with safe_open(str(path / "model.safetensors"), "pt") as f:
            assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}  # noqa: SIM118
        with safe_open(str(path / "speech_tokenizer" / "model.safetensors"), "pt") as f:
            assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}  # noqa: SIM118


def test_determinism_and_switches(tmp_path):
    a = writer.write_random_checkpoint(tmp_path / "a", "tiny", "base", seed=3)
    b = writer.write_random_checkpoint(tmp_path / "b", "tiny", "base", seed=3)
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for rel in files:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    c = writer.write_random_checkpoint(tmp_path / "c", "tiny", "base", seed=4, eos=True, dtype="bf16")
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    sd = load_file(str(c / "model.safetensors"))
    assert {v.dtype for v in sd.values()} == {torch.bfloat16}
    assert sd["talker.codec_head.weight"][2150].abs().sum() > 0  # eos=True leaves the row random
    assert {v.dtype for v in load_file(str(c / writer.CODEC_WEIGHTS)).values()} == {torch.float32}


def test_engine_and_official_builders_agree(tmp_path, official_builder):
    """Our modules and the official ones give the same names, shapes, roles, hence identical bytes."""
    for model_type in ("base", "custom_voice"):
        ours = writer.write_random_checkpoint(tmp_path / f"o_{model_type}", "tiny", model_type)
        theirs = writer.write_random_checkpoint(tmp_path / f"t_{model_type}", "tiny", model_type,
                                                builder=official_builder)
        for rel in (writer.MAIN_WEIGHTS, writer.CODEC_WEIGHTS):
            assert (ours / rel).read_bytes() == (theirs / rel).read_bytes(), (model_type, rel)
    for size, model_type in (("0.6b", "base"), ("1.7b", "voice_design")):
        mc, cc = presets.main_config(size, model_type), presets.codec_config(size)
        with torch.device("meta"):
            shapes = [{rel: {p + k: tuple(v.shape) for p, m in parts for k, v in m.state_dict().items()}
                       for rel, parts in build(mc, cc).items()}
                      for build in (writer.build_engine_modules, official_builder)]
        assert shapes[0] == shapes[1], (size, model_type)


# --------------------------------------------------------------------------------------------------
# Init roles
# --------------------------------------------------------------------------------------------------
def _official_modules(official_builder, size: str, model_type: str, device: str = "meta"):
    with torch.device(device):
        files = official_builder(presets.main_config(size, model_type), presets.codec_config(size))
    return [m for parts in files.values() for _, m in parts]


@pytest.mark.parametrize("size", ["tiny", "1.7b"])
def test_every_official_tensor_has_a_role(size, official_builder):
    for model_type in presets.MODEL_TYPES:
        for module in _official_modules(official_builder, size, model_type):
            for full, _local, t, owner in random_init.state_entries(module):
                random_init.tensor_role(full, tuple(t.shape), owner)  # raises if no rule


def test_init_module_roles(official_builder):
    main, codec = _official_modules(official_builder, "tiny", "base", device="cpu")
    inv_freq = main.talker.model.rotary_emb.inv_freq.clone()
    random_init.init_module(main, 0)
    random_init.init_module(codec, 0)
    sd = {**main.state_dict(), **codec.state_dict()}
    expect_const = {
        r"norm\.weight$|layernorm\.weight$": 1.0, r"\.bias$": 0.0, r"layer_scale\.scale$": 0.01,
        r"\.gamma$": 1e-6, r"\.(alpha|beta)$": 0.0, r"cluster_usage$|initialized$": 1.0,
    }
    for name, value in sd.items():
        for pattern, const in expect_const.items():
            if re.search(pattern, name):
                assert torch.all(value == const), name
                break
    emb = sd["talker.model.text_embedding.weight"]
    assert abs(emb.std().item() - 1.0) < 0.05
    w = sd["talker.model.layers.0.mlp.down_proj.weight"]  # [32, 64]: std 1/8
    assert abs(w.std().item() - 64 ** -0.5) < 0.02
    conv = sd["speaker_encoder.blocks.0.conv.weight"]  # [16, 128, 5]: fan_in 640
    assert abs(conv.std().item() - 640 ** -0.5) < 0.004
    final = random_init.final_codec_conv(sd)
    assert final == "decoder.decoder.6.conv.weight"
    fan_in = sd[final].shape[1] * sd[final].shape[2]
    assert abs(sd[final].std().item() / fan_in ** -0.5 - random_init.FINAL_CONV_SCALE) < 0.5
    block = sd["decoder.decoder.1.block.2.conv1.conv.weight"]  # waveform-stack convs are halved
    fan_in = block.shape[1] * block.shape[2]
    assert abs(block.std().item() / fan_in ** -0.5 - random_init.WAVEFORM_CONV_SCALE) < 0.1
    # non-persistent buffers (computed tables) are left alone
    assert torch.equal(main.talker.model.rotary_emb.inv_freq, inv_freq)


def test_values_depend_only_on_seed_and_name():
    a = random_init.init_tensor("x.weight", (8, 4), nn.Linear(4, 8), 0)
    b = random_init.init_tensor("x.weight", (8, 4), nn.Linear(4, 8), 0)
    c = random_init.init_tensor("y.weight", (8, 4), nn.Linear(4, 8), 0)
    d = random_init.init_tensor("x.weight", (8, 4), nn.Linear(4, 8), 1)
    assert torch.equal(a, b) and not torch.equal(a, c) and not torch.equal(a, d)
    with pytest.raises(ValueError, match="no random-init rule"):
        random_init.tensor_role("x.weird", (3,), nn.Module())


def test_init_module_matches_written_file(tiny_checkpoints, official_builder):
    """init_module on a live module gives exactly the values the writer streamed (EOS row aside)."""
    (main, _codec) = _official_modules(official_builder, "tiny", "voice_design")
    main = main.to_empty(device="cpu")
    random_init.init_module(main, 0)
    sd = load_file(str(tiny_checkpoints["voice_design"] / "model.safetensors"))
    for k, v in main.state_dict().items():
        if k == "talker.codec_head.weight":
            v = v.clone()
            v[2150] = 0
        assert torch.equal(sd[k], v), k


# --------------------------------------------------------------------------------------------------
# Reader
# --------------------------------------------------------------------------------------------------
class _Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.register_buffer("steps", torch.zeros(2, dtype=torch.int64))


def _toy_file(path: Path, **override) -> Path:
    sd = {"m.lin.weight": torch.randn(3, 4), "m.lin.bias": torch.randn(3), "m.steps": torch.tensor([1, 2]),
          "other.x": torch.zeros(1)}
    sd.update(override)
    sd = {k: v for k, v in sd.items() if v is not None}
    save_file(sd, str(path))
    return path


def test_load_state_dict_into(tmp_path):
    f = _toy_file(tmp_path / "w.safetensors")
    with torch.device("meta"):
        toy = _Toy()
    load_state_dict_into(toy, f, "m.", torch.bfloat16, "cpu")
    ref = load_file(str(f))
    assert toy.lin.weight.dtype == torch.bfloat16 and toy.lin.weight.device.type == "cpu"
    assert torch.equal(toy.lin.weight, ref["m.lin.weight"].to(torch.bfloat16))
    assert toy.steps.dtype == torch.int64 and toy.steps.tolist() == [1, 2]
    assert isinstance(toy.lin.weight, nn.Parameter)


def test_streamed_read_splits_casts_and_skips(tmp_path, monkeypatch):
    """The streamed reader at a staging piece of 40 bytes: tensors share pieces and a large one spans several,
    a tensor another prefix owns lies between them (a gap that is skipped or read past), and each lands as
    the file's values in the asked dtype (floats) or its own (integers), in the module's strides."""
    from engine.checkpoint import reader

    monkeypatch.setattr(reader, "PIECE_BYTES", 40)
    monkeypatch.setattr(reader, "READ_THREADS", 3)
    sd = {"m.a": torch.randn(7, 5), "m.b": torch.randn(3).to(torch.bfloat16), "other.gap": torch.randn(9),
          "m.c": torch.arange(6, dtype=torch.int64), "m.d": torch.randn(2, 33, dtype=torch.float64),
          "m.e": torch.zeros(0), "m.f": torch.tensor([True, False, True])}
    f = tmp_path / "w.safetensors"
    save_file(sd, str(f))

    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Parameter(torch.empty(5, 7).t())  # stored column-major
            for name in "bcdef":
                self.register_buffer(name, torch.empty(sd["m." + name].shape, dtype=sd["m." + name].dtype))

    for dtype in (None, torch.bfloat16, torch.float32):
        with torch.device("meta"):
            h = Holder()
        load_state_dict_into(h, f, "m.", dtype, "cpu")
        assert h.a.stride() == (1, 7)
        for name in "abcdef":
            got, want = getattr(h, name), sd["m." + name]
            if want.is_floating_point() and dtype is not None:
                want = want.to(dtype)
            assert got.dtype == want.dtype and torch.equal(got, want), name


def test_out_of_memory_while_loading_is_not_called_a_damaged_file(tmp_path, monkeypatch):
    """Running out of device memory mid-load must reach the caller as the out-of-memory error it is (ComfyUI
    frees models on it), not as a CheckpointError telling the user to download the file again."""
    from engine.checkpoint import reader

    f = _toy_file(tmp_path / "w.safetensors")

    def full(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(reader, "_copy_pieces", full)
    with torch.device("meta"):
        toy = _Toy()
    with pytest.raises(torch.cuda.OutOfMemoryError):
        load_state_dict_into(toy, f, "m.", torch.float32, "cpu")


def test_load_state_dict_into_keeps_the_modules_layout(tmp_path, tiny_checkpoints):
    """A parameter the module stores in its own strides (the codec decoder's conv weights, channels fastest, so
    cuDNN needs no layout conversion per call) keeps them when the file's tensor replaces it; the values are
    the file's."""
    from engine.checkpoint.loader import materialize
    from engine.codec.config import CodecConfig
    from engine.codec.decoder import CausalConv1d, CausalConvTranspose1d, CodecDecoder

    f = _toy_file(tmp_path / "w.safetensors")
    with torch.device("meta"):
        toy = _Toy()
        toy.lin.weight = nn.Parameter(torch.empty(4, 3).t())  # [3, 4] stored column-major
    load_state_dict_into(toy, f, "m.", torch.float32, "cpu")
    assert toy.lin.weight.stride() == (1, 3)
    assert torch.equal(toy.lin.weight, load_file(str(f))["m.lin.weight"])

    codec_dir = tiny_checkpoints["custom_voice"] / "speech_tokenizer"
    cfg = CodecConfig.from_file(codec_dir / "config.json")
    dec = materialize(lambda: CodecDecoder(cfg.decoder), torch.device("cpu"), torch.float32,
                      codec_dir / "model.safetensors", "decoder.")
    convs = [m.conv for m in dec.modules() if isinstance(m, (CausalConv1d, CausalConvTranspose1d))]
    ref = load_file(str(codec_dir / "model.safetensors"))
    names = {id(p): n for n, p in dec.named_parameters()}
    assert convs
    for conv in convs:
        w = conv.weight
        assert w.transpose(1, 2).is_contiguous(), (names[id(w)], w.stride())  # stored [A, k, B]: dim 1 fastest
        assert torch.equal(w, ref["decoder." + names[id(w)]])


def test_reader_errors(tmp_path, tiny_checkpoints):
    with pytest.raises(CheckpointError, match=r"m\.lin\.bias") as e:
        load_state_dict_into(_Toy(), _toy_file(tmp_path / "a.safetensors", **{"m.lin.bias": None}), "m.")
    assert "a.safetensors" in str(e.value)
    with pytest.raises(CheckpointError, match=r"m\.lin\.weight.*\[3, 5\].*expects \[3, 4\]"):
        load_state_dict_into(_Toy(), _toy_file(tmp_path / "b.safetensors", **{"m.lin.weight": torch.zeros(3, 5)}), "m.")
    with pytest.raises(CheckpointError, match=r"unexpected tensor 'm\.extra'"):
        load_state_dict_into(_Toy(), _toy_file(tmp_path / "c.safetensors", **{"m.extra": torch.zeros(1)}), "m.")
    good = _toy_file(tmp_path / "d.safetensors")
    for cut in (4, 40, good.stat().st_size - 8):
        bad = tmp_path / f"trunc{cut}.safetensors"
        bad.write_bytes(good.read_bytes()[:cut])
        with pytest.raises(CheckpointError, match=f"trunc{cut}.safetensors.*(truncated|corrupted)"):
            load_state_dict_into(_Toy(), bad, "m.")
    with pytest.raises(CheckpointError, match="missing weights file"):
        load_state_dict_into(_Toy(), tmp_path / "none.safetensors", "m.")

    # a real checkpoint: truncated codec weights, missing files
    ck = tmp_path / "ck"
    shutil.copytree(tiny_checkpoints["custom_voice"], ck)
    codec = ck / "speech_tokenizer" / "model.safetensors"
    codec.write_bytes(codec.read_bytes()[: codec.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        load_state_dict_into(nn.Linear(1, 1), codec, "decoder.pre_conv.conv.")
    for rel in ("speech_tokenizer/model.safetensors", "merges.txt", "generation_config.json"):
        (ck / rel).unlink()
        with pytest.raises(CheckpointError, match=re.escape(str(ck / rel))) as e:
            check_layout(ck)
        assert "speech_tokenizer/" in str(e.value)
        shutil.copy(tiny_checkpoints["custom_voice"] / rel, ck / rel)
    with pytest.raises(CheckpointError, match="does not exist"):
        check_layout(tmp_path / "nowhere")


def test_reader_loads_official_talker(tiny_checkpoints, official_builder):
    main, codec = _official_modules(official_builder, "tiny", "base")
    load_state_dict_into(main.talker, tiny_checkpoints["base"] / "model.safetensors", "talker.", torch.float32, "cpu")
    load_state_dict_into(codec.decoder, tiny_checkpoints["base"] / writer.CODEC_WEIGHTS, "decoder.", None, "cpu")
    ref = load_file(str(tiny_checkpoints["base"] / "model.safetensors"))
    assert torch.equal(main.talker.codec_head.weight, ref["talker.codec_head.weight"])


# --------------------------------------------------------------------------------------------------
# Real sizes (slow: ~2.3 GB written)
# --------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_real_size_checkpoint(tmp_path):
    t0 = time.perf_counter()
    path = writer.write_random_checkpoint(tmp_path / "r", "0.6b", "custom_voice")
    took = time.perf_counter() - t0
    check_layout(path)
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
        assert {f.get_slice(k).get_dtype() for k in keys} == {"BF16"}
        n = sum(torch.Size(f.get_slice(k).get_shape()).numel() for k in keys)
        head = f.get_slice("talker.codec_head.weight")[2150:2151]
        assert head.abs().sum() == 0
    assert abs(n - 905.8e6) < 0.1e6, n
    print(f"0.6B custom_voice written in {took:.1f} s, {n / 1e6:.1f} M parameters")


def test_codec_decoder_is_handed_over_before_the_talker_is_read(tiny_checkpoints, monkeypatch):
    """load_components reads the codec decoder first and hands it, weights in, to codec_loaded before the talker's
    weights are read (Engine.load captures the codec's graphs on a thread meanwhile)."""
    from engine.checkpoint import loader

    order = []
    real = loader.materialize

    def recording(build, device, dtype, weights, prefix):
        module = real(build, device, dtype, weights, prefix)
        order.append(prefix)
        return module

    def codec_loaded(decoder):
        assert not any(p.is_meta for p in decoder.parameters())
        order.append("codec_loaded")
        handed.append(decoder)

    handed = []
    monkeypatch.setattr(loader, "materialize", recording)
    parts = loader.load_components(tiny_checkpoints["base"], torch.device("cpu"), torch.float32,
                                   codec_loaded=codec_loaded)
    assert order[:3] == ["decoder.", "codec_loaded", "talker."], order
    assert handed == [parts["codec"].decoder]
    assert {"speaker_encoder.", "encoder."} <= set(order[3:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # as stored, and cast on the way in
def test_projections_are_loaded_as_one_tensor_each_and_fused_without_a_copy(tiny_checkpoints, dtype):
    """Every decoder layer's q/k/v and gate/up weights land as consecutive rows of one tensor
    (DecoderLayer.MERGED_ROWS), with the file's values; the fused decode steps take that tensor as it is, so a
    load frees no originals (their holes stranded ~0.4 GB in the allocator, bench/load_memory.py)."""
    from engine.checkpoint import loader
    from engine.gpu.fused_layers import fused
    from engine.model.layers import DecoderLayer

    path = tiny_checkpoints["custom_voice"]
    parts = loader.load_components(path, torch.device("cpu"), dtype)
    ref = load_file(str(path / "model.safetensors"))
    names = {id(m): n for n, m in parts["talker"].named_modules()}
    layers = [m for m in parts["talker"].modules() if isinstance(m, DecoderLayer)]
    predictor = [layer for layer in layers if "code_predictor" in names[id(layer)]]
    assert predictor and len(predictor) < len(layers)  # the talker's layers and the code predictor's
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        for group, merged in (((attn.q_proj, attn.k_proj, attn.v_proj), "qkv"), ((mlp.gate_proj, mlp.up_proj),
                                                                                 "gate_up")):
            weights = [lin.weight for lin in group]
            base = weights[0].untyped_storage().data_ptr()
            assert all(w.untyped_storage().data_ptr() == base for w in weights)
            whole = getattr(fused(layer), merged)
            assert whole.data_ptr() == weights[0].data_ptr()  # no copy
            assert torch.equal(whole, torch.cat(weights))
            for lin in group:
                key = "talker." + names[id(layer)] + "." + next(n for n, m in layer.named_modules() if m is lin)
                assert lin.weight.dtype == dtype and torch.equal(lin.weight, ref[key + ".weight"].to(dtype)), key


def test_a_group_that_cannot_be_merged_loads_apart(tmp_path):
    """A merge group whose tensors differ in width (or is not all there) loads each tensor on its own."""
    from engine.checkpoint.reader import _merged_rows

    meta = torch.device("meta")
    same = [("a", torch.empty(3, 4, device=meta), torch.float32), ("b", torch.empty(2, 4, device=meta), torch.float32)]
    out = _merged_rows(same, torch.device("cpu"))
    assert out["a"].shape == (3, 4) and out["b"].shape == (2, 4)
    assert out["b"].data_ptr() == out["a"].data_ptr() + 3 * 4 * 4
    assert _merged_rows([same[0], ("c", torch.empty(2, 5, device=meta), torch.float32)], torch.device("cpu")) == {}
    assert _merged_rows([same[0], ("d", None, None)], torch.device("cpu")) == {}
    assert _merged_rows([same[0], ("e", torch.empty(2, 4, device=meta), torch.bfloat16)], torch.device("cpu")) == {}
