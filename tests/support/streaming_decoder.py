"""A reference chunked decoder for the codec tests: a growing code sequence decoded chunk by chunk, whose
concatenated output equals a one-pass decode (the engine itself decodes through engine/codec_session.py).

Two ways, both behind `StreamingDecoder.push`:

* stateful (`context_frames=None`, the default): every causal stage keeps what the next chunk needs
  (conv input tails, transposed-conv overlap, the transformer's K/V of the last sliding_window - 1
  frames and the absolute frame position; see decoder.DecodeState). Each push costs only its own
  frames, and the result equals one pass for ANY weights, because nothing is truncated. The state has
  static shapes, so on CUDA each chunk size can be replayed as a captured graph (engine/gpu/codec_graph.py).
* windowed re-decode (`context_frames=N`): each push decodes [last N frames + new frames] from a fresh
  start and keeps the new frames' audio. Fixed-shape work (easy to capture in a graph), but exact only
  while N covers the decoder's effective receptive field, which depends on the weights.
"""
from __future__ import annotations

import torch
from torch import nn

from engine.codec.decoder import CodecDecoder, DecodeState
from engine.errors import InvalidInputError

# Why streaming carries state instead of re-decoding a window: the left context a window would need is the
# theoretical receptive field, 8 layers x 71 frames of sliding-window attention + 11.4 frames of causal
# convs = 579.4 -> 580 frames. Measured with a perturbation probe (docs/PERFORMANCE_NOTES.md; CPU fp32, random
# weights by the OFFLINE_TESTING.md §4.1 rules): on the real-size decoder a frame-0 perturbation still moves the
# transformer output 517 frames later (> 1e-7) and the waveform at the end of a 204-frame test (> 1e-5);
# windows with 80 / 144 / 160 frames of context miss one-pass output by 4.8e-4 / 1.3e-4 / 1.3e-4 (tiny
# config: RF 149 frames = its 2 x 71 + 11 bound). No shorter context is exact, hence the stateful default.


def _as_decoder(obj) -> CodecDecoder:
    dec = obj if isinstance(obj, CodecDecoder) else getattr(obj, "decoder", None)
    if not isinstance(dec, CodecDecoder):
        raise TypeError(f"StreamingDecoder needs a SpeechTokenizer or CodecDecoder, got {type(obj).__name__}")
    return dec


class StreamingDecoder:
    """Decode a growing code sequence chunk by chunk; concatenated output equals SpeechTokenizer.decode of all codes.

    `graphs` (an engine.gpu.codec_graph.CodecGraphs, stateful mode only) decodes every push as replays of
    its captured piece graphs (any push size); the output is the same as without them.
    """

    def __init__(self, tokenizer_or_decoder: nn.Module, batch: int, context_frames: int | None = None,
                 graphs=None):
        if batch < 1:
            raise InvalidInputError(f"StreamingDecoder batch must be >= 1, got {batch}.")
        if context_frames is not None and context_frames < 0:
            raise InvalidInputError(f"context_frames must be >= 0 or None (stateful), got {context_frames}.")
        if context_frames is not None and graphs is not None:
            raise InvalidInputError("codec graphs serve the stateful mode only (context_frames=None).")
        self.decoder = _as_decoder(tokenizer_or_decoder)
        self.batch = batch
        self.context_frames = context_frames
        self.graphs = graphs
        shared = graphs.acquire(batch, self) if graphs is not None else None
        self._state = shared if shared is not None else DecodeState()
        self.reset()

    def reset(self) -> None:
        """Forget everything pushed so far; the next push starts a new utterance."""
        self._state.zero_()  # in place: graphs captured on these buffers stay valid
        self._history: torch.Tensor | None = None  # windowed mode: the last context_frames frames [B, Q, n]

    @torch.inference_mode()
    def prime(self, ref_codes: torch.Tensor) -> None:
        """Start a new utterance after left context that is never emitted: the ICL reference codes [R, Q].
        With codec graphs the state after them is cached per reference, so repeats cost a copy."""
        if self.graphs is not None and self.context_frames is None:
            self.decoder.check_codes(ref_codes.t()[None])
            self.graphs.prime(self._state, ref_codes, self.batch)
            return
        self.reset()
        p = next(self.decoder.parameters())
        self.push(ref_codes[None].expand(self.batch, -1, -1).to(p.device))

    @torch.inference_mode()
    def push(self, codes: torch.Tensor) -> torch.Tensor:
        """New frames [B, k, Q] -> their audio [B, k * 1920]. k may be 0 (returns an empty chunk)."""
        q = self.decoder.cfg.num_quantizers
        if not isinstance(codes, torch.Tensor) or codes.dim() != 3 or codes.shape[0] != self.batch \
                or codes.shape[2] != q:
            shape = list(codes.shape) if isinstance(codes, torch.Tensor) else type(codes).__name__
            raise InvalidInputError(f"StreamingDecoder.push expects codes [{self.batch}, frames, {q}]; got {shape}.")
        k = codes.shape[1]
        if k == 0:
            p = next(self.decoder.parameters())
            return torch.zeros(self.batch, 0, device=p.device, dtype=p.dtype)
        codes = codes.transpose(1, 2)
        self.decoder.check_codes(codes)
        if self.context_frames is None:
            if self.graphs is not None:
                return self.graphs.decode(codes, self._state)
            return self.decoder(codes, self._state, check=False)
        window = codes if self._history is None else torch.cat([self._history, codes], dim=-1)
        self._history = window[..., max(0, window.shape[-1] - self.context_frames):]
        wav = self.decoder(window, check=False)
        return wav[..., wav.shape[-1] - k * self.decoder.samples_per_frame:]
