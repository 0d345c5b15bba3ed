"""Each row's sampling settings as the frame graphs read them: rows of one decode loop may sample differently
(another temperature, greedy beside sampled, another top-k), and changing a row's settings never forces a
recapture, since the graphs read them from these static tables."""
from __future__ import annotations

import torch

from ..kernels.sample import kth_index

# One table per dtype, a row of the table per setting and a column per batch row: writing a request's settings
# is three copies, not ten fills.
SETTINGS = {torch.bool: ("do_sample", "sub_do_sample"), torch.long: ("top_k", "sub_top_k", "min_new"),
            torch.float32: ("temperature", "top_p", "penalty", "sub_temperature", "sub_top_p")}


class RowSettings:
    """`p[name]` is the [batch] device tensor of one setting (top_k and sub_top_k as kth_index positions)."""

    def __init__(self, batch: int, device, vocab: int, sub_vocab: int):
        self.vocab, self.sub_vocab = vocab, sub_vocab
        # Empty rows sample greedily (the cheapest branch) at temperature, top-p and penalty 1.
        self.tables = {dt: (torch.ones if dt == torch.float32 else torch.zeros)(len(names), batch, dtype=dt,
                                                                                device=device)
                       for dt, names in SETTINGS.items()}
        self.p = {name: self.tables[dt][i] for dt, names in SETTINGS.items() for i, name in enumerate(names)}
        self.host = {dt: t.cpu().clone() for dt, t in self.tables.items()}  # what the device tables hold
        self.held = [None] * batch  # the settings each row holds (None: the empty rows' defaults)

    def values(self, params) -> dict:
        return {"do_sample": params.do_sample, "temperature": params.temperature,
                "top_k": kth_index(params.top_k, self.vocab), "top_p": params.top_p,
                "penalty": params.repetition_penalty, "min_new": params.min_new_tokens,
                "sub_do_sample": params.subtalker_dosample, "sub_temperature": params.subtalker_temperature,
                "sub_top_k": kth_index(params.subtalker_top_k, self.sub_vocab), "sub_top_p": params.subtalker_top_p}

    def write(self, slots: list, params) -> None:
        """`params` become rows `slots`' settings. Skipped when those rows already hold them (nothing else
        writes them), which saves the copies before most requests' first frame; else one copy a table from
        fresh pinned memory, queued on the stream without waiting."""
        values = self.values(params)
        todo = [slot for slot in slots if self.held[slot] != values]
        if not todo:
            return
        for slot in todo:
            self.held[slot] = values
            for dt, names in SETTINGS.items():
                for i, name in enumerate(names):
                    self.host[dt][i, slot] = values[name]
        for dt, table in self.tables.items():
            table.copy_(self.host[dt].pin_memory() if table.is_cuda else self.host[dt], non_blocking=table.is_cuda)
