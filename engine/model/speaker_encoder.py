"""ECAPA-TDNN speaker encoder (x-vector) of the Base checkpoints; keys equal those under 'speaker_encoder.'.

Input: log-mel frames [B, frames, mel_dim] from engine.model.mel. Output: one vector [B, enc_dim] per
item, used directly as a talker input position (so enc_dim equals the talker width).

Layout (module names are the checkpoint's):
  blocks.0          TDNN: conv (mel_dim -> C0, k0, d0) + ReLU
  blocks.1..n-2     SE-Res2Net: tdnn1 (1x1) -> res2net_block -> tdnn2 (1x1) -> se_block, plus the input
  mfa               TDNN over the concatenated outputs of blocks 1..n-2
  asp               attentive statistics pooling -> [B, 2 * C_last, 1]
  fc                1x1 conv to enc_dim
Every conv pads 'same' by reflection. Only whole (unpadded) batches are supported.
"""
from __future__ import annotations

import torch
from torch import nn

from ..config import SpeakerEncoderConfig
from .mel import SPEAKER_MEL, log_mel_spectrogram


def _conv(c_in: int, c_out: int, kernel: int = 1, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(c_in, c_out, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class _Tdnn(nn.Module):
    """Conv1d ('same', reflect) followed by ReLU."""

    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int):
        super().__init__()
        self.conv = _conv(c_in, c_out, kernel, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


class _Res2Net(nn.Module):
    """Channels split into `scale` groups; group 0 passes through, group i>0 sees its input plus the
    previous group's output (hierarchical residual), each through its own TDNN."""

    def __init__(self, channels: int, scale: int, kernel: int, dilation: int):
        super().__init__()
        width = channels // scale
        self.scale = scale
        self.blocks = nn.ModuleList(_Tdnn(width, width, kernel, dilation) for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        groups = torch.chunk(x, self.scale, dim=1)
        out = [groups[0]]
        prev = None
        for tdnn, g in zip(self.blocks, groups[1:]):
            prev = tdnn(g if prev is None else g + prev)
            out.append(prev)
        return torch.cat(out, dim=1)


class _SqueezeExcite(nn.Module):
    """Channel gates from the time-averaged input: sigmoid(conv2(relu(conv1(mean_t x))))."""

    def __init__(self, channels: int, bottleneck: int):
        super().__init__()
        self.conv1 = _conv(channels, bottleneck)
        self.conv2 = _conv(bottleneck, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.conv2(torch.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * gate


class _SeRes2NetBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, scale: int, se_channels: int, kernel: int, dilation: int):
        super().__init__()
        self.tdnn1 = _Tdnn(c_in, c_out, 1, 1)
        self.res2net_block = _Res2Net(c_out, scale, kernel, dilation)
        self.tdnn2 = _Tdnn(c_out, c_out, 1, 1)
        self.se_block = _SqueezeExcite(c_out, se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


def _weighted_stats(x: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard deviation of x [B, C, T] over T under weights w (summing to 1 over T)."""
    mean = (w * x).sum(dim=2)
    var = (w * (x - mean.unsqueeze(2)).pow(2)).sum(dim=2)
    return mean, torch.sqrt(var.clamp(min=eps))


class _AttentiveStatsPool(nn.Module):
    """Per-channel attention over time, conditioned on the frames and their global mean/std; returns the
    attention-weighted mean and std concatenated, [B, 2C, 1]."""

    eps = 1e-12

    def __init__(self, channels: int, attention_channels: int):
        super().__init__()
        self.tdnn = _Tdnn(3 * channels, attention_channels, 1, 1)
        self.conv = _conv(attention_channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames = x.shape[-1]
        uniform = torch.full((x.shape[0], 1, frames), 1.0 / frames, dtype=x.dtype, device=x.device)
        mean, std = _weighted_stats(x, uniform, self.eps)
        context = torch.cat([x, mean.unsqueeze(2).expand_as(x), std.unsqueeze(2).expand_as(x)], dim=1)
        attn = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = _weighted_stats(x, attn, self.eps)
        return torch.cat([mean, std], dim=1).unsqueeze(2)


class SpeakerEncoder(nn.Module):
    def __init__(self, cfg: SpeakerEncoderConfig):
        super().__init__()
        ch, ks, dil = list(cfg.enc_channels), list(cfg.enc_kernel_sizes), list(cfg.enc_dilations)
        if not (len(ch) == len(ks) == len(dil)) or len(ch) < 3:
            raise ValueError("enc_channels, enc_kernel_sizes and enc_dilations must have one equal length >= 3")
        self.cfg = cfg
        blocks = [_Tdnn(cfg.mel_dim, ch[0], ks[0], dil[0])]
        for i in range(1, len(ch) - 1):
            blocks.append(_SeRes2NetBlock(ch[i - 1], ch[i], cfg.enc_res2net_scale, cfg.enc_se_channels, ks[i], dil[i]))
        self.blocks = nn.ModuleList(blocks)
        # The published checkpoints have sum(ch[1:-1]) == ch[-1]; mfa's input width is taken from config
        # the same way upstream does (ch[-1]), so a mismatching config fails at load time, not silently.
        self.mfa = _Tdnn(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = _AttentiveStatsPool(ch[-1], cfg.enc_attention_channels)
        self.fc = _conv(2 * ch[-1], cfg.enc_dim)

    @property
    def embedding_dim(self) -> int:
        return self.cfg.enc_dim

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """mel [B, frames, mel_dim] -> speaker embeddings [B, enc_dim]."""
        x = mel.transpose(1, 2)
        outs = []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        x = self.mfa(torch.cat(outs[1:], dim=1))
        return self.fc(self.asp(x)).squeeze(-1)

    @torch.inference_mode()
    def embed(self, wav24k: torch.Tensor) -> torch.Tensor:
        """Mono 24 kHz waveform [T] -> embedding [enc_dim] in the module's dtype and device.

        The mel front end runs in float32 on the waveform's device, the network in the module's dtype on
        its device (as upstream: fp32 mel, then the model's dtype). No normalisation is applied.
        """
        if wav24k.ndim != 1:
            raise ValueError(f"embed expects a mono waveform [T]; got shape {tuple(wav24k.shape)} (use to_mono)")
        mel = log_mel_spectrogram(wav24k.to(torch.float32)[None], **SPEAKER_MEL).transpose(1, 2)
        p = next(self.parameters())
        return self(mel.to(device=p.device, dtype=p.dtype))[0]
