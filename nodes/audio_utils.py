"""AUDIO and take helpers (no ComfyUI imports; torch only).

ComfyUI's AUDIO is `{"waveform": float32 [B, C, T], "sample_rate": int}`. Our generators put N takes in
the batch, zero-padded to the longest, and carry every take's real length under `LENGTHS_KEY`, so that
PickTake and the web players can trim the padding. Nodes that rebuild the dict drop the key; then every
take is taken at full length. `ORIGIN_KEY` says where the takes come from (the node, its seed and first
take: take i is the engine's stream (seed, first_take + i)), so PickTake can show what re-renders a take.

Long text is generated as several segments; `join_segments` (whole takes) and `StreamJoiner` (streamed
chunks of one take) join them identically: a short raised-cosine fade at each inner boundary plus a
short silence, so segment joins never click. The concatenation of everything `StreamJoiner` emits is
bit-identical to `join_segments` on the same segments.
"""
from __future__ import annotations

import math

import torch

LENGTHS_KEY = "qwen3tts_lengths"
ORIGIN_KEY = "qwen3tts_origin"
SAMPLE_RATE = 24000
FADE_S = 0.005
GAP_S = 0.12


def make_audio(waveform: torch.Tensor, lengths: list[int], sample_rate: int = SAMPLE_RATE,
               origin: dict | None = None, copy: bool = True) -> dict:
    """[N, T] (or [T]) float audio + per-take lengths (+ origin {node, seed, first_take}) -> AUDIO dict with
    waveform [N, 1, T] on the CPU, zero past each take's length. copy=False: the waveform is the caller's to
    give away (an engine result), so a float32 CPU one is used as it is, its padding zeroed in place; a copy
    of a 4-take line's audio into new memory costs the host several ms."""
    if waveform.dim() == 1:
        waveform = waveform.unsqueeze(0)
    if waveform.dim() != 2:
        raise ValueError(f"expected [takes, samples], got shape {tuple(waveform.shape)}")
    n, t = waveform.shape
    lengths = [int(x) for x in lengths]
    if len(lengths) != n or any(x < 0 or x > t for x in lengths):
        raise ValueError(f"lengths {lengths} do not fit a batch of {n} takes x {t} samples")
    wav = waveform.detach()
    if wav.device.type != "cpu" or wav.dtype != torch.float32:
        wav = wav.to("cpu", torch.float32)  # new memory already
    elif copy:
        wav = wav.clone()
    with torch.inference_mode(wav.is_inference()):  # an engine result is an inference tensor: written as one
        for i, n_i in enumerate(lengths):
            wav[i, n_i:] = 0.0
    audio = {"waveform": wav.unsqueeze(1).contiguous(), "sample_rate": int(sample_rate), LENGTHS_KEY: lengths}
    if origin is not None:
        audio[ORIGIN_KEY] = dict(origin)
    return audio


def results_audio(results: list, sample_rate: int = SAMPLE_RATE, origin: dict | None = None) -> dict:
    """The AUDIO of a generator's segments, one engine Result each in order: joined (join_segments) and
    handed to make_audio without another copy (the results are the caller's)."""
    wav, lengths = join_segments([(res.audio, list(res.lengths)) for res in results], sample_rate)
    return make_audio(wav, lengths, sample_rate, origin, copy=False)


def take_lengths(audio: dict) -> list[int]:
    """Real length of every take; the full length when the dict carries no (consistent) lengths."""
    wav = audio["waveform"]
    n, t = wav.shape[0], wav.shape[-1]
    lengths = audio.get(LENGTHS_KEY)
    if isinstance(lengths, (list, tuple)) and len(lengths) == n and all(0 <= int(x) <= t for x in lengths):
        return [int(x) for x in lengths]
    return [t] * n


def take_origin(audio: dict, index: int) -> dict | None:
    """{node, seed, take} of take `index` (take = the first_take that renders it alone), or None."""
    origin = audio.get(ORIGIN_KEY)
    if not isinstance(origin, dict) or "seed" not in origin or "first_take" not in origin:
        return None
    return {"node": origin.get("node"), "seed": int(origin["seed"]), "take": int(origin["first_take"]) + index}


def pick_take(audio: dict, index: int) -> dict:
    """One take of a batch as its own AUDIO [1, C, length], padding trimmed (its origin follows it)."""
    wav = audio["waveform"]
    n = wav.shape[0]
    if not 0 <= index < n:
        raise IndexError(f"take index {index} is out of range: the batch has {n} take(s), indices 0..{n - 1}")
    length = take_lengths(audio)[index]
    out = {"waveform": wav[index:index + 1, :, :length].clone(), "sample_rate": audio["sample_rate"],
           LENGTHS_KEY: [length]}
    origin = take_origin(audio, index)
    if origin is not None:
        out[ORIGIN_KEY] = {"node": origin["node"], "seed": origin["seed"], "first_take": origin["take"]}
    return out


def batch_item(audio: dict, index: int) -> torch.Tensor:
    """Batch item `index` of an AUDIO as [C, T] (trimmed to its take length when known)."""
    wav = audio.get("waveform") if isinstance(audio, dict) else None
    if not isinstance(wav, torch.Tensor):
        raise ValueError(f"AUDIO must be a dict with a 'waveform' tensor [batch, channels, samples], got "
                         f"{type(wav if isinstance(audio, dict) else audio).__name__}; connect an AUDIO output "
                         "(e.g. LoadAudio)")
    if wav.dim() != 3:
        raise ValueError(f"AUDIO waveform must be [batch, channels, samples], got {tuple(wav.shape)}")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < wav.shape[0]:
        raise IndexError(f"batch_index {index!r} is out of range: the AUDIO holds {wav.shape[0]} item(s)")
    return wav[index, :, : take_lengths(audio)[index]]


def _ramp_up(n: int) -> torch.Tensor:
    j = torch.arange(n, dtype=torch.float64)
    return (0.5 - 0.5 * torch.cos(math.pi * (j + 0.5) / n)).to(torch.float32)


class _Fades:
    def __init__(self, sample_rate: int, fade_s: float, gap_s: float):
        self.f = max(1, round(sample_rate * fade_s))
        self.gap = round(sample_rate * gap_s)
        self.up = _ramp_up(self.f)
        self.down = self.up.flip(0)

    def fade_in(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """Multiply positions [start, start+len) of a segment by the fade-in ramp where it applies."""
        if start >= self.f or x.numel() == 0:
            return x
        m = min(self.f - start, x.numel())
        x = x.clone()
        x[:m] = x[:m] * self.up[start:start + m]
        return x

    def fade_out(self, tail: torch.Tensor) -> torch.Tensor:
        """`tail` is the last min(F, L) samples of a segment."""
        m = tail.numel()
        return tail * self.down[self.f - m:] if m else tail


def join_segments(segments: list[tuple[torch.Tensor, list[int]]], sample_rate: int = SAMPLE_RATE,
                  fade_s: float = FADE_S, gap_s: float = GAP_S) -> tuple[torch.Tensor, list[int]]:
    """Join per-segment batches ([N, T_k] audio, per-take lengths) into one [N, T] batch + lengths."""
    if not segments:
        raise ValueError("nothing to join")
    if len(segments) == 1:
        wav, lengths = segments[0]
        return wav, list(lengths)
    fades = _Fades(sample_rate, fade_s, gap_s)
    n = segments[0][0].shape[0]
    takes = []
    last = len(segments) - 1
    for i in range(n):
        parts = []
        for k, (wav, lengths) in enumerate(segments):
            x = wav[i, : lengths[i]].to(torch.float32)
            if k > 0:
                x = fades.fade_in(x, 0)
            if k < last:
                m = min(fades.f, x.numel())
                x = torch.cat([x[: x.numel() - m], fades.fade_out(x[x.numel() - m:]), torch.zeros(fades.gap)])
            parts.append(x)
        takes.append(torch.cat(parts))
    lengths = [t.numel() for t in takes]
    out = torch.zeros(n, max(lengths))
    for i, t in enumerate(takes):
        out[i, : t.numel()] = t
    return out, lengths


class StreamJoiner:
    """Streaming twin of `join_segments` for one take: push chunks, get pieces ready to send.

    Holds back only the last fade length (5 ms) of the current segment so it can fade it out when the
    segment turns out to be finished.
    """

    def __init__(self, n_segments: int, sample_rate: int = SAMPLE_RATE, fade_s: float = FADE_S,
                 gap_s: float = GAP_S):
        self.n = n_segments
        self.fades = _Fades(sample_rate, fade_s, gap_s)
        self.k = 0  # current segment
        self.pos = 0  # samples of the current segment received so far
        self.hold = torch.zeros(0)

    def push(self, samples: torch.Tensor) -> torch.Tensor:
        x = samples.reshape(-1).to(torch.float32)
        if self.n == 1:
            return x
        if self.k > 0:
            x = self.fades.fade_in(x, self.pos)
        self.pos += x.numel()
        buf = torch.cat([self.hold, x])
        keep = min(self.fades.f, buf.numel())
        self.hold = buf[buf.numel() - keep:]
        return buf[: buf.numel() - keep]

    def end_segment(self) -> torch.Tensor:
        """Close the current segment; returns its held tail (faded, plus the gap unless it was the last)."""
        if self.n == 1:
            self.k += 1
            return torch.zeros(0)
        tail = self.hold
        self.hold = torch.zeros(0)
        self.pos = 0
        last = self.k >= self.n - 1
        self.k += 1
        if last:
            return tail
        return torch.cat([self.fades.fade_out(tail), torch.zeros(self.fades.gap)])


def play_order(chunks, n_segments: int, sample_rate: int = SAMPLE_RATE):
    """One take of `n_segments` segments streamed as rows of one batch (Engine.stream's Chunks, item =
    segment, in any arrival order) -> (chunk, pieces) per chunk: the audio ready to play after it, in play order
    and joined as StreamJoiner joins it. The segment playing sends its audio as it comes; a later segment's is
    held until every earlier one has ended."""
    joiner = StreamJoiner(n_segments, sample_rate)
    held = [[] for _ in range(n_segments)]  # audio of segments after the one playing, in arrival order
    ended = [False] * n_segments
    turn = 0  # the segment whose audio is being played
    for chunk in chunks:
        out = []
        if chunk.item == turn:
            out.append(joiner.push(chunk.audio))
        elif chunk.audio.numel():
            held[chunk.item].append(chunk.audio)
        ended[chunk.item] = chunk.final
        while turn < n_segments and ended[turn]:  # its turn is over: the next segment's held audio goes out
            out.append(joiner.end_segment())
            turn += 1
            if turn < n_segments:
                out.extend(joiner.push(x) for x in held[turn])
                held[turn] = []
        yield chunk, [x for x in out if x.numel()]
