"""Qwen2 byte-level BPE text tokenizer, built from vocab.json + merges.txt + tokenizer_config.json.

Published Qwen3-TTS checkpoints ship no tokenizer.json, so the pipeline is assembled here with the
`tokenizers` library: NFC normalisation, the Qwen2 pre-tokenisation regex, byte-level mapping, BPE without
an unknown token, and the added tokens of `added_tokens_decoder` matched verbatim inside the text.
"""
from __future__ import annotations

from pathlib import Path

from . import checks
from .config import read_json
from .errors import CheckpointError

# Qwen2 pre-tokenisation: English contractions, letter runs with one optional leading non-letter, single
# digits, punctuation runs (with trailing newlines), newline runs, and whitespace runs.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# What transformers 4.57.3 substitutes for it when loading with `fix_mistral_regex=True` (as qwen-tts 0.1.1
# does) a local directory whose vocabulary has > 100000 entries and whose config.json names a
# transformers_version in (4.57.2, 5.0.0), e.g. the published "4.57.3": case-change splits, no contraction
# rule, `/` kept with trailing newlines. Offered for bit-parity with that official path only.
MISTRAL_FIX_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPLIT_REGEXES = {"qwen2": QWEN2_SPLIT, "mistral_fix": MISTRAL_FIX_SPLIT}

_FILES_HINT = (
    "The text tokenizer files (vocab.json, merges.txt, tokenizer_config.json) sit next to config.json in "
    "the checkpoint directory; copy them from the published model repository."
)


def _read_json(path: Path) -> dict:
    return read_json(path, "tokenizer file", _FILES_HINT)


def _read_merges(path: Path, vocab: dict[str, int]) -> list[tuple[str, str]]:
    if not path.is_file():
        raise CheckpointError(f"missing tokenizer file {path}. {_FILES_HINT}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{path} is not UTF-8 text ({exc}); re-download that file.") from exc
    merges: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line or (lineno == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or parts[0] not in vocab or parts[1] not in vocab or parts[0] + parts[1] not in vocab:
            raise CheckpointError(
                f"{path} line {lineno} is not a valid merge for vocab.json ({line!r}); the two files do not "
                "belong together. Re-download both from the same model repository.")
        pair = (parts[0], parts[1])
        if pair not in seen:  # a repeated merge keeps its first rank, as transformers' conversion does
            seen.add(pair)
            merges.append(pair)
    # An error, not a warning: without merges every word is spelled byte by byte, ids the model never saw in
    # training, so it would speak garbage with no other sign. An empty file is a broken download or copy.
    if not merges and any(len(token) > 1 for token in vocab):
        raise CheckpointError(f"{path} holds no merges, but vocab.json has multi-character tokens that only "
                              "merges can produce; the file is empty or cut short. Re-download merges.txt from "
                              "the same model repository as vocab.json.")
    return merges


class TextTokenizer:
    """Encode/decode text exactly as the official Qwen2TokenizerFast loaded from the same directory."""

    def __init__(self, backend, special_ids: dict[str, int], eos_token: str | None, pad_token: str | None):
        self._tok = backend
        self.special_ids = dict(special_ids)  # every added token (special or not) -> id
        self.eos_token = eos_token
        self.pad_token = pad_token

    @classmethod
    def from_dir(cls, model_dir: str | Path, *, split: str = "qwen2") -> TextTokenizer:
        """Build the tokenizer from a checkpoint directory (vocab.json, merges.txt, tokenizer_config.json).

        `split` picks the pre-tokenisation regex: "qwen2" (the tokenizer's own, default) or "mistral_fix"
        (what qwen-tts 0.1.1 on transformers 4.57.3 actually uses for a full-size vocabulary when config.json
        says transformers_version 4.57.3; see MISTRAL_FIX_SPLIT).
        """
        from tokenizers import (
            AddedToken,
            Regex,
            Tokenizer,
            decoders,
            normalizers,
            pre_tokenizers,
        )
        from tokenizers.models import BPE

        if split not in SPLIT_REGEXES:
            raise ValueError(f"split must be one of {sorted(SPLIT_REGEXES)}, got {split!r}")
        d = Path(model_dir)
        if not d.is_dir():
            raise CheckpointError(f"checkpoint directory {d} does not exist. {_FILES_HINT}")
        vocab = _read_json(d / "vocab.json")
        if not all(isinstance(v, int) for v in vocab.values()):
            raise CheckpointError(f"{d / 'vocab.json'} must map token strings to integer ids; re-download it.")
        merges = _read_merges(d / "merges.txt", vocab)
        config = _read_json(d / "tokenizer_config.json")

        tok = Tokenizer(BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None, continuing_subword_prefix="",
                            end_of_word_suffix="", fuse_unk=False, byte_fallback=False))
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(SPLIT_REGEXES[split]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=bool(config.get("add_prefix_space", False)), use_regex=False),
        ])
        tok.decoder = decoders.ByteLevel()

        added = config.get("added_tokens_decoder", {})
        if not isinstance(added, dict):
            raise CheckpointError(f"{d / 'tokenizer_config.json'}: added_tokens_decoder must be an object.")
        special_ids: dict[str, int] = {}
        for key in sorted(added, key=int):
            entry = added[key]
            content = entry["content"] if isinstance(entry, dict) else None
            if not isinstance(content, str):
                raise CheckpointError(f"{d / 'tokenizer_config.json'}: added token {key} has no 'content'.")
            token = AddedToken(content, single_word=bool(entry.get("single_word", False)),
                               lstrip=bool(entry.get("lstrip", False)), rstrip=bool(entry.get("rstrip", False)),
                               normalized=bool(entry.get("normalized", not entry.get("special", False))),
                               special=bool(entry.get("special", False)))
            tok.add_tokens([token])
            got = tok.token_to_id(content)
            if got != int(key):
                raise CheckpointError(
                    f"{d / 'tokenizer_config.json'}: added token {content!r} is declared with id {key} but lands on "
                    f"{got}; vocab.json and tokenizer_config.json do not belong together. Re-download both.")
            special_ids[content] = int(key)

        def _name(v):
            return v.get("content") if isinstance(v, dict) else v

        return cls(tok, special_ids, _name(config.get("eos_token")), _name(config.get("pad_token")))

    @property
    def vocab_size(self) -> int:
        """Number of ids including added tokens (not the model's padded embedding size)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; added tokens written inside the text become their ids; nothing is prepended."""
        return self._tok.encode(checks.text_value("text", text), add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        texts = [checks.text_value("text", t) for t in texts]
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """Text of `ids` (a list of ints or a 1-D tensor)."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
