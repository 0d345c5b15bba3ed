"""The decode loop: one generator of codec frames for streaming, whole-utterance and multi-take runs.

Per frame t (QWEN3_TTS_FACTS.md §2):
  1. c0 is chosen from the talker logits (penalty, suppression, min-tokens EOS mask, sampling);
  2. the code predictor turns (talker hidden, E(c0)) into codebooks 1..15;
  3. the next talker input is the sum of the 16 codebook embeddings plus the trailing text of step t
     (or the pad embedding once the text is used up), and one talker step gives the next hidden state.

N takes of one request are N batch rows sharing one prefill. A row that emits EOS is finished: it
keeps stepping (so shapes stay fixed) but contributes no more frames. Finished flags are read on the
host once per chunk, never per frame.

The per-frame work is done by a *frame runner*: `EagerFrames` here (any device), or the CUDA-graph
runner in engine/gpu, which replays the same three steps as one captured graph. Both expose
`start(...)`, `next_frame(t) -> (codes [B, 16], valid [B])` and `finished`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from . import sampling
from .errors import GenerationInterrupted
from .prompt import Prompt
from .sampling import SamplingParams


@dataclass
class FrameChunk:
    codes: torch.Tensor  # [B, k, 16] long, on the model device
    valid: torch.Tensor  # [B, k] bool: frame is real speech for that take
    start: int  # index of the chunk's first frame
    done: bool  # no further chunk follows


def prefill(talker, prompt: Prompt, batch: int, cache) -> torch.Tensor:
    """Run the prompt once and broadcast its K/V into every row of `cache`; returns hidden [B, H]."""
    length = prompt.prefill.shape[1]
    if batch == 1:
        return talker.forward_hidden(prompt.prefill, cache, 0)[:, -1]
    single = talker.new_cache(1, length)
    hidden = talker.forward_hidden(prompt.prefill, single, 0)[:, -1]
    cache.copy_rows_from(single, length)
    return hidden.expand(batch, -1).contiguous()


def trailing_table(prompt: Prompt, max_frames: int) -> torch.Tensor:
    """Trailing text rows followed by one pad row: row min(t, T) is the text added at step t. Steps t <
    max_frames read at most rows 0..max_frames, so text beyond that is left out (every runner can hold it)."""
    return torch.cat([prompt.trailing[:max_frames], prompt.pad_embed[None]], 0)


class EagerFrames:
    """Runs each frame as ordinary PyTorch calls over the talker and its code predictor."""

    active_kernels = ()  # plain torch: no Triton kernels run here

    def __init__(self, talker):
        self.talker = talker
        self.predictor = talker.code_predictor

    def start(self, prompt: Prompt, *, takes: int, seed: int, params: SamplingParams, max_frames: int,
              eos_id: int, take_offset: int = 0) -> None:
        t = self.talker
        device = prompt.prefill.device
        self.params, self.eos_id = params, eos_id
        self.position = prompt.prefill.shape[1]
        self.cache = t.new_cache(takes, self.position + max_frames)
        self.hidden = prefill(t, prompt, takes, self.cache)
        self.trailing = trailing_table(prompt, max_frames)
        self.keys = sampling.take_keys(seed, range(take_offset, take_offset + takes), device)
        vocab = t.codec_head.weight.shape[0]
        self.banned = sampling.control_mask(vocab, eos_id, device)
        self.banned_early = self.banned.clone()
        self.banned_early[eos_id] = True  # EOS is masked until min_new_tokens frames exist
        self.seen = torch.zeros(takes, vocab, dtype=torch.bool, device=device)
        self.finished = torch.zeros(takes, dtype=torch.bool, device=device)
        self.pred_cache = self.predictor.new_cache(takes)

    def _choose_c0(self, t: int) -> torch.Tensor:
        p = self.params
        logits = self.talker.codec_logits(self.hidden).float()
        logits = sampling.penalize_repeats(logits, self.seen, p.repetition_penalty)
        logits = logits.masked_fill(self.banned_early if t < p.min_new_tokens else self.banned, float("-inf"))
        u = sampling.uniforms(self.keys, t, 0, logits.shape[-1]) if p.do_sample else None
        return sampling.choose(logits, p.do_sample, p.temperature, p.top_k, p.top_p, u)

    def next_frame(self, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.params
        c0 = self._choose_c0(t)
        self.seen.scatter_(1, c0[:, None], True)
        self.finished |= c0 == self.eos_id

        def choose_residual(logits, j):  # codebook j of frame t
            u = sampling.uniforms(self.keys, t, j, logits.shape[-1]) if p.subtalker_dosample else None
            return sampling.choose(logits, p.subtalker_dosample, p.subtalker_temperature, p.subtalker_top_k,
                                   p.subtalker_top_p, u)

        c0_embed = self.talker.embed_codec(c0)
        rest = self.predictor.predict(self.hidden, c0_embed, choose_residual, self.pred_cache)
        frame = torch.cat([c0[:, None], rest], 1)
        valid = ~self.finished

        # Next talker input: one 16-term reduction as upstream forms it, plus the trailing text of step t.
        x = self.predictor.residual_embedding_sum(rest, c0_embed)
        x = x + self.trailing[min(t, self.trailing.shape[0] - 1)]
        self.hidden = self.talker.forward_hidden(x[:, None], self.cache, self.position)[:, 0]
        self.position += 1
        return frame, valid


def decode_frames(
    runner,
    prompt: Prompt,
    *,
    takes: int,
    seed: int,
    params: SamplingParams,
    max_frames: int,
    eos_id: int,
    chunk_frames: int = 0,
    take_offset: int = 0,
    should_stop: Callable[[], bool] | None = None,
    on_frames: Callable[[int, int], None] | None = None,
    timings: dict | None = None,
) -> Iterator[FrameChunk]:
    """Yield chunks of `chunk_frames` frames (0 = a single chunk at the end) until every take has
    ended or `max_frames` frames were produced. `timings`, if given, receives the prefill seconds."""
    params.validate()
    t0 = time.perf_counter()
    runner.start(prompt, takes=takes, seed=seed, params=params, max_frames=max_frames, eos_id=eos_id,
                 take_offset=take_offset)
    if timings is not None:
        if prompt.prefill.is_cuda:
            torch.cuda.synchronize()
        timings["prefill_s"] = time.perf_counter() - t0
    per_chunk = chunk_frames if chunk_frames > 0 else max_frames
    frames, valids = [], []
    start = 0
    for t in range(max_frames):
        if should_stop is not None and should_stop():
            raise GenerationInterrupted("generation was stopped on request")
        frame, valid = runner.next_frame(t)
        frames.append(frame)
        valids.append(valid)
        last = t + 1 == max_frames
        if len(frames) == per_chunk or last:
            done = last or bool(runner.finished.all())  # the one host sync per chunk
            chunk = FrameChunk(torch.stack(frames, 1), torch.stack(valids, 1), start, done)
            start += len(frames)
            frames, valids = [], []
            if on_frames is not None:
                on_frames(start, max_frames)
            yield chunk
            if done:
                return


def collect(chunks: Iterator[FrameChunk]) -> tuple[torch.Tensor, list[int]]:
    """Concatenate chunks into codes [B, T, 16] and per-take frame counts (frames before EOS)."""
    codes, valid = [], []
    for c in chunks:
        codes.append(c.codes)
        valid.append(c.valid)
    lengths = torch.cat(valid, 1).sum(1).tolist()
    return torch.cat(codes, 1), [int(n) for n in lengths]
