"""Putting a row into a batch slot: its prompt prefilled into the slot's cache rows and its trailing-text table.
Shared by the decode loop's eager runner (engine/decode.py) and the CUDA-graph runner (engine/gpu/frame_graph.py)."""
from __future__ import annotations

import torch

from .prompt import Prompt


def prefill_into(talker, prompt: Prompt, cache, slots: list) -> torch.Tensor:
    """Run the prompt once at batch 1 and copy its K/V into rows `slots` (a list) of `cache` (ragged prefill: every
    row is prefilled exactly as it would be alone). Returns the last hidden state, [1, H]."""
    length = prompt.prefill.shape[1]
    single = talker.new_cache(1, length)
    hidden = talker.forward_hidden(prompt.prefill, single, 0)[:, -1]
    cache.copy_rows_from(single, length, rows=slots)
    return hidden


def trailing_table(prompt: Prompt, max_frames: int) -> torch.Tensor:
    """Trailing text rows followed by one pad row: row min(t, T) is the text added at step t. Steps t <
    max_frames read at most rows 0..max_frames, so text beyond that is left out (every runner can hold it)."""
    return torch.cat([prompt.trailing[:max_frames], prompt.pad_embed[None]], 0)
