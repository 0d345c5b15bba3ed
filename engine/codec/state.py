"""What a chunked codec decode carries from one chunk to the next, and the helpers every causal module uses
with it (engine/codec/decoder.py describes the pipeline).

Every stage is causal, so each module takes an optional `DecodeState`. Without one, a module sees the
whole sequence with zero left padding. With one, it prepends what it kept from the previous chunk
(conv input tails, transposed-conv overlap, the transformer's K/V of the last `sliding_window - 1`
frames and each row's absolute frame position) and keeps what the next chunk will need. A fresh state is all
zeros, which is exactly the one-pass zero padding (the transformer masks the zero K/V rows that lie
before frame 0), so one-pass and chunked decoding run the same code.

The state has static shapes and is updated in place only (its buffers are allocated on first use and
never rebound; the frame position is a device tensor), so the same chunked code runs eagerly and inside
a CUDA graph captured over the state's buffers (engine/gpu/codec_graph.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from .conv import SnakeBeta


class DecodeState:
    """What a chunked decode carries from one chunk to the next (see the module docstring).

    Buffers are created zero-filled on first use and afterwards only written in place, so a CUDA graph
    captured over them stays valid; `zero_()` turns the state back into a fresh one without reallocating.
    """

    def __init__(self) -> None:
        self.tails: dict[nn.Module, torch.Tensor] = {}  # conv input tails [B, keep, C], keyed by module
        self.kv: dict[nn.Module, tuple[torch.Tensor, torch.Tensor]] = {}  # [B, kv_heads, window-1, d] each
        self.frames: torch.Tensor | None = None  # long [B]: each row's absolute position of its next frame

    def position(self, device, batch: int) -> torch.Tensor:
        if self.frames is None:
            self.frames = torch.zeros(batch, dtype=torch.long, device=device)
        return self.frames

    def buffers(self) -> list[torch.Tensor]:
        """Every tensor of the state, in a fixed order (for zeroing, snapshots and restores)."""
        kv = [t for pair in self.kv.values() for t in pair]
        return list(self.tails.values()) + kv + ([self.frames] if self.frames is not None else [])

    @torch.inference_mode()  # decoding runs in inference mode, so the buffers are inference tensors
    def zero_(self) -> DecodeState:
        """Back to the fresh state (a new utterance), in place: one multi-tensor launch per dtype where a
        request would otherwise queue ~40 zero_ launches before its codec can start."""
        by_dtype = {}
        for t in self.buffers():
            by_dtype.setdefault((t.dtype, t.device), []).append(t)
        for group in by_dtype.values():
            torch._foreach_zero_(group)
        return self

    def snapshot(self) -> list[torch.Tensor]:
        return [t.clone() for t in self.buffers()]

    @torch.inference_mode()
    def restore(self, saved: list[torch.Tensor]) -> None:
        """Copy a snapshot back in place (the state must not have gained buffers since)."""
        mine = self.buffers()
        if len(mine) != len(saved):
            raise ValueError("DecodeState gained buffers since the snapshot")
        torch._foreach_copy_(mine, saved)

    # -- rows: a state whose rows belong to different utterances (codec_session.py, slotted decoding) --------

    @torch.inference_mode()
    def start_row(self, row: int, saved: list[torch.Tensor] | None) -> None:
        """Row `row` begins a new utterance: a fresh row (saved None), or the one-row snapshot `saved` (a state
        after an ICL reference, DecodeState.snapshot of a one-row state)."""
        mine = self.buffers()
        if saved is None:
            torch._foreach_zero_([t[row] for t in mine])  # one launch a dtype, not one a buffer
            return
        if len(mine) != len(saved):
            raise ValueError("the one-row snapshot does not match this state's buffers")
        torch._foreach_copy_([t[row] for t in mine], [t[0] for t in saved])

    def widened(self, batch: int) -> DecodeState:
        """A fresh state of `batch` rows with every buffer this one has (no decode needed to allocate them)."""
        out = DecodeState()
        out.tails = {m: t.new_zeros(batch, *t.shape[1:]) for m, t in self.tails.items()}
        out.kv = {m: (k.new_zeros(batch, *k.shape[1:]), v.new_zeros(batch, *v.shape[1:]))
                  for m, (k, v) in self.kv.items()}
        out.frames = self.frames.new_zeros(batch) if self.frames is not None else None
        return out

    def first_rows(self, rows: int) -> DecodeState:
        """A view of this state's first `rows` rows: each buffer of the view is a slice of this state's (the row
        is the first dimension, so each slice is contiguous). Decoding on the view advances those rows here, and
        a CUDA graph captured over the view reads and writes this state's buffers."""
        out = DecodeState()
        out.tails = {m: t[:rows] for m, t in self.tails.items()}
        out.kv = {m: (k[:rows], v[:rows]) for m, (k, v) in self.kv.items()}
        out.frames = self.frames[:rows] if self.frames is not None else None
        return out


def causal_window(module: nn.Module, x: torch.Tensor, keep: int, state: DecodeState | None, act: SnakeBeta | None = None,
            bias: torch.Tensor | None = None, multiple: int = 1) -> torch.Tensor:
    """x [B, L, C] as a causal conv's input [B, keep + L + pad, C]: `keep` rows of left context in front (the
    state's tail; zeros at the start or without a state), then x, or act(x + bias) when an activation is given,
    then `pad` zero rows up to a multiple of `multiple` (the folded conv's grid). With a state, the tail
    becomes the last `keep` rows of context and x.

    With an activation on CUDA the Triton SnakeBeta writes this whole window in one launch: no cat with the
    tail and no zero padding afterwards, each a full read and write of the activation."""
    b, n, c = x.shape
    pad = (-(keep + n)) % multiple
    tail = None
    if state is not None and keep:
        tail = state.tails.get(module)
        if tail is None:
            tail = state.tails[module] = x.new_zeros(b, keep, c)
    if act is not None:
        out = act(x, bias=bias, keep=keep, tail=tail, pad=pad)
    elif tail is None:
        out = F.pad(x, (0, 0, keep, pad)) if keep or pad else x
    else:
        out = torch.cat([tail, x] + ([x.new_zeros(b, pad, c)] if pad else []), dim=1)
    if tail is not None:
        tail.copy_(out[:, n: n + keep])  # in place: a captured graph keeps reading this buffer
    return out


def derived(owner: nn.Module, name: str, params: list[torch.Tensor], make):
    """make(*params), kept on `owner` until one of `params` changes (an in-place write bumps its version; .to()
    gives it new storage). Made on every call where it cannot be kept: while autograd tracks a parameter, or
    for inference tensors (made under torch.inference_mode, which keeps no version counter)."""
    if any(p.is_inference() for p in params) or (torch.is_grad_enabled() and any(p.requires_grad for p in params)):
        return make(*params)
    key = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in params)
    store = owner.__dict__.setdefault("_derived", {})  # dropped by CodecDecoder._apply (moves and casts)
    kept = store.get(name)
    if kept is None or kept[0] != key:
        with torch.no_grad():
            kept = store[name] = (key, make(*params))
    return kept[1]
