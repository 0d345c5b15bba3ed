"""SpeechTokenizer: the container whose state-dict keys equal speech_tokenizer/model.safetensors.

`decoder.*` is our CodecDecoder. `encoder.*` belongs to an optional module the caller builds and passes
in (only Base checkpoints need it, for ICL reference codes); CustomVoice and VoiceDesign leave it None,
and then load the file's `decoder.*` tensors only.
"""
from __future__ import annotations

import torch
from torch import nn

from ..errors import InvalidInputError
from .config import CodecConfig
from .decoder import CodecDecoder, DecodeState

# Longest sequence decoded in one pass; upstream's chunked_decode uses the same 300-frame chunks, so
# every utterance up to 24 s decodes exactly as upstream does. Longer input is decoded in 300-frame
# chunks that carry the decoder's causal state (DecodeState), which equals one pass over all frames.
ONE_PASS_FRAMES = 300


class SpeechTokenizer(nn.Module):
    def __init__(self, cfg: CodecConfig, encoder: nn.Module | None = None, decoder: CodecDecoder | None = None):
        super().__init__()
        self.cfg = cfg
        self.decoder = decoder if decoder is not None else CodecDecoder(cfg.decoder)  # a loaded one, or fresh
        self.encoder = encoder

    @property
    def samples_per_frame(self) -> int:
        return self.decoder.samples_per_frame

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor, max_frames_per_pass: int = ONE_PASS_FRAMES) -> torch.Tensor:
        """codes [B, T, Q] (frame-major) -> waveform [B, T * 1920] in [-1, 1].

        T <= max_frames_per_pass: one pass (what upstream does for <= 300 frames). Longer: chunks of
        max_frames_per_pass that carry the causal state, so the result equals one pass over all T frames
        (upstream instead re-decodes with only 25 frames of left context there, which is not exact).
        """
        if not isinstance(codes, torch.Tensor) or codes.dim() != 3:
            shape = list(codes.shape) if isinstance(codes, torch.Tensor) else type(codes).__name__
            raise InvalidInputError(
                f"SpeechTokenizer.decode expects codes [batch, frames, {self.cfg.decoder.num_quantizers}]; got {shape}."
            )
        if max_frames_per_pass < 1:
            raise InvalidInputError(f"max_frames_per_pass must be >= 1, got {max_frames_per_pass}.")
        codes = codes.transpose(1, 2)
        self.decoder.check_codes(codes)
        if codes.shape[-1] <= max_frames_per_pass:
            return self.decoder(codes, check=False)
        state = DecodeState()
        parts = [self.decoder(codes[..., s: s + max_frames_per_pass], state, check=False)
                 for s in range(0, codes.shape[-1], max_frames_per_pass)]
        return torch.cat(parts, dim=-1)
