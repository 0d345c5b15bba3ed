"""Property-based fuzzing with hypothesis. Every exception must be a typed project error.

Targets: text through the tokenizer, the prompt builder and the sentence splitter; bytes through the voice
loader (and on to the prompt builder); arrays through reference preparation; bytes through the WAV reader.
Structurally: WAV and safetensors files built honestly, then given headers that contradict themselves or the
data, through the WAV reader, the voice loader and the checkpoint reader; a WAV header that contradicts itself or
the file must be refused naming the file, and one that tells the truth must load exactly.

CI runs a bounded, derandomized number of examples per target (fixed inputs, no flakes, well under 60 s in
all). QWEN3TTS_FUZZ_EXAMPLES=N runs N random examples per target instead; docs/RELIABILITY.md reports such a
run. Each test records how many examples ran, how many ended in a typed error, and the rate.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import struct
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is a test dependency (scripts/setup_env.sh --full)")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

from engine import Engine, Request, Voice  # noqa: E402
from engine import audio as engine_audio  # noqa: E402
from engine.errors import Qwen3TTSError  # noqa: E402
from engine.text_tokenizer import TextTokenizer  # noqa: E402
from engine.voice import FORMAT  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LONG = int(os.environ.get("QWEN3TTS_FUZZ_EXAMPLES", "0") or 0)


def _text_split():
    """nodes/text_split.py on its own (pure Python; `nodes` may be ComfyUI's module in this process)."""
    spec = importlib.util.spec_from_file_location("qwen3tts_fuzz_text_split", ROOT / "nodes" / "text_split.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fuzz(figure, target: str, strategy, check, ci_examples: int):
    """Run `check` on examples of `strategy`; typed project errors count, anything else fails (and shrinks)."""
    seen = {"examples": 0, "typed_errors": 0}
    quiet = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
             HealthCheck.large_base_example]

    @settings(max_examples=LONG or ci_examples, deadline=None, database=None, derandomize=not LONG,
              suppress_health_check=quiet, print_blob=True)
    @given(strategy)
    def prop(example):
        seen["examples"] += 1
        try:
            check(example)
        except Qwen3TTSError:
            seen["typed_errors"] += 1

    t0 = time.perf_counter()
    prop()
    wall = time.perf_counter() - t0
    figure(target=target, mode="long" if LONG else "ci", examples=seen["examples"],
           typed_errors=seen["typed_errors"], seconds=round(wall, 2), per_second=round(seen["examples"] / wall, 1))


@pytest.fixture(scope="module")
def engines(tiny_checkpoints):
    return {k: Engine.load(p, device="cpu", dtype="fp32") for k, p in tiny_checkpoints.items()}


@pytest.fixture(scope="module")
def voices(engines, tmp_path_factory):
    t = np.arange(2 * 24000) / 24000
    wave = (0.3 * np.sin(2 * np.pi * 160 * t)).astype(np.float32)
    base = engines["base"]
    xvec, icl = base.extract_voice(wave, 24000), base.extract_voice(wave, 24000, ref_text="Reference.")
    path = xvec.save(tmp_path_factory.mktemp("fuzz_voice") / "good.safetensors")
    return {"xvec": xvec, "icl": icl, "good_bytes": path.read_bytes()}


# ---------------------------------------------------------------------------------------------------------
# text

PIECES = ["Hello", "world", " ", "  ", ".", "!", "?", "…", ",", ";", ":", "—", "\"", "'", "“", "”", "‘", "’", ")",
          "。", "！", "？", "；", "，", "、", "「", "」", "你好", "世界", "こんにちは", "안녕", "שלום", "مرحبا", "😀",
          "👍🏽", "\u200d", "\u200b", "\ufeff", "\n", "\n\n", "\t", "\r", "\x00", "\x1b[31m", "\x7f", "\ud800",
          "\udfff", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "a" * 50, "1234", "e\u0301"]
TEXT = st.one_of(
    st.text(max_size=300),
    st.text(st.characters(categories=["Cs", "Cc", "Cf", "Zs", "Zl", "Zp", "Co", "Cn", "So"]), max_size=40),
    st.lists(st.sampled_from(PIECES), max_size=80).map("".join),
)
NOT_TEXT = st.one_of(st.none(), st.integers(), st.floats(), st.binary(max_size=8), st.lists(st.text(max_size=3),
                                                                                              max_size=2))


def test_fuzz_tokenizer(tiny_checkpoints, figure):
    tok = TextTokenizer.from_dir(tiny_checkpoints["custom_voice"])

    def check(text):
        ids = tok.encode(text)
        assert isinstance(ids, list) and all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids)
        tok.decode(ids)

    fuzz(figure, "text -> tokenizer", st.one_of(TEXT, NOT_TEXT), check, ci_examples=1000)


def _mostly(valid, bad, odds=5):
    """`valid` about odds times as often as `bad`, so most examples get past the first check."""
    # one_of would flatten `bad`'s own branches into the choice, and integers favour their bounds
    return st.sampled_from([True] * odds + [False]).flatmap(lambda ok: valid if ok else bad)


def test_fuzz_prompt_builder(engines, voices, figure):
    native = {"custom_voice": "custom", "voice_design": "design", "base": "clone"}

    @st.composite
    def requests(draw):
        model = draw(st.sampled_from(sorted(engines)))
        cfg = engines[model].cfg
        name = st.one_of(TEXT, NOT_TEXT, st.sampled_from(["", "klingon", "sichuan_dialect"]))
        languages = st.sampled_from(cfg.supported_languages + ["Auto", "ENGLISH", " english "])
        speakers = st.sampled_from(cfg.supported_speakers or [None])
        voice = st.sampled_from([voices["xvec"], voices["icl"]]) if model == "base" else st.none()
        req = Request(
            mode=draw(_mostly(st.just(native[model]), st.one_of(st.sampled_from(["custom", "design", "clone", "x"]),
                                                                 NOT_TEXT))),
            text=draw(_mostly(TEXT, NOT_TEXT)), language=draw(_mostly(languages, name)),
            speaker=draw(_mostly(speakers, name)), instruct=draw(_mostly(st.one_of(st.none(), TEXT), NOT_TEXT)),
            voice=draw(_mostly(voice, st.sampled_from(["voice.safetensors", 3, voices["xvec"]]))),
            non_streaming_mode=draw(_mostly(st.sampled_from([None, True, False]), st.sampled_from([1, "yes"]))),
            icl=draw(_mostly(st.sampled_from([None, True, False]), st.sampled_from([0, "no"]))))
        return model, req

    def check(case):
        model, req = case
        prompt = engines[model].builder.build(req)
        assert prompt.prefill.dim() == 3 and bool(torch.isfinite(prompt.prefill).all())

    fuzz(figure, "text -> prompt builder", requests(), check, ci_examples=500)


def test_fuzz_sentence_splitter(figure):
    ts = _text_split()

    def squeeze(s):
        return "".join(ch for ch in s if not ch.isspace())

    def check(case):
        text, budget = case
        segments = ts.split_text(text, budget)
        assert all(seg and seg == seg.strip() for seg in segments), segments
        # a single character heavier than the budget (CJK counts 3) can only be a segment of its own
        assert all(ts.text_units(seg) <= budget or len(seg) == 1 for seg in segments), (budget, segments)
        assert squeeze("".join(segments)) == squeeze(text), "the split lost or added characters"

    fuzz(figure, "text -> sentence splitter", st.tuples(TEXT, st.integers(1, 120)), check, ci_examples=1000)


def test_splitter_keeps_closing_quotes():
    """Found by the splitter fuzz: quotes and brackets closing a sentence were dropped at a split."""
    ts = _text_split()
    assert ts.split_text('He said "Hi there." Then he left. ' * 3, 40) == ['He said "Hi there." Then he left.'] * 3
    assert ts.split_text("他说：“你好。”然后走了。" * 4, 30) == ["他说：“你好。”然后走了。"] * 4


# ---------------------------------------------------------------------------------------------------------
# voice files

DTYPES = ["F32", "F16", "BF16", "F64", "I64", "I32", "I16", "I8", "U8", "U16", "U32", "U64", "BOOL", "F8_E4M3",
          "F8_E5M2", "C64", "XYZ"]
ITEM = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "U16": 2, "U32": 4,
        "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "C64": 8, "XYZ": 1}


WIDTH = 0  # the tiny Base checkpoint's embedding width, set by the test


@st.composite
def voice_files(draw, good: bytes):
    kind = draw(st.sampled_from(["random", "mutated", "structured", "structured"]))
    if kind == "random":
        return draw(st.binary(max_size=600))
    if kind == "mutated":
        data = bytearray(good)
        for _ in range(draw(st.integers(1, 4))):
            op, i = draw(st.sampled_from(["flip", "cut", "insert"])), draw(st.integers(0, max(0, len(data) - 1)))
            if op == "flip" and data:
                data[i] ^= draw(st.integers(1, 255))
            elif op == "cut":
                del data[i:]
            else:
                data[i:i] = draw(st.binary(min_size=1, max_size=16))
        return bytes(data)
    width = draw(st.sampled_from([WIDTH] * 6 + [0, 1, 2048]))
    codes = draw(st.sampled_from([0, 0, 4, 1]))
    tensors = {"spk_embedding": ("F32", [width], np.random.default_rng(width).standard_normal(width).astype("<f4"))}
    if codes:
        tensors["ref_codes"] = ("I32", [codes, 16], np.arange(codes * 16, dtype="<i4") % 2048)
    meta = {"format": FORMAT, "version": "1", "family": "qwen3-tts-12hz", "model_size": "tiny", "width": str(width)}
    if codes:
        meta["ref_text"] = '"Reference."'
    for _ in range(draw(st.integers(0, 3))):  # break one thing at a time, sometimes a few
        what = draw(st.sampled_from(["dtype", "shape", "values", "drop", "extra", "meta", "offsets", "length"]))
        if not tensors:
            break
        name = draw(st.sampled_from(sorted(tensors)))
        dtype, shape, values = tensors[name]
        if what == "dtype":
            dtype = draw(st.sampled_from(DTYPES))
        elif what == "shape":
            shape = draw(st.lists(st.integers(0, 40), max_size=3))
        elif what == "values":
            values = draw(st.sampled_from([np.full(max(1, math.prod(shape)), np.nan, "<f4"),
                                           np.full(max(1, math.prod(shape)), 99999, "<i4"),
                                           np.full(max(1, math.prod(shape)), -1, "<i4")]))
        elif what == "drop":
            tensors.pop(name)
            continue
        elif what == "extra":
            tensors["other"] = ("F32", [2], np.zeros(2, "<f4"))
        elif what == "meta":
            key = draw(st.sampled_from(["format", "model_size", "family", "width", "ref_text", "version"]))
            value = draw(st.sampled_from([None, "", "abc", "-1", "{", "5", '["a"]', "null", '"x"', "1b7"]))
            meta.pop(key, None) if value is None else meta.__setitem__(key, value)
        tensors[name] = (dtype, shape, values)
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, values) in tensors.items():
        size = math.prod(shape) * ITEM[dtype]
        blob = values.tobytes()[:size].ljust(size, b"\x00")
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        blobs.append(blob)
        offset += size
    if draw(st.integers(0, 7)) == 0:
        entry = header[draw(st.sampled_from(sorted(header)))] if header else {}
        entry["data_offsets"] = draw(st.sampled_from([[0, 10**12], [5, 1], [-1, 4], [0]]))
    header["__metadata__"] = meta
    raw = json.dumps(header).encode()
    length = len(raw) if draw(st.integers(0, 7)) else draw(st.sampled_from([len(raw) + 3, 0, 2**40, 2**63]))
    return struct.pack("<Q", length) + raw + b"".join(blobs)


def test_fuzz_voice_loader(engines, voices, figure, tmp_path_factory):
    global WIDTH
    path = tmp_path_factory.mktemp("fuzz_voice_files") / "v.safetensors"
    base = engines["base"]
    WIDTH = base.cfg.embedding_width

    def check(data):
        path.write_bytes(data)
        voice = Voice.load(path)
        base.check_voice(voice)
        prompt = base.builder.build(Request(mode="clone", text="Fuzz.", voice=voice))
        assert bool(torch.isfinite(prompt.prefill).all())

    fuzz(figure, "bytes -> voice loader (-> prompt)", voice_files(voices["good_bytes"]), check, ci_examples=800)


# ---------------------------------------------------------------------------------------------------------
# reference audio arrays

RATES = [4000, 8000, 11025, 16000, 22050, 24000, 44100, 48000, 96000, 192000]


@st.composite
def references(draw):
    if draw(st.integers(0, 3)) == 0:  # small arrays of any dtype and shape: the type and shape checks
        dtype = draw(st.sampled_from([np.float32, np.float64, np.float16, np.int16, np.int32, np.uint8, np.bool_,
                                      np.complex64]))
        x = draw(hnp.arrays(dtype, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6)))
        return x, draw(st.one_of(st.sampled_from(RATES), st.integers(-10, 10**7)))
    sr = draw(st.sampled_from(RATES))  # a signal long enough for the deeper checks and the resampler
    seconds = draw(_mostly(st.sampled_from([1.0, 1.7, 3.0]), st.sampled_from([0.5, 0.99, 61.0])))
    channels = draw(_mostly(st.integers(1, 2), st.integers(3, 40)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = int(seconds * sr) if seconds < 60 or sr <= 8000 else int(1.5 * sr)
    amplitude = draw(_mostly(st.sampled_from([0.3, 1.0]), st.sampled_from([0.0, 1e-5, 20.0, 30000.0])))
    x = rng.standard_normal((channels, n)) * amplitude
    special = draw(_mostly(st.none(), st.sampled_from([np.nan, np.inf, -np.inf])))
    if special is not None and n:
        x[rng.integers(channels), rng.integers(n)] = special
    layout = draw(_mostly(st.sampled_from(["[C, T]", "[T]", "torch"]), st.just("[T, C]")))
    with np.errstate(over="ignore"):  # float16 turns 30000 x N(0, 1) into inf now and then: a case like another
        x = x.astype(draw(st.sampled_from([np.float32, np.float64, np.float16])))
    if layout == "[T, C]":
        x = x.T.copy()
    elif layout == "[T]":
        x = x[0]
    elif layout == "torch":
        x = torch.from_numpy(x)
    rate = draw(_mostly(st.sampled_from([sr, float(sr)]), st.one_of(
        st.sampled_from([0, -sr, sr + 0.5, None, "24000"]), st.floats(allow_nan=True, allow_infinity=True))))
    return x, rate


def test_fuzz_reference_preparation(figure):
    def check(case):
        x, sr = case
        y = engine_audio.prepare_reference(x, sr, 24000)
        length = x.shape[-1]
        assert y.dtype == torch.float32 and y.dim() == 1 and bool(torch.isfinite(y).all())
        assert y.shape[0] == math.ceil(length * (24000 / int(sr)))

    fuzz(figure, "arrays -> reference preparation", references(), check, ci_examples=400)


# ---------------------------------------------------------------------------------------------------------
# WAV files

@st.composite
def wav_files(draw):
    if draw(st.integers(0, 4)) == 0:
        return draw(st.binary(max_size=200))
    tag = draw(st.sampled_from([1, 3, 0xFFFE, 0xFFFE, 2, 0]))
    channels = draw(st.sampled_from([1, 2, 6, 0, 65535]))
    rate = draw(st.sampled_from([16000, 24000, 44100, 0, 2**32 - 1]))
    bits = draw(st.sampled_from([8, 16, 24, 32, 64, 0, 12]))
    align = draw(st.sampled_from([channels * bits // 8, 0, 1, 3, 65535]))
    fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * max(align, 1) % 2**32, align % 65536, bits)
    if tag == 0xFFFE:
        fmt += struct.pack("<HHIH", 22, bits, 0, draw(st.sampled_from([1, 3, 2]))) + b"\x00" * 14
    fmt = fmt[: draw(st.sampled_from([len(fmt), len(fmt), 12, 0]))]
    body = draw(st.binary(max_size=400))
    chunks = [(b"fmt ", fmt), (b"data", body)]
    if draw(st.booleans()):
        chunks.reverse()
    out = b""
    for cid, payload in chunks:
        size = draw(st.sampled_from([len(payload)] * 3 + [0xFFFFFFFF, len(payload) + 100]))
        out += cid + struct.pack("<I", size) + payload + (b"\x00" if len(payload) % 2 else b"")
    return b"RIFF" + struct.pack("<I", len(out) + 4) + b"WAVE" + out


def test_fuzz_wav_reader(figure):
    path = Path(tempfile.mkdtemp(prefix="qwen3tts_fuzz_wav_")) / "f.wav"

    def check(data):
        path.write_bytes(data)
        x, sr = engine_audio.load_wav(path)
        assert x.dtype == np.float32 and x.ndim == 2 and isinstance(sr, int) and sr > 0

    fuzz(figure, "bytes -> WAV reader", wav_files(), check, ci_examples=800)


# ---------------------------------------------------------------------------------------------------------
# structural fuzzing: files built honestly, then given headers that contradict themselves or the data. A typed
# error must name the file; a file that loads must give what an honest header says.

WAV_ENCODINGS = [(1, 1), (1, 2), (1, 3), (1, 4), (3, 4), (3, 8)]  # (format tag, bytes a sample)
WAV_LIES = ["align", "bits", "channels", "rate", "data_size", "fmt_size", "junk_chunk", "truncate",
            "riff_size", "byte_rate", "data_first", "extensible"]
HARMLESS_WAV_LIES = {"riff_size", "byte_rate", "data_first", "extensible"}  # a reader ignores or follows these


def _decode_honestly(raw: bytes, tag: int, width: int, channels: int) -> np.ndarray:
    """The samples [C, T] of little-endian PCM or float bytes, scaled as soundfile does (the test's oracle)."""
    if tag == 3:
        x = np.frombuffer(raw, f"<f{width}").astype(np.float32)
    elif width == 1:
        x = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128) / 128
    elif width == 3:
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int64)
        v = b[:, 0] | b[:, 1] << 8 | b[:, 2] << 16
        x = (np.where(v >= 1 << 23, v - (1 << 24), v) / float(1 << 23)).astype(np.float32)
    else:
        x = (np.frombuffer(raw, f"<i{width}").astype(np.float64) / float(1 << (8 * width - 1))).astype(np.float32)
    return x.reshape(-1, channels).T


@st.composite
def lying_wavs(draw):
    """(file bytes, what the reader must do: "refuse", "load" or None where the file is ambiguous, the honest
    (tag, width, channels, data) where the lies leave the encoding as it was, the lies)."""
    tag, width = draw(st.sampled_from(WAV_ENCODINGS))
    channels, rate, frames = draw(st.integers(1, 4)), draw(st.sampled_from([8000, 24000, 44100])), draw(
        st.integers(0, 200))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    if tag == 3:  # finite floats: NaN bit patterns would not compare equal
        data = rng.uniform(-1, 1, frames * channels).astype(f"<f{width}").tobytes()
    else:
        data = rng.integers(0, 256, frames * channels * width, dtype=np.uint8).tobytes()
    h = {"tag": tag, "channels": channels, "rate": rate, "bits": 8 * width, "align": channels * width,
         "byte_rate": rate * channels * width, "fmt_size": None, "data_size": len(data), "riff_size": None}
    lies = draw(st.lists(st.sampled_from(WAV_LIES), max_size=3, unique=True))
    if "align" in lies:
        h["align"] = draw(st.sampled_from([0, 1, h["align"] + 1, h["align"] * 2, 65535]))
    if "bits" in lies:
        h["bits"] = draw(st.sampled_from([0, 1, 7, h["bits"] + 8, 65535]))
    if "channels" in lies:
        h["channels"] = draw(st.sampled_from([0, channels + 1, 65535]))
    if "rate" in lies:
        h["rate"] = draw(st.sampled_from([0, 1, 2**32 - 1]))
    if "data_size" in lies:
        h["data_size"] = draw(st.sampled_from([len(data) + 1, len(data) + h["align"], 2 * len(data) + 1000, 2**31,
                                               0xFFFFFFFF, 0, max(0, len(data) - 1)]))
    if "fmt_size" in lies:
        h["fmt_size"] = draw(st.sampled_from([0, 12, 15, 2**20, 2**32 - 1]))
    if "riff_size" in lies:
        h["riff_size"] = draw(st.sampled_from([0, 4, 2**32 - 1]))
    if "byte_rate" in lies:
        h["byte_rate"] = draw(st.sampled_from([0, 1, 2**32 - 1]))
    fmt = struct.pack("<HHIIHH", 0xFFFE if "extensible" in lies else h["tag"], h["channels"] % 65536,
                      h["rate"] % 2**32, h["byte_rate"] % 2**32, h["align"] % 65536, h["bits"] % 65536)
    if "extensible" in lies:  # WAVE_FORMAT_EXTENSIBLE: the real tag is the GUID's first two bytes
        fmt += struct.pack("<HHIH", 22, h["bits"] % 65536, 0, h["tag"]) + bytes.fromhex("000000001000800000aa00389b71")
    chunks = [(b"fmt ", fmt, len(fmt) if h["fmt_size"] is None else h["fmt_size"]),
              (b"data", data, h["data_size"])]
    if "junk_chunk" in lies:  # a chunk before the audio whose size runs past the end of the file
        chunks.insert(draw(st.integers(0, 1)), (b"LIST", b"junk", draw(st.sampled_from([2**31, 2**32 - 2]))))
    if "data_first" in lies:
        chunks.reverse()
    body = b"WAVE" + b"".join(cid + struct.pack("<I", size) + payload + b"\0" * (len(payload) % 2)
                              for cid, payload, size in chunks)
    out = b"RIFF" + struct.pack("<I", len(body) if h["riff_size"] is None else h["riff_size"]) + body
    data_start = len(out) - len(data) - len(data) % 2  # the audio's first byte (data is the last chunk)
    if "truncate" in lies:
        out = out[: draw(st.integers(0, max(0, len(out) - 1)))]

    # What a reader must do with it: refuse every header that contradicts itself or the file, load the rest.
    decl_width = (h["bits"] + 7) // 8
    available = len(out) - data_start
    if "data_first" in lies:
        expect = None  # a lying size in the first chunk hides the next one: the outcome depends on the bytes
    elif (h["channels"] == 0 or h["rate"] == 0 or h["bits"] == 0 or h["align"] != h["channels"] * decl_width
          or h["fmt_size"] is not None or "junk_chunk" in lies or available < 0
          or (h["tag"], decl_width) not in WAV_ENCODINGS):
        expect = "refuse"
    elif h["data_size"] == 0xFFFFFFFF:
        expect = "load"  # open size: the rest of the file
    else:
        expect = "refuse" if h["data_size"] > available or h["data_size"] % h["align"] else "load"
    honest = None
    if (h["tag"], h["channels"], h["align"], decl_width) == (tag, channels, channels * width, width):
        honest = (tag, width, channels, data)
    return out, expect, honest, lies


def test_fuzz_wav_reader_structural(figure, tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz_wav_structural") / "lying.wav"

    def check(case):
        data, expect, honest, lies = case
        path.write_bytes(data)
        try:
            x, sr = engine_audio.load_wav(path, max_seconds=None)
        except Qwen3TTSError as exc:
            assert str(path) in str(exc), f"{lies}: the error does not name the file: {exc}"
            assert expect != "load", f"{lies}: refused a file that is fine: {exc}"
            raise
        assert expect != "refuse", f"{lies}: a header that contradicts itself or the file was decoded"
        assert x.dtype == np.float32 and x.ndim == 2 and sr > 0
        if honest is not None:  # what loads is the honest audio, or its beginning where the size says less
            tag, width, channels, raw = honest
            want = _decode_honestly(raw, tag, width, channels)
            # an odd chunk's pad byte may be declared as data: a file that says so cannot be told from an honest one
            extra = 1 if "data_size" in lies else 0
            n = min(x.shape[1], want.shape[1])
            assert x.shape[0] == channels and x.shape[1] <= want.shape[1] + extra, (lies, x.shape, want.shape)
            assert np.array_equal(x[:, :n], want[:, :n]), lies
            if set(lies) <= HARMLESS_WAV_LIES:
                assert x.shape == want.shape, (lies, x.shape)

    fuzz(figure, "lying headers -> WAV reader", lying_wavs(), check, ci_examples=600)


ST_LIES = ["header_length", "offsets_past_end", "offsets_overlap", "offsets_gap", "offsets_reversed", "shape",
           "dtype", "trailing_bytes", "truncated_data", "header_padding", "not_utf8", "duplicate_key",
           "metadata_not_text"]
HARMLESS_ST_LIES = {"header_padding"}  # spaces after the JSON are allowed by the format


@st.composite
def lying_safetensors(draw, tensors: dict, metadata: dict):
    """A safetensors file of `tensors` ({name: float32 or int32 array}) and `metadata`, with 0-3 lies."""
    lies = draw(st.lists(st.sampled_from(ST_LIES), max_size=3, unique=True))
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        blob = arr.tobytes()
        header[name] = {"dtype": {"float32": "F32", "int32": "I32"}[str(arr.dtype)], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    name = draw(st.sampled_from(sorted(header)))
    entry = header[name]
    begin, end = entry["data_offsets"]
    if "offsets_past_end" in lies:
        entry["data_offsets"] = [begin, offset + draw(st.sampled_from([1, 4, 2**40]))]
    if "offsets_overlap" in lies and len(header) > 1:
        entry["data_offsets"] = [max(0, begin - 4), end - 4]
    if "offsets_gap" in lies:
        entry["data_offsets"] = [begin + 4, end + 4]
    if "offsets_reversed" in lies:
        entry["data_offsets"] = [end, begin]
    if "shape" in lies:
        entry["shape"] = draw(st.sampled_from([[], [0], [entry["shape"][0] + 1] + entry["shape"][1:], [2**31, 2**31],
                                               [-1]]))
    if "dtype" in lies:
        entry["dtype"] = draw(st.sampled_from(["F64", "F16", "I64", "U8", "BOOL", "F8_E4M3", "XYZ"]))
    meta = dict(metadata)
    if "metadata_not_text" in lies:
        meta[draw(st.sampled_from(sorted(meta)))] = draw(st.sampled_from([5, None, ["a"], {"a": 1}]))
    header["__metadata__"] = meta
    raw = json.dumps(header).encode()
    if "duplicate_key" in lies:
        raw = raw[:-1] + b", " + json.dumps(name).encode() + b": " + json.dumps(header[name]).encode() + b"}"
    if "not_utf8" in lies:
        raw = raw[:-1] + b', "\xff\xfe": 1}'
    if "header_padding" in lies:
        raw += b" " * draw(st.integers(1, 7))
    length = len(raw)
    if "header_length" in lies:
        length = draw(st.sampled_from([0, 1, len(raw) - 1, len(raw) + 1, len(raw) + 8, 2**40, 2**64 - 1]))
    data = b"".join(blobs)
    if "truncated_data" in lies:
        data = data[: draw(st.integers(0, max(0, len(data) - 1)))]
    if "trailing_bytes" in lies:
        data += b"\0" * draw(st.integers(1, 64))
    return struct.pack("<Q", length % 2**64) + raw + data, set(lies) <= HARMLESS_ST_LIES, lies


def test_fuzz_voice_loader_structural(engines, voices, figure, tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz_voice_structural") / "lying.safetensors"
    xvec = voices["icl"]
    emb = xvec.spk_embedding.float().numpy()
    codes = xvec.ref_codes.to(torch.int32).numpy()
    meta = {"format": FORMAT, "version": "1", "family": xvec.family, "model_size": xvec.model_size,
            "width": str(emb.shape[0]), "dtype": "float32", "ref_text": json.dumps(xvec.ref_text)}

    def check(case):
        data, honest, lies = case
        path.write_bytes(data)
        try:
            voice = Voice.load(path)
        except Qwen3TTSError as exc:
            assert path.name in str(exc), f"{lies}: the error does not name the file: {exc}"
            raise
        engines["base"].check_voice(voice)
        if honest:
            assert torch.equal(voice.spk_embedding, torch.from_numpy(emb)) and torch.equal(
                voice.ref_codes, torch.from_numpy(codes).long()), lies

    strategy = lying_safetensors({"spk_embedding": emb, "ref_codes": codes}, meta)
    fuzz(figure, "lying headers -> voice loader", strategy, check, ci_examples=400)


def test_fuzz_checkpoint_reader_structural(figure, tmp_path_factory):
    """The checkpoint reader reads tensor bytes itself (engine/checkpoint/reader.py), at the header's offsets."""
    from engine.checkpoint.reader import load_state_dict_into

    path = tmp_path_factory.mktemp("fuzz_ckpt_structural") / "model.safetensors"
    rng = np.random.default_rng(0)
    weight, bias = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(3).astype(np.float32)

    def check(case):
        data, honest, lies = case
        path.write_bytes(data)
        module = torch.nn.Linear(4, 3)
        try:
            load_state_dict_into(module, path, "lin.", torch.float32, "cpu")
        except Qwen3TTSError as exc:
            assert str(path) in str(exc), f"{lies}: the error does not name the file: {exc}"
            raise
        if honest:
            assert torch.equal(module.weight, torch.from_numpy(weight)) and torch.equal(
                module.bias, torch.from_numpy(bias)), lies

    strategy = lying_safetensors({"lin.weight": weight, "lin.bias": bias}, {"format": "pt"})
    fuzz(figure, "lying headers -> checkpoint reader", strategy, check, ci_examples=400)
