"""The bad-input classes, written once and run through every surface that can express
them (tests/robustness/test_bad_input_classes.py): the engine API, the CLI and the ComfyUI nodes.

A case is one value of one class. `expect` is "error" (a typed project error whose message matches `hint`,
i.e. says what to do) or "ok" (input that looks odd but is valid and must simply work, such as 8 kHz or
six-channel reference audio). `kind` says which argument the case sets:

* request:   fields of engine.Request (text, language, speaker, instruct, mode) on the checkpoint `model`;
* sampling:  fields of SamplingParams (max_new_tokens, temperature, top_k, top_p, repetition_penalty);
* call:      arguments of generate/stream (takes, seed, chunk_frames);
* reference: reference audio for extract_voice (`wave` builds the array, `sr` its rate);
* voice:     a voice file (`write(path, ctx)` writes it) or a voice object (`voice`).
"""
from __future__ import annotations

import pickle
import re
import struct
import zipfile
from dataclasses import dataclass

import numpy as np
import torch

NAN, INF = float("nan"), float("inf")
SR = 24000


@dataclass
class Case:
    cls: str
    variant: str
    kind: str
    payload: dict
    expect: str = "error"
    hint: str = ""
    surfaces: tuple = ("engine", "cli", "node")
    note: str = ""

    @property
    def id(self) -> str:
        return f"{self.cls}[{self.variant}]"


CASES: list[Case] = []


def case(cls, variant, kind, expect="error", hint="", surfaces=("engine", "cli", "node"), note="", **payload):
    CASES.append(Case(cls, variant, kind, payload, expect, hint, tuple(surfaces), note))


# ---------------------------------------------------------------------------------------------------------
# text
EMPTY = r"text is empty.*type the words"
case("text: empty", "empty", "request", text="", hint=EMPTY)
case("text: whitespace", "blanks", "request", text=" \t\n\u3000 ", hint=EMPTY)
case("text: 100k characters", "100k", "request", text="word " * 20000, hint=r"Shorten the text|max_seq_len",
     surfaces=("engine", "cli"), note="nodes split long text into segments; see test_node_splits_100k_text")
case("text: control characters only", "C0 controls", "request", text="\x01\x02\x1b\x7f", hint=EMPTY)
case("text: control characters inside words", "escape codes", "request", text="Hello\x1b[31m red\x07 world.",
     expect="ok")
case("text: NUL only", "nul", "request", text="\x00\x00", hint=EMPTY)
case("text: NUL inside words", "nul", "request", text="Hello\x00 world.", expect="ok")
case("text: lone surrogate", "U+D800", "request", text="Hello \ud800 world.",
     hint=r"invalid Unicode.*remove that character", surfaces=("engine", "node"),
     note="argv cannot carry a lone surrogate")
case("text: emoji only", "emoji", "request", text="\U0001F600\U0001F389\U0001F44D", expect="ok")
case("text: right-to-left scripts", "he+ar", "request", text="\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd. "
     "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645.", expect="ok")
case("text: not a string", "int", "request", text=12345, hint=r"text must be a string", surfaces=("engine",))
case("text: not a string", "bytes", "request", text=b"Hello.", hint=r"text must be a string", surfaces=("engine",))

# ---------------------------------------------------------------------------------------------------------
# names and modes
case("language: unknown", "Klingon", "request", language="Klingon", hint=r"unknown language.*Choose one of")
case("language: dialect asked directly", "sichuan", "request", language="sichuan_dialect",
     hint=r"unknown language.*Choose one of")
case("language: not a string", "int", "request", language=3, hint=r"language must be a string", surfaces=("engine",))
case("speaker: unknown", "bob", "request", speaker="bob", hint=r"unknown speaker.*Choose one of")
case("speaker: empty", "empty", "request", speaker="", hint=r"unknown speaker.*Choose one of",
     surfaces=("engine", "node"), note="the CLI treats an empty --speaker as 'the first speaker'")
case("speaker: not a string", "list", "request", speaker=["ryan"], hint=r"speaker must be a string",
     surfaces=("engine",))
case("instruct: not a string", "dict", "request", mode="design", instruct={"calm": 1},
     hint=r"instruct must be a string", surfaces=("engine",))
case("instruct: lone surrogate", "U+DFFF", "request", mode="design", instruct="calm \udfff",
     hint=r"instruct contains invalid Unicode", surfaces=("engine", "node"))
case("mode: unknown", "sing", "request", mode="sing", model="custom_voice", hint=r"unknown mode.*use one of",
     surfaces=("engine", "cli"), note="the nodes fix the mode")
for mode, model in (("clone", "custom_voice"), ("design", "base"), ("custom", "voice_design")):
    case("mode: wrong for the checkpoint", f"{mode} on {model}", "request", mode=mode, model=model,
         hint=r"cannot do|needs a .* checkpoint|only Base checkpoints")

# ---------------------------------------------------------------------------------------------------------
# sampling settings and call arguments: zero, negative, NaN, inf, too large (and a wrong type)
RANGE = r" must be .*([\[(][^\]]*\]|between -?\d)"  # the message states the valid range


def _numbers(cls, kind, name, values, hint, ok=(), surfaces=("engine", "cli", "node")):
    # the argument's name, or the CLI option that carries it (--top-k for top_k, --chunk-frames for chunk_frames)
    hint = "(" + re.escape(name).replace("_", "[_-]") + ("|chunk-frames" if name == "chunk_frames" else "") + ")" + RANGE
    for variant, value in values.items():
        case(cls, variant, kind, expect="ok" if variant in ok else "error", hint=hint, surfaces=surfaces,
             **{name: value})


_numbers("takes", "call", "takes", {"zero": 0, "negative": -2, "NaN": NAN, "inf": INF, "too large": 10**6,
                                    "fraction": 2.5}, r"takes must be .*between 1 and")
_numbers("seed", "call", "seed", {"zero": 0, "negative": -2, "NaN": NAN, "inf": INF, "too large": 2**64,
                                  "fraction": 0.5}, r"seed must be .*between 0 and", ok=("zero",))
_numbers("max_new_tokens", "sampling", "max_new_tokens", {"zero": 0, "negative": -2, "NaN": NAN, "inf": INF,
                                                          "too large": 2**40}, r"max_new_tokens must be")
_numbers("temperature", "sampling", "temperature", {"zero": 0.0, "negative": -0.5, "NaN": NAN, "inf": INF,
                                                    "too large": 1e6}, r"temperature must be .*(greedy|typical)")
_numbers("top_k", "sampling", "top_k", {"zero": 0, "negative": -2, "NaN": NAN, "inf": INF, "too large": 2**40,
                                        "fraction": 2.5}, r"top_k must be .*disables", ok=("zero",))
_numbers("top_p", "sampling", "top_p", {"zero": 0.0, "negative": -0.5, "NaN": NAN, "inf": INF, "too large": 1.5},
         r"top_p must be .*disables")
_numbers("repetition_penalty", "sampling", "repetition_penalty",
         {"zero": 0.0, "negative": -0.5, "NaN": NAN, "inf": INF, "too large": 1e6},
         r"repetition_penalty must be .*disables")
_numbers("chunk_frames (streaming)", "call", "chunk_frames", {"zero": 0, "negative": -2, "NaN": NAN, "inf": INF,
                                                              "too large": 2**40}, r"chunk_frames must be")
for variant, value in {"negative": -2, "NaN": NAN, "inf": INF, "too large": 2**32, "fraction": 1.5}.items():
    case("first_take", variant, "call", first_take=value, hint=r"first[_-]take must be|Use a first_take of at most")
case("sampling switch: not a bool", "'yes'", "sampling", do_sample="yes", hint=r"do_sample must be True or False",
     surfaces=("engine",))


# ---------------------------------------------------------------------------------------------------------
# reference audio (extract_voice)
def tone(seconds=3.0, sr=SR, channels=1, dtype=np.float32, amp=0.3):
    t = np.arange(int(seconds * sr)) / sr
    x = amp * np.sin(2 * np.pi * (150 + 30 * np.sin(2 * np.pi * 2 * t)) * t)
    x = np.stack([np.roll(x, 13 * c) for c in range(channels)]) if channels > 1 else x
    return x.astype(dtype)


def _with(x, index, value):
    x = x.copy()
    x[..., index] = value
    return x


REF = r"reference audio"
case("reference: empty", "0 samples", "reference", wave=lambda: np.zeros(0, np.float32), sr=SR,
     hint=r"empty \(no samples\).*check the file")
case("reference: one sample", "1 sample", "reference", wave=lambda: np.full(1, 0.3, np.float32), sr=SR,
     hint=r"shorter than 1 s; use at least")
case("reference: NaN", "NaN", "reference", wave=lambda: _with(tone(), 100, NAN), sr=SR, hint=r"NaN or Inf.*re-export")
case("reference: inf", "inf", "reference", wave=lambda: _with(tone(), 100, INF), sr=SR, hint=r"NaN or Inf.*re-export")
case("reference: silent", "zeros", "reference", wave=lambda: np.zeros(3 * SR, np.float32), sr=SR,
     hint=r"silent.*check the file")
case("reference: channels that cancel out", "L = -R", "reference",
     wave=lambda: np.stack([tone(), -tone()]), sr=SR, hint=r"silent.*check the file")
case("reference: 10 minutes", "600 s at 8 kHz", "reference", wave=lambda: tone(600, 8000), sr=8000,
     hint=r"trim it to at most")
case("reference: 8 kHz", "3 s", "reference", wave=lambda: tone(3, 8000), sr=8000, expect="ok")
case("reference: 192 kHz", "3 s", "reference", wave=lambda: tone(3, 192000), sr=192000, expect="ok")
case("reference: 6 channels", "[6, T]", "reference", wave=lambda: tone(channels=6), sr=SR, expect="ok")
case("reference: float64 array", "float64", "reference", wave=lambda: tone(dtype=np.float64), sr=SR, expect="ok")
case("reference: int16 array", "int16", "reference", wave=lambda: (tone() * 32767).astype(np.int16), sr=SR,
     hint=r"float samples in \[-1, 1\].*divide by 32768", surfaces=("engine", "node"),
     note="through the CLI an int16 WAV is a normal file (see the CLI's int16 WAV case)")
case("reference: int16 WAV file", "PCM16", "reference", wave=lambda: tone(), sr=SR, pcm16=True, expect="ok",
     surfaces=("cli",))
case("reference: unscaled int16 values as float", "float32 x 32767", "reference",
     wave=lambda: tone() * 32767, sr=SR, hint=r"divide int16 samples by 32768", surfaces=("engine", "node"))
case("reference: wrong shape", "[T, 2] (channels last)", "reference", wave=lambda: tone(channels=2).T.copy(), sr=SR,
     hint=r"Pass it as \[channels, T\].*transposed", surfaces=("engine", "node"))
case("reference: wrong shape", "[1, 1, T] batch", "reference", wave=lambda: tone()[None, None], sr=SR,
     hint=r"\[T\] or \[channels, T\].*pass one item", surfaces=("engine",))
case("reference: wrong shape", "scalar", "reference", wave=lambda: np.float32(0.3), sr=SR,
     hint=r"\[T\] or \[channels, T\]", surfaces=("engine",))
case("reference: wrong shape", "AUDIO waveform [C, T] without batch", "reference", wave=lambda: tone()[None], sr=SR,
     node_waveform=True, hint=r"AUDIO waveform must be \[batch, channels, samples\]", surfaces=("node",))
case("reference: not an array", "None", "reference", wave=lambda: None, sr=SR,
     hint=r"float samples|array of samples|connect an AUDIO output",
     surfaces=("engine", "node"))
case("reference: not an array", "str", "reference", wave=lambda: "ref.wav", sr=SR, hint=r"float samples|array of samples",
     surfaces=("engine",))
case("reference: complex array", "complex64", "reference", wave=lambda: tone().astype(np.complex64), sr=SR,
     hint=r"float samples", surfaces=("engine", "node"))
for variant, sr in (("zero", 0), ("negative", -24000), ("NaN", NAN), ("inf", INF), ("too large", 10**12),
                    ("fraction", 24000.5)):
    case("reference: sample rate", variant, "reference", wave=lambda: tone(), sr=sr,
         hint=r"invalid sample rate.*whole number of Hz", surfaces=("engine", "node"))
case("reference: sample rate with no small ratio to 24 kHz", "44101 Hz", "reference", wave=lambda: tone(3, 44101),
     sr=44101, expect="ok")
case("reference: ref_text not a string", "int", "reference", wave=lambda: tone(), sr=SR, ref_text=7,
     hint=r"ref_text must be a string", surfaces=("engine",))


# ---------------------------------------------------------------------------------------------------------
# voice files (Voice.load, then the check against the model) and voice objects
def save_voice(path, tensors, meta=None):
    from safetensors.torch import save_file

    base = {"format": "qwen3tts-fast-voice", "version": "1", "family": "qwen3-tts-12hz", "model_size": "tiny"}
    base.update(meta or {})
    save_file(tensors, str(path), metadata=base)


def _good(ctx):
    return ctx["good_voice"].read_bytes()


def _emb(ctx):
    return ctx["good_embedding"]


def _write(fn):
    return lambda path, ctx: path.write_bytes(fn(ctx))


def _tensors(tensors_fn, meta_fn=lambda ctx: {}):
    def write(path, ctx):
        tensors = tensors_fn(ctx)
        emb = tensors.get("spk_embedding")
        width = {"width": str(emb.shape[0])} if emb is not None and emb.dim() == 1 else {}
        save_voice(path, tensors, {**width, **meta_fn(ctx)})
    return write


def _huge_header(ctx):
    return struct.pack("<Q", 2**62) + b'{"spk_embedding": ' + b"\x00" * 64


def _pickle(ctx):
    class_free = {"spk_embedding": [0.0] * 8, "format": "qwen3tts-fast-voice"}
    return pickle.dumps(class_free, protocol=4)


def _torch_zip(ctx):
    import io

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:  # the layout torch.save writes: a zip holding data.pkl
        z.writestr("archive/data.pkl", _pickle(ctx))
    return buf.getvalue()


def _foreign(path, ctx):
    from safetensors.torch import save_file

    save_file({"weight": torch.zeros(3)}, str(path))


VOICE = r"extract the voice again|choose a file saved by SaveVoice"
case("voice file: truncated", "half", "voice", write=_write(lambda c: _good(c)[: len(_good(c)) // 2]), hint=VOICE)
case("voice file: truncated", "header only", "voice", write=_write(lambda c: _good(c)[:8]), hint=VOICE)
case("voice file: empty", "0 bytes", "voice", write=_write(lambda c: b""), hint=VOICE)
case("voice file: random bytes", "4 KB", "voice",
     write=_write(lambda c: np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()), hint=VOICE)
case("voice file: huge header length", "2^62", "voice", write=_write(_huge_header), hint=VOICE)
case("voice file: pickle renamed to .safetensors", "pickle", "voice", write=_write(_pickle), hint=VOICE)
case("voice file: pickle renamed to .safetensors", "torch.save zip", "voice", write=_write(_torch_zip), hint=VOICE)
case("voice file: foreign safetensors", "no metadata", "voice", write=_foreign, hint=VOICE)
case("voice file: wrong tensor names", "embedding", "voice",
     write=_tensors(lambda c: {"embedding": _emb(c)}, lambda c: {"width": str(_emb(c).shape[0])}), hint=VOICE)
case("voice file: wrong tensor shape", "[2, W]", "voice",
     write=_tensors(lambda c: {"spk_embedding": _emb(c).repeat(2, 1)}, lambda c: {"width": "2"}), hint=VOICE)
case("voice file: wrong tensor shape", "ref_codes [F, 8]", "voice",
     write=_tensors(lambda c: {"spk_embedding": _emb(c), "ref_codes": torch.zeros(4, 8, dtype=torch.int32)},
                    lambda c: {"ref_text": '"Hello."'}), hint=VOICE)
case("voice file: wrong tensor dtype", "int64 embedding", "voice",
     write=_tensors(lambda c: {"spk_embedding": torch.ones(_emb(c).shape[0], dtype=torch.int64)}), hint=VOICE)
case("voice file: wrong tensor dtype", "float ref_codes", "voice",
     write=_tensors(lambda c: {"spk_embedding": _emb(c), "ref_codes": torch.zeros(4, 16)},
                    lambda c: {"ref_text": '"Hello."'}), hint=VOICE)
case("voice file: NaN embedding", "NaN", "voice",
     write=_tensors(lambda c: {"spk_embedding": torch.full_like(_emb(c), NAN)}), hint=VOICE)
case("voice file: reference codes outside the codebook", "99999", "voice",
     write=_tensors(lambda c: {"spk_embedding": _emb(c), "ref_codes": torch.full((4, 16), 99999, dtype=torch.int32)},
                    lambda c: {"ref_text": '"Hello."'}), hint=VOICE)
case("voice file: reference codes without their text", "no ref_text", "voice",
     write=_tensors(lambda c: {"spk_embedding": _emb(c), "ref_codes": torch.zeros(4, 16, dtype=torch.int32)}),
     hint=VOICE)
case("voice file: bad metadata", "ref_text not JSON", "voice",
     write=_tensors(lambda c: {"spk_embedding": _emb(c), "ref_codes": torch.zeros(4, 16, dtype=torch.int32)},
                    lambda c: {"ref_text": "{not json"}), hint=VOICE)
case("voice file: bad metadata", "width mismatch", "voice",
     write=_tensors(lambda c: {"spk_embedding": _emb(c)}, lambda c: {"width": "12"}), hint=VOICE)
case("voice file: another model size", "1b7", "voice",
     write=_tensors(lambda c: {"spk_embedding": torch.zeros(2048, dtype=torch.bfloat16)},
                    lambda c: {"model_size": "1b7"}), hint=r"do not carry over between model sizes.*extract the voice")
case("voice file: a directory", "dir", "voice", write=lambda p, c: p.mkdir(), hint=r"is a directory, not a file")
case("voice: not a Voice object", "str", "voice", voice="my_voice.safetensors", hint=r"voice must be an engine Voice",
     surfaces=("engine", "node"))


def classes() -> list[str]:
    return list(dict.fromkeys(c.cls for c in CASES))


def project_error(exc) -> BaseException | None:
    """The first project error in exc's chain (the nodes wrap engine errors with the node's name)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if any(c.__name__ == "Qwen3TTSError" for c in type(exc).__mro__):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None
