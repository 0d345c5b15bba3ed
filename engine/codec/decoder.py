"""The 12 Hz codec decoder: 16 codebooks per frame -> 24 kHz waveform, 1920 samples per frame.

Pipeline (QWEN3_TTS_FACTS.md §8): split residual VQ lookup -> causal conv -> sliding-window transformer
-> 2 x (causal transposed conv + ConvNeXt) -> causal conv -> 4 waveform blocks (SnakeBeta, causal
transposed conv, 3 dilated residual units) -> SnakeBeta -> causal conv -> clamp to [-1, 1].

Every stage is causal and takes an optional `DecodeState` (engine/codec/state.py), so one-pass and chunked
decoding run the same code, eagerly or inside a CUDA graph (engine/gpu/codec_graph.py). The stages live in
conv.py (convolutions, SnakeBeta, ConvNeXt and waveform blocks), transformer.py and quantizer.py.

Module and parameter names equal the official decoder's, so the `decoder.*` tensors of
speech_tokenizer/model.safetensors load with `load_state_dict(strict=True)`.
"""
from __future__ import annotations

import torch
from torch import nn

from ..errors import InvalidInputError
from .config import DecoderConfig
from .conv import CausalConv1d, CausalConvTranspose1d, ConvNeXtBlock, SnakeBeta, WaveBlock
from .quantizer import SplitQuantizer
from .state import DecodeState
from .transformer import SlidingTransformer

__all__ = ["CausalConv1d", "CausalConvTranspose1d", "CodecDecoder", "DecodeState", "SnakeBeta"]


class CodecDecoder(nn.Module):
    """codes [B, num_quantizers, T] (0..codebook_size-1) -> waveform [B, T * samples_per_frame] in [-1, 1]."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.samples_per_frame = cfg.samples_per_frame
        self.quantizer = SplitQuantizer(cfg)
        self.pre_conv = CausalConv1d(cfg.codebook_dim, cfg.latent_dim, 3)
        self.pre_transformer = SlidingTransformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalConvTranspose1d(cfg.latent_dim, cfg.latent_dim, r, r), ConvNeXtBlock(cfg.latent_dim)])
            for r in cfg.upsampling_ratios
        )
        stages: list[nn.Module] = [CausalConv1d(cfg.latent_dim, cfg.decoder_dim, 7)]
        for i, rate in enumerate(cfg.upsample_rates):
            stages.append(WaveBlock(cfg.decoder_dim >> i, cfg.decoder_dim >> (i + 1), rate))
        out_dim = cfg.decoder_dim >> len(cfg.upsample_rates)
        stages += [SnakeBeta(out_dim), CausalConv1d(out_dim, 1, 7)]
        self.decoder = nn.ModuleList(stages)

    def _apply(self, fn, recurse=True):
        """Moves and casts (.to, .cpu, .half...) drop what derived() kept for the old parameters: kept, it would
        hold device memory after Engine.release() moved the weights to the CPU."""
        for m in self.modules():
            m.__dict__.pop("_derived", None)
        self.__dict__.pop("_blank", None)
        return super()._apply(fn, recurse)

    def use_kernels(self, kernels) -> None:
        """Run the SnakeBeta activations through `kernels` (an engine.kernels.Kernels table; its "snake"
        runs as Triton on CUDA inputs) or, with None, as torch ops. Set it before capturing graphs."""
        for m in self.modules():
            if isinstance(m, SnakeBeta):
                m.kernels = kernels

    def check_codes(self, codes: torch.Tensor) -> None:
        """Raise InvalidInputError unless codes is an integer tensor [B, num_quantizers, T>=1] in range."""
        q, size = self.cfg.num_quantizers, self.cfg.codebook_size
        if not isinstance(codes, torch.Tensor) or codes.dtype.is_floating_point or codes.dtype.is_complex \
                or codes.dtype == torch.bool:
            got = codes.dtype if isinstance(codes, torch.Tensor) else type(codes).__name__
            raise InvalidInputError(f"codec codes must be an integer tensor (torch.long), got {got}.")
        if codes.dim() != 3 or codes.shape[1] != q or codes.shape[0] < 1 or codes.shape[2] < 1:
            raise InvalidInputError(
                f"codec decoder expects codes of shape [batch, {q}, frames] with batch, frames >= 1; "
                f"got {list(codes.shape)}."
            )
        lo, hi = torch.stack(torch.aminmax(codes)).tolist()  # one reduction, one host sync
        if lo < 0 or hi >= size:
            raise InvalidInputError(
                f"codec codes must lie in 0..{size - 1}; got values from {lo} to {hi}. Pad frames (-1) and "
                "control tokens (>= 2048) must be removed before decoding."
            )

    def fresh_state(self, batch: int) -> DecodeState:
        """A fresh state of `batch` rows with every buffer allocated. The buffers' shapes come from one row's
        decode of a zero frame, made once and kept (a move or cast drops it), not at every loop's start."""
        blank = self.__dict__.get("_blank")
        if blank is None:
            blank = DecodeState()
            codes = torch.zeros(1, self.cfg.num_quantizers, 1, dtype=torch.long, device=next(self.parameters()).device)
            with torch.inference_mode():
                self(codes, blank, check=False)
            self.__dict__["_blank"] = blank
        return blank.widened(batch)

    def state_after(self, ref_codes: torch.Tensor) -> DecodeState:
        """A one-row state after ICL reference codes [R, Q] (left context, never emitted), its buffers allocated."""
        state = DecodeState()
        self(ref_codes.t()[None].to(next(self.parameters()).device), state, check=False)
        return state

    def forward(self, codes: torch.Tensor, state: DecodeState | None = None, check: bool = True) -> torch.Tensor:
        """Decode codes [B, Q, T]. With `state`, this call continues the previous chunk exactly."""
        if check:
            self.check_codes(codes)
        codes = codes.long()
        h = self.pre_conv(self.quantizer.decode(codes), state)  # [B, T, latent]: time-major from here on
        h = self.pre_transformer(h, state)
        if state is not None:
            state.position(codes.device, codes.shape[0]).add_(codes.shape[-1])
        for stage in self.upsample:
            for layer in stage:
                h = layer(h, state)
        *body, act, out_conv = self.decoder
        for layer in body:
            h = layer(h, state)
        h = out_conv(h, state, act=act)  # the last SnakeBeta writes the output conv's input window
        return h.clamp(-1.0, 1.0).squeeze(2)
