"""A small, offline, deterministic Qwen2-style byte-level BPE vocabulary for random-weight checkpoints.

The published Qwen3-TTS text tokenizer cannot be downloaded here, so test checkpoints carry their own
vocabulary that satisfies everything upstream code relies on (OFFLINE_TESTING.md §4.2):

* byte-level: the 256 byte symbols come first, so every string encodes;
* `assistant`, `user`, `system` and `\\n` are single tokens, so the chat templates slice as upstream
  expects (`<|im_start|>assistant\\n` = 3 tokens, `<|im_end|>\\n<|im_start|>assistant\\n` = 5);
* merges for common English words, so ordinary text encodes to a plausible number of tokens;
* the special tokens sit on the ids the config names.

Two layouts: `compact` (960 BPE tokens, specials from 960; `text_vocab_size` 1024) and `full` (the BPE
tokens, then unreachable fillers up to 151643, so the specials land on their published ids).
"""
from __future__ import annotations

import json
from pathlib import Path

BPE_SIZE = 960  # BPE tokens (bytes + merges) in both layouts
FULL_SPECIAL_BASE = 151643  # first special id of the published Qwen2/Qwen3 vocabulary

# (content, special) in id order from the special base: the 26 Qwen3 added tokens, then the 7 audio/TTS
# tokens of the Qwen3-Omni/Qwen3-TTS vocabulary (<tts_pad> = base + 28 = 151671, as in config.json).
SPECIAL_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True),
    ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False),
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False),
    ("<|audio_start|>", True), ("<|audio_end|>", True),
    ("<tts_pad>", True), ("<tts_text_bos>", True), ("<tts_text_eod>", True), ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
)

# Words that get merges, most important first. Each is merged both bare and with a leading space.
_ROLE_WORDS = ("assistant", "user", "system")
_WORDS = (
    "the", "be", "to", "of", "and", "a", "in", "that", "have", "I", "it", "for", "not", "on", "with", "he", "as",
    "you", "do", "at", "this", "but", "his", "by", "from", "they", "we", "say", "her", "she", "or", "an", "will",
    "my", "one", "all", "would", "there", "their", "what", "so", "up", "out", "if", "about", "who", "get",
    "which", "go", "me", "when", "make", "can", "like", "time", "no", "just", "him", "know", "take", "people",
    "into", "year", "your", "good", "some", "could", "them", "see", "other", "than", "then", "now", "look",
    "only", "come", "its", "over", "think", "also", "back", "after", "use", "two", "how", "our", "work",
    "first", "well", "way", "even", "new", "want", "because", "any", "these", "give", "day", "most", "us",
    "is", "are", "was", "were", "has", "had", "Hello", "hello", "world", "The", "This", "It", "We", "You",
    "speak", "voice", "text", "speech", "audio", "today", "weather", "nice", "thank", "thanks", "please",
    "yes", "very", "much", "here", "where", "why", "more", "many", "long", "short", "test", "quick", "brown",
    "fox", "jumps", "lazy", "dog", "morning", "evening", "name", "happy", "sad", "calm", "warm", "young",
    "old", "man", "woman", "said", "story", "sound", "read", "reading", "write", "hear", "again", "never",
)


def bytes_to_symbols() -> list[str]:
    """The byte -> printable-symbol table of byte-level BPE, indexed by byte value.

    Printable Latin-1 bytes map to themselves; the other 68 bytes map, in byte order, to U+0100 onwards.
    """
    keep = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table, extra = [], 0
    for b in range(256):
        if b in keep:
            table.append(chr(b))
        else:
            table.append(chr(0x100 + extra))
            extra += 1
    return table


def _base_symbols() -> list[str]:
    """Base vocabulary order of GPT-2/Qwen2: the printable bytes first, then the remapped ones."""
    table = bytes_to_symbols()
    return [table[b] for b in range(256) if ord(table[b]) < 0x100] + [table[b] for b in range(256) if ord(table[b]) >= 0x100]


def _apply_merges(symbols: list[str], ranks: dict[tuple[str, str], int]) -> list[str]:
    """Classic BPE: repeatedly merge the adjacent pair of lowest rank."""
    while len(symbols) > 1:
        best = min(range(len(symbols) - 1), key=lambda i: ranks.get((symbols[i], symbols[i + 1]), 1 << 60))
        pair = (symbols[best], symbols[best + 1])
        if pair not in ranks:
            break
        out, i = [], 0
        while i < len(symbols):
            if i < len(symbols) - 1 and (symbols[i], symbols[i + 1]) == pair:
                out.append(symbols[i] + symbols[i + 1])
                i += 2
            else:
                out.append(symbols[i])
                i += 1
        symbols = out
    return symbols


def build_bpe(size: int = BPE_SIZE) -> tuple[list[str], list[tuple[str, str]]]:
    """Return (tokens in id order, merges in rank order) with exactly `size` tokens.

    Each target word is first encoded with the merges so far; its pieces are then folded left to right by
    new merges of lower priority, which leaves every earlier word's tokenisation untouched.
    """
    table = bytes_to_symbols()
    tokens = _base_symbols()
    known = set(tokens)
    merges: list[tuple[str, str]] = []
    ranks: dict[tuple[str, str], int] = {}
    space = table[ord(" ")]
    targets = [w for word in _ROLE_WORDS for w in (word, space + word)]
    targets += [w for word in _WORDS for w in (space + word, word)]
    for word in targets:
        pieces = _apply_merges([table[b] for b in word.replace(space, " ").encode("utf-8")], ranks)
        while len(pieces) > 1:
            if len(tokens) >= size:
                break
            pair = (pieces[0], pieces[1])
            merged = pieces[0] + pieces[1]
            if pair not in ranks:
                ranks[pair] = len(merges)
                merges.append(pair)
            if merged not in known:
                known.add(merged)
                tokens.append(merged)
            pieces = [merged] + pieces[2:]
        if len(tokens) >= size:
            break
    if len(tokens) < size:
        # The word list yields fewer tokens than `size` (909 of the default 960), so runs of spaces fill
        # the rest; deterministic, and every such token is reachable.
        run = space
        while len(tokens) < size:
            pair = (run, space)
            run += space
            if run not in known:
                ranks[pair] = len(merges)
                merges.append(pair)
                known.add(run)
                tokens.append(run)
    return tokens, merges


def _filler(i: int) -> str:
    # Never the result of a merge, so BPE can never produce it.
    return f"<|unused_{i}|>"


def vocab_layout(full: bool) -> tuple[dict[str, int], list[tuple[str, str]], int]:
    """(vocab.json mapping, merges, first special id) for the compact or the full layout."""
    tokens, merges = build_bpe()
    vocab = {tok: i for i, tok in enumerate(tokens)}
    base = BPE_SIZE
    if full:
        for i in range(BPE_SIZE, FULL_SPECIAL_BASE):
            vocab[_filler(i)] = i
        base = FULL_SPECIAL_BASE
    return vocab, merges, base


def special_token_ids(base: int) -> dict[str, int]:
    """Special token -> id when the specials start at `base`."""
    return {content: base + i for i, (content, _) in enumerate(SPECIAL_TOKENS)}


def tokenizer_config(base: int) -> dict:
    """tokenizer_config.json in the Qwen2Tokenizer layout."""
    decoder = {
        str(base + i): {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                        "single_word": False, "special": special}
        for i, (content, special) in enumerate(SPECIAL_TOKENS)
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [c for c, s in SPECIAL_TOKENS if s and c not in ("<|endoftext|>",)],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "extra_special_tokens": {},
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def write_tokenizer_files(out_dir: str | Path, *, full: bool) -> dict[str, int]:
    """Write vocab.json, merges.txt and tokenizer_config.json into `out_dir`; return the special ids.

    `full=False`: compact layout (specials from 960). `full=True`: published ids (specials from 151643).
    The output is byte-identical on every call.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab, merges, base = vocab_layout(full)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
    lines = ["#version: 0.2"] + [f"{a} {b}" for a, b in merges]
    (out / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(base), ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    return special_token_ids(base)
