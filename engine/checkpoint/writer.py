"""Write a random-weight checkpoint in the published Qwen3-TTS-12Hz on-disk layout.

The directory loads in the official `qwen-tts` and in our engine alike (QWEN3_TTS_FACTS.md §10):

    config.json  generation_config.json  model.safetensors
    vocab.json  merges.txt  tokenizer_config.json  preprocessor_config.json
    speech_tokenizer/ config.json  configuration.json  preprocessor_config.json  model.safetensors
    RANDOM_WEIGHTS.json   (manifest: these weights are random; loaders ignore it)

Shapes come from our modules built on the meta device; values come from `random_init` (one seeded
generator per tensor) and are streamed to disk one tensor at a time, so the peak memory is one tensor,
never a whole state dict. The same arguments always give byte-identical files.
"""
from __future__ import annotations

import json
import math
import os
import struct
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch import nn

from . import presets, random_init, tiny_bpe

MANIFEST = "RANDOM_WEIGHTS.json"
AHEAD_BYTES = 1 << 30  # float32 bytes of tensors generated ahead of the file writer
MAIN_WEIGHTS = "model.safetensors"
CODEC_WEIGHTS = "speech_tokenizer/model.safetensors"

# A builder maps (config.json dict, speech_tokenizer/config.json dict) to
# {weights file relative to the checkpoint dir: [(state-dict prefix, module on the meta device), ...]}.
Builder = Callable[[dict, dict], dict[str, list[tuple[str, nn.Module]]]]

_ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int64: "I64",
              torch.int32: "I32", torch.bool: "BOOL", torch.uint8: "U8"}


def build_engine_modules(main_cfg: dict, codec_cfg: dict) -> dict[str, list[tuple[str, nn.Module]]]:
    """Our modules for one checkpoint, built on the meta device (call inside `torch.device('meta')`)."""
    from ..codec.config import CodecConfig
    from ..codec.decoder import CodecDecoder
    from ..codec.encoder import MimiEncoder
    from ..config import ModelConfig
    from ..model.talker import Talker

    cfg = ModelConfig.from_dict(main_cfg)
    main = [("talker.", Talker(cfg.talker))]
    if cfg.speaker_encoder is not None:
        from ..model.speaker_encoder import SpeakerEncoder

        main.append(("speaker_encoder.", SpeakerEncoder(cfg.speaker_encoder)))
    ccfg = CodecConfig.from_dict(codec_cfg)
    # The published codec always carries its encoder, whatever the model type.
    codec = [("decoder.", CodecDecoder(ccfg.decoder)),
             ("encoder.", MimiEncoder(ccfg.encoder, ccfg.encoder_valid_num_quantizers))]
    return {MAIN_WEIGHTS: main, CODEC_WEIGHTS: codec}


def _float_dtype(name: str | torch.dtype | None, default: torch.dtype) -> torch.dtype:
    if name is None:
        return default
    if isinstance(name, torch.dtype):
        return name
    table = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
             "fp32": torch.float32, "float32": torch.float32}
    if name not in table:
        raise ValueError(f"dtype must be one of {sorted(table)}, got {name!r}")
    return table[name]


def _planned(parts: list[tuple[str, nn.Module]], seed: int, dtype: torch.dtype, transform) -> list[tuple]:
    """(name, dtype, shape, make) per tensor in file order; `make()` materialises the final tensor."""
    plan = []
    for prefix, module in parts:
        entries = random_init.state_entries(module, prefix)
        final = random_init.final_codec_conv(e[0] for e in entries)
        for full, _local, t, owner in entries:
            out_dtype = dtype if t.dtype.is_floating_point else t.dtype

            def make(full=full, shape=tuple(t.shape), owner=owner, out_dtype=out_dtype, final=final):
                value = random_init.init_tensor(full, shape, owner, seed, final_conv=(full == final))
                value = transform(full, value)
                return value.to(out_dtype)

            plan.append((full, out_dtype, tuple(t.shape), make))  # values are made only when written
    names = [p[0] for p in plan]
    if len(set(names)) != len(names):
        raise ValueError("two modules produced the same state-dict name; check the builder's prefixes")
    # Largest first (then by name): the big embeddings start at once and the rest is made alongside.
    return sorted(plan, key=lambda p: (-math.prod(p[2]), p[0]))


def write_safetensors_streaming(path: Path, plan: Iterable[tuple], metadata: dict[str, str] | None = None) -> None:
    """Write a .safetensors file tensor by tensor: header first (shapes are known), then each tensor's bytes."""
    plan = list(plan)
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, dtype, shape, _make in plan:
        nbytes = torch.empty((), dtype=dtype).element_size() * math.prod(shape)
        header[name] = {"dtype": _ST_DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)  # keep the data 8-byte aligned, as the reference writer does
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".partial")
    # Tensors are made by worker threads ahead of the writer (torch's RNG runs on one core per tensor and
    # releases the GIL; each tensor has its own generator, so the values do not depend on the scheduling).
    # Tensors made ahead are bounded by AHEAD_BYTES, so memory stays far below a whole state dict.
    workers = max(1, min(4, os.cpu_count() or 1))
    queue: deque = deque()
    try:
        with open(tmp, "wb") as f, ThreadPoolExecutor(max_workers=workers) as pool:
            f.write(struct.pack("<Q", len(blob)))
            f.write(blob)
            nxt, queued = 0, 0
            for name, dtype, shape, _make in plan:
                while nxt < len(plan) and (not queue or (len(queue) < 4 * workers and queued < AHEAD_BYTES)):
                    size = math.prod(plan[nxt][2]) * 4
                    queue.append((pool.submit(plan[nxt][3]), size))
                    queued += size
                    nxt += 1
                future, size = queue.popleft()
                queued -= size
                t = future.result().contiguous()
                if t.dtype != dtype or tuple(t.shape) != shape:
                    raise AssertionError(f"{name}: planned {dtype}{list(shape)}, made {t.dtype}{list(t.shape)}")
                if t.numel():
                    f.write(t.reshape(-1).view(torch.uint8).numpy().data)
                del t, future
    except BaseException:
        for future, _ in queue:
            future.cancel()
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)


def _dump(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def _codec_side_files(out: Path, codec_cfg: dict) -> None:
    st = out / "speech_tokenizer"
    _dump(st / "config.json", codec_cfg)
    _dump(st / "configuration.json", {"framework": "pytorch", "task": "feature-extraction", "allow_remote": True})
    _dump(st / "preprocessor_config.json", {
        "chunk_length_s": None, "feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1,
        "overlap": None, "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True,
        "sampling_rate": codec_cfg.get("input_sample_rate", 24000),
    })


def write_random_checkpoint(out_dir: str | Path, size: str, model_type: str, *, eos: bool = False, seed: int = 0,
                            dtype: str | torch.dtype | None = None, builder: Builder | None = None,
                            eos_scale: float = 1.0) -> Path:
    """Write a random-weight checkpoint directory and return its path.

    size: "tiny" | "0.6b" | "1.7b"; model_type: "base" | "custom_voice" | "voice_design".
    eos: False (default) zeroes the codec_head row of the codec EOS id, so its logit is exactly 0 and
    sampling never stops early; True leaves the row random, multiplied by `eos_scale` (> 1 makes EOS
    likely, for tests of early stopping).
    dtype: the main model's dtype; default bf16 for real sizes (as published), fp32 for tiny. The codec
    is always fp32 (as published).
    builder: builds the meta-device modules that define names and shapes (default: our engine modules).
    """
    main_cfg = presets.main_config(size, model_type)
    codec_cfg = presets.codec_config(size)
    main_dtype = _float_dtype(dtype, torch.float32 if size == "tiny" else torch.bfloat16)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    eos_id = main_cfg["talker_config"]["codec_eos_token_id"]

    def transform(name: str, value: torch.Tensor) -> torch.Tensor:
        if name == "talker.codec_head.weight":
            if not eos:
                value[eos_id].zero_()
            elif eos_scale != 1.0:
                value[eos_id].mul_(float(eos_scale))
        return value

    with torch.device("meta"):
        files = (builder or build_engine_modules)(main_cfg, codec_cfg)
    for rel, parts in files.items():
        file_dtype = main_dtype if rel == MAIN_WEIGHTS else torch.float32
        write_safetensors_streaming(out / rel, _planned(parts, seed, file_dtype, transform), {"format": "pt"})
    del files

    _dump(out / "config.json", main_cfg)
    _dump(out / "generation_config.json", presets.generation_config())
    _dump(out / "preprocessor_config.json", {"processor_class": "Qwen3TTSProcessor"})
    tiny_bpe.write_tokenizer_files(out, full=(size != "tiny"))
    _codec_side_files(out, codec_cfg)
    _dump(out / MANIFEST, {
        "random_weights": True,
        "note": "Random weights for tests and benchmarks; they produce noise, not speech.",
        "writer": "engine.checkpoint.writer", "size": size, "model_type": model_type, "seed": int(seed),
        "eos_enabled": bool(eos), "eos_scale": float(eos_scale) if eos else 0.0, "dtype": str(main_dtype).replace("torch.", ""), "codec_dtype": "float32",
    })
    return out


def ensure_random_checkpoint(out_dir: str | Path, size: str, model_type: str, **options) -> bool:
    """Write a random checkpoint to `out_dir` (write_random_checkpoint's keyword `options`, default none) unless a
    complete one is there (the manifest is written last, so it marks a finished directory). Returns True when it
    wrote one."""
    if (Path(out_dir) / MANIFEST).is_file():
        return False
    write_random_checkpoint(out_dir, size, model_type, **options)
    return True


def is_random_checkpoint(path: str | Path) -> bool:
    """Whether `path` is a checkpoint folder written here (its manifest says the weights are random), or the codec
    folder inside one. Every front end reports such a model as random weights, since it speaks noise."""
    from .codec_source import CODEC_SUBDIR

    p = Path(path)
    return (p / MANIFEST).is_file() or (p.name == CODEC_SUBDIR and (p.parent / MANIFEST).is_file())
