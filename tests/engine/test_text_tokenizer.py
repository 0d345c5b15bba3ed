"""engine.text_tokenizer vs transformers' Qwen2TokenizerFast and the official Qwen3TTSProcessor.

Three vocabularies: the compact one of tiny checkpoints (specials from 960), the full one of real-size
checkpoints (specials on the published ids from 151643) and a "stress" vocabulary whose extra merges
cross pre-tokenisation boundaries (space runs, newline runs, digits, punctuation + newline, case
changes), so any difference in the split regex shows up as different ids; some of its merges repeat
earlier ones (transformers keeps the first rank).
"""
from __future__ import annotations

import json
import unicodedata

import pytest

from engine.checkpoint import presets, tiny_bpe
from engine.errors import CheckpointError
from engine.text_tokenizer import TextTokenizer

TEMPLATES = (
    "<|im_start|>assistant\n{t}<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>assistant\n{t}<|im_end|>\n",
    "<|im_start|>user\n{t}<|im_end|>\n",
)
TEXTS = [
    "", "Hello world", " Hello world", "Hello, world! How are you today?", "The quick brown fox jumps over the lazy dog.",
    "HelloWorld iPhone McDonald's camelCaseWords ALLCAPS", "I'm here, you're there, we'll see, they'd go, it's DON'T",
    "a  b   c    d", "  leading and trailing  ", "tabs\tand\t\tmore\t", "line1\nline2\n\nline4\r\nline5\r\n",
    "\n\n\n", "   \n  \n", "end.\n", "a/b\n/c//\n", "12345 3.14159 1,000,000 2026-03-17 0x1F", "١٢٣ ٤٥٦",
    "你好，世界！今天天气很好。", "我爱北京天安门", "こんにちは、世界。カタカナとひらがな", "안녕하세요 세계",
    "Привет, мир!", "Ελληνικά", "مرحبا بالعالم", "नमस्ते दुनिया",
    "emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flag 🇩🇪", "café naïve résumé Ångström",
    "cafe\u0301 nai\u0308ve", "e\u0301\u0323 ﬁ ﬃ ℌ Ⅻ ①", "zero\u200bwidth\u00a0nbsp\u3000ideo",
    "<tts_pad><tts_text_bos>hi<tts_text_eod>", "<|im_start|>user\nspeak<|im_end|>", "<think>x</think><tool_call>",
    "<|im_start <|im_end| <tts_pad", "<|endoftext|>text<|endoftext|>", "<|audio_start|><|audio_pad|><|audio_end|>",
    "Speak in a warm, calm voice — slowly… and \"quoted\" 'single' `tick` (paren) [brack] {brace}",
    "mixed中文English混合123テスト", "...!!!???---___***", "   ", "\u0000\u0001\x7f", "\ud7ff\ue000\U0010ffff",
]
STRINGS = TEXTS + [tpl.format(t=t) for tpl in TEMPLATES for t in TEXTS[:20]]


def _write_dir(path, full: bool, size: str):
    tiny_bpe.write_tokenizer_files(path, full=full)
    (path / "config.json").write_text(json.dumps(presets.main_config(size, "custom_voice")))
    (path / "preprocessor_config.json").write_text(json.dumps({"processor_class": "Qwen3TTSProcessor"}))
    return path


def _stress_dir(path):
    """Compact vocabulary plus merges that only a wrong pre-tokeniser could apply."""
    _write_dir(path, full=False, size="tiny")
    vocab = json.loads((path / "vocab.json").read_text(encoding="utf-8"))
    merges = (path / "merges.txt").read_text(encoding="utf-8").splitlines()
    extra = [("Ġ", "Ġ"), ("ĠĠ", "Ġ"), ("Ċ", "Ċ"), ("Ġ", "Ċ"), ("1", "2"), ("12", "3"), (".", "Ċ"), ("/", "Ċ"),
             ("Ċ", "/"), ("o", "W"), ("l", "oW"), ("'", "s"), ("Ġ", "'"), ("e", "P"), ("ĉ", "ĉ"), ("Ġ", "ĉ"),
             ("!", "!"), (".", "."), ("Ġ", "1"), ("o", "r"), ("or", "l"), ("ä", "½"), ("ï", "¼")]
    first_special = min(int(k) for k in json.loads((path / "tokenizer_config.json").read_text())["added_tokens_decoder"])
    assert len(vocab) == first_special
    # renumber the specials: rewrite with the extra tokens appended before them
    for a, b in extra:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
        merges.append(f"{a} {b}")
    base = len(vocab)
    (path / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (path / "merges.txt").write_text("\n".join(merges) + "\n", encoding="utf-8")
    (path / "tokenizer_config.json").write_text(json.dumps(tiny_bpe.tokenizer_config(base)), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    return {
        "compact": _write_dir(root / "compact", full=False, size="tiny"),
        "full": _write_dir(root / "full", full=True, size="0.6b"),
        "stress": _stress_dir(root / "stress"),
    }


@pytest.fixture(scope="module")
def hf(dirs):
    from transformers import Qwen2TokenizerFast

    return {k: Qwen2TokenizerFast.from_pretrained(str(d)) for k, d in dirs.items()}


@pytest.fixture(scope="module")
def ours(dirs):
    return {k: TextTokenizer.from_dir(d) for k, d in dirs.items()}


@pytest.mark.parametrize("layout", ["compact", "full", "stress"])
def test_matches_qwen2_tokenizer_fast(layout, hf, ours):
    ref, tok = hf[layout], ours[layout]
    for s in STRINGS:
        want = ref(s, add_special_tokens=True)["input_ids"]
        assert tok.encode(s) == want, s
        assert tok.decode(want) == ref.decode(want), s
        assert tok.decode(want, skip_special_tokens=True) == ref.decode(want, skip_special_tokens=True), s
    assert tok.encode_batch(STRINGS[:5]) == [ref(s)["input_ids"] for s in STRINGS[:5]]


@pytest.mark.parametrize("layout", ["compact", "full", "stress"])
def test_pre_tokenizer_pieces_match(layout, hf, ours):
    ref, tok = hf[layout].backend_tokenizer, ours[layout]._tok
    for s in TEXTS:
        n = unicodedata.normalize("NFC", s)
        assert tok.pre_tokenizer.pre_tokenize_str(n) == ref.pre_tokenizer.pre_tokenize_str(n), s


def test_round_trip_is_nfc(ours):
    for tok in ours.values():
        for s in TEXTS:
            assert tok.decode(tok.encode(s)) == unicodedata.normalize("NFC", s), s


@pytest.mark.parametrize("layout", ["compact", "full"])
def test_matches_official_processor(layout, dirs, ours, tmp_path, qwen_tts):
    """The official path: AutoProcessor.from_pretrained(dir, fix_mistral_regex=True), as qwen_tts does."""
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSProcessor
    from transformers import AutoConfig, AutoProcessor

    AutoConfig.register("qwen3_tts", Qwen3TTSConfig, exist_ok=True)
    AutoProcessor.register(Qwen3TTSConfig, Qwen3TTSProcessor, exist_ok=True)
    proc = AutoProcessor.from_pretrained(str(dirs[layout]), fix_mistral_regex=True)
    mistral = TextTokenizer.from_dir(dirs[layout], split="mistral_fix")
    for s in STRINGS:
        want = proc(text=s)["input_ids"][0]
        assert ours[layout].encode(s) == want, s
        assert mistral.encode(s) == want, s  # our vocabularies have no merges across split boundaries
        assert ours[layout].decode(want) == proc.decode(want), s
    # transformers 4.57.3 swaps the split regex on large vocabularies when config.json names 4.57.3, so
    # the official path splits like split="mistral_fix" on the full vocabulary and like "qwen2" otherwise.
    pattern = repr(proc.tokenizer.backend_tokenizer.pre_tokenizer)
    assert ("Lu" in pattern) == (layout == "full"), pattern
    same = mistral if layout == "full" else ours[layout]
    official_pre = proc.tokenizer.backend_tokenizer.pre_tokenizer
    for s in TEXTS:
        n = unicodedata.normalize("NFC", s)
        assert same._tok.pre_tokenizer.pre_tokenize_str(n) == official_pre.pre_tokenize_str(n), s
    diverge = "HelloWorld a/\n/b"
    assert [p for p, _ in mistral._tok.pre_tokenizer.pre_tokenize_str(diverge)] == ["Hello", "World", "Ġa", "/Ċ/", "b"]
    assert [p for p, _ in ours[layout]._tok.pre_tokenizer.pre_tokenize_str(diverge)] == ["HelloWorld", "Ġa", "/Ċ", "/b"]


@pytest.mark.parametrize("layout", ["compact", "full"])
def test_template_slicing(layout, ours):
    tok = ours[layout]
    assert len(tok.encode("<|im_start|>assistant\n")) == 3
    assert len(tok.encode("<|im_end|>\n<|im_start|>assistant\n")) == 5
    assert len(tok.encode("<|im_end|>\n")) == 2
    for word in ("assistant", "user", "system", "\n"):
        assert len(tok.encode(word)) == 1, word
    ids = tok.encode("<|im_start|>assistant\nHello world<|im_end|>\n<|im_start|>assistant\n")
    assert tok.decode(ids[3:-5]) == "Hello world"
    ids = tok.encode("<|im_start|>assistant\nHi there.<|im_end|>\n")
    assert tok.decode(ids[3:-2]) == "Hi there."
    assert len(tok.encode(" the quick brown fox")) == 4  # common words are merged


def test_special_ids(ours):
    full, compact = ours["full"], ours["compact"]
    for name, real_id in presets.REAL_TEXT_IDS.items():
        token = {"im_start": "<|im_start|>", "im_end": "<|im_end|>", "tts_pad": "<tts_pad>",
                 "tts_bos": "<tts_text_bos>", "tts_eos": "<tts_text_eod>"}[name]
        assert full.token_to_id(token) == real_id
        assert compact.token_to_id(token) == presets.TINY_TEXT_IDS[name]
        assert full.encode(token) == [real_id]
    assert full.token_to_id("<|endoftext|>") == 151643
    assert full.vocab_size == 151643 + len(tiny_bpe.SPECIAL_TOKENS) == 151676
    assert compact.vocab_size == 960 + 33
    assert full.eos_token == "<|im_end|>" and full.pad_token == "<|endoftext|>"
    assert len(full.special_ids) == 33


def test_tiny_bpe_is_deterministic(tmp_path):
    a = tiny_bpe.write_tokenizer_files(tmp_path / "a", full=False)
    b = tiny_bpe.write_tokenizer_files(tmp_path / "b", full=False)
    assert a == b
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_errors(tmp_path, dirs):
    import shutil

    with pytest.raises(CheckpointError, match="does not exist"):
        TextTokenizer.from_dir(tmp_path / "nope")
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        d = tmp_path / f"no_{name}"
        shutil.copytree(dirs["compact"], d)
        (d / name).unlink()
        with pytest.raises(CheckpointError, match=name.replace(".", r"\.")):
            TextTokenizer.from_dir(d)
    d = tmp_path / "bad_json"
    shutil.copytree(dirs["compact"], d)
    (d / "vocab.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="vocab.json is not valid JSON"):
        TextTokenizer.from_dir(d)
    d = tmp_path / "bad_merge"
    shutil.copytree(dirs["compact"], d)
    with open(d / "merges.txt", "a", encoding="utf-8") as f:
        f.write("zzq qqz\n")
    with pytest.raises(CheckpointError, match="merges.txt line"):
        TextTokenizer.from_dir(d)
    d = tmp_path / "mismatch"
    shutil.copytree(dirs["compact"], d)
    (d / "tokenizer_config.json").write_text(json.dumps(tiny_bpe.tokenizer_config(151643)))
    with pytest.raises(CheckpointError, match="do not belong together"):
        TextTokenizer.from_dir(d)
    with pytest.raises(ValueError):
        TextTokenizer.from_dir(dirs["compact"], split="gpt4")
