"""The codec decoder's convolutions and activations: causal convs, the transposed-conv upsampler, SnakeBeta,
the ConvNeXt blocks and the waveform blocks' residual units, all on time-major [B, L, C] activations."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.snake import reference as snake_reference
from ..kernels.snake_conv1x1 import runs as snake_conv1x1_runs
from .state import DecodeState, causal_window, derived

# The waveform path runs time-major: activations are [B, L, C], contiguous, channels fastest. A conv
# sees them as a channels-last [B, C, 1, L] view (no copy) and its weight is stored channels fastest
# (_channels_fastest) once at construction, so cuDNN runs its NHWC kernels with no layout conversion at all
# (with [B, C, L] activations it converts every weight and most inputs on every call). 1x1 convs run as
# matmuls over the time-major rows (F.linear).
#
# On CUDA, dilated convs run as a plain 2-D conv over the input viewed as [B, C, L / d, d] (_folded).
# For the 384- and 192-channel wave blocks at dilation 3 and 9, cuDNN 9 picks a slow legacy implicit-GEMM
# kernel (benchmark mode too); folded they run several times faster. Time-major, the fold is a free view:
# [B, L, C] is [B, L / d, d, C]. False: every conv runs as a dilated conv.
FOLD_DILATED_CONVS = True
#
# The ConvNeXt blocks' depthwise convs are the one kind that runs on a [B, C, L] copy: cuDNN's channels-last
# depthwise conv builds a slow plan for each new input length, which adds up over the codec's capture at load;
# the two layout copies cost a few microseconds.


def _channels_fastest(weight: torch.Tensor) -> nn.Parameter:
    """A conv weight [A, B, k] with the same values, stored k-major with dim 1 fastest: viewed as [A, B, 1, k]
    it is channels-last (state_dict loading copies into it and keeps the layout)."""
    relaid = weight.detach().transpose(1, 2).contiguous().transpose(1, 2)
    return nn.Parameter(relaid, requires_grad=weight.requires_grad)


def _as_nchw(x: torch.Tensor) -> torch.Tensor:
    """[B, L, C] -> the same memory as a channels-last [B, C, 1, L]."""
    return x.transpose(1, 2).unsqueeze(2)


def _as_nlc(y: torch.Tensor) -> torch.Tensor:
    """A conv's [B, O, 1, L] output (channels-last when its input and weight were) -> [B, L, O]."""
    return y.squeeze(2).transpose(1, 2)


class CausalConv1d(nn.Module):
    """Stride-1 conv that sees only the present and the past: (kernel - 1) * dilation zeros on the left."""

    def __init__(self, in_ch: int, out_ch: int, kernel_size: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(in_ch, out_ch, kernel_size, dilation=dilation, groups=groups)
        self.conv.weight = _channels_fastest(self.conv.weight)
        self.left = (kernel_size - 1) * dilation

    def forward(self, x: torch.Tensor, state: DecodeState | None = None, with_bias: bool = True,
                act: SnakeBeta | None = None, act_bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, L, C] -> [B, L, O]. with_bias=False leaves the bias out (the caller adds it, fused). act: the
        SnakeBeta in front of this conv (of x + act_bias), run as part of building the input window."""
        n = x.shape[1]
        conv = self.conv
        fold = FOLD_DILATED_CONVS and x.is_cuda and conv.dilation[0] > 1 and conv.groups == 1
        x = causal_window(self, x, self.left, state, act, act_bias, conv.dilation[0] if fold else 1)
        bias = conv.bias if with_bias else None
        if conv.kernel_size[0] == 1 and conv.groups == 1:  # a 1x1 conv is a matmul over time-major rows
            return F.linear(x, conv.weight.squeeze(-1), bias)
        if conv.groups > 1:  # depthwise (ConvNeXt): on [B, C, L] (see the note above FOLD_DILATED_CONVS)
            y = F.conv1d(x.transpose(1, 2).contiguous(), conv.weight, bias, groups=conv.groups)
            return y.transpose(1, 2).contiguous()
        if fold:
            return self._folded(x, bias, n)
        y = F.conv2d(_as_nchw(x), conv.weight.unsqueeze(2), bias, dilation=(1, conv.dilation[0]))
        return _as_nlc(y)

    def _folded(self, x: torch.Tensor, bias: torch.Tensor | None, n: int | None = None) -> torch.Tensor:
        """The dilated conv as a (k, 1) conv of x [B, L, C] viewed as [B, L / d, d, C] (zero-padded at the end
        to a multiple of d, unless causal_window already did), i.e. a channels-last [B, C, L / d, d]: output
        t = h * d + w sums x[t + j * d] over taps j, exactly the dilated conv's terms; the n real outputs are
        kept (a slice of time, no copy). n: the real length, when x carries causal_window's end padding."""
        d = self.conv.dilation[0]
        n = x.shape[1] - self.left if n is None else n
        pad = (-x.shape[1]) % d
        if pad:
            x = F.pad(x, (0, 0, 0, pad))
        b, length, c = x.shape
        grid = x.view(b, length // d, d, c).permute(0, 3, 1, 2)  # [B, C, H, d], channels-last
        y = F.conv2d(grid, self.conv.weight.unsqueeze(-1), bias)  # [B, O, H, d], channels-last
        return y.permute(0, 2, 3, 1).reshape(b, -1, y.shape[1])[:, :n]


class CausalConvTranspose1d(nn.Module):
    """Transposed conv (upsample by `stride`) whose overhang past the last input is cut off.

    Output block n (samples n*stride .. n*stride+stride-1) depends on inputs n, n-1, ...,
    n - (kernel-1)//stride only, so chunks need that many previous inputs as context.
    """

    def __init__(self, in_ch: int, out_ch: int, kernel_size: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(in_ch, out_ch, kernel_size, stride=stride)
        self.conv.weight = _channels_fastest(self.conv.weight)
        self.stride = stride
        self.context = (kernel_size - 1) // stride

    def _run(self, x: torch.Tensor, with_bias: bool) -> torch.Tensor:
        bias = self.conv.bias if with_bias else None
        y = F.conv_transpose2d(_as_nchw(x), self.conv.weight.unsqueeze(2), bias, stride=(1, self.stride))
        return _as_nlc(y)

    def forward(self, x: torch.Tensor, state: DecodeState | None = None, act: SnakeBeta | None = None,
                with_bias: bool = True) -> torch.Tensor:
        """x [B, L, C] -> [B, L * stride, O]; act: the SnakeBeta in front (fused into the input window).
        with_bias=False leaves the bias out (the caller adds it where the output is read)."""
        n = x.shape[1]
        if state is None:
            return self._run(x if act is None else act(x), with_bias)[:, : n * self.stride]
        x = causal_window(self, x, self.context, state, act)
        start = self.context * self.stride
        return self._run(x, with_bias)[:, start: start + n * self.stride]


class SnakeBeta(nn.Module):
    """x + sin²(x·e^α) / (e^β + 1e-9), with α and β stored on a log scale (per channel).

    e^α and 1 / (e^β + 1e-9) are computed once per parameter version and kept (`params`): the same ops on
    the same values as computing them every call, so the output is bit for bit the same. With a kernels
    table whose "snake" is active (CodecDecoder.use_kernels), CUDA inputs run as one Triton launch
    (engine/kernels/snake.py: torch's rounding points, within one ulp of torch's CUDA result) instead of
    torch's five elementwise kernels.
    """

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))
        self.kernels = None  # engine.kernels.Kernels, or None: torch ops

    @property
    def _params(self) -> tuple | None:
        """What params() keeps: (key, (freq, inv_mag)), or None before its first call and after a move."""
        return self.__dict__.get("_derived", {}).get("params")

    def params(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(freq, inv_mag) [C] in the parameters' dtype, kept (derived) unless autograd tracks α or β or they
        are inference tensors. The kept pair follows in-place updates (load_state_dict, copy_) and moves (.to);
        a write through `.data` bypasses the version counter (assign new parameters instead)."""
        return derived(self, "params", [self.alpha, self.beta], lambda a, b: (a.exp(), 1.0 / (b.exp() + 1e-9)))

    def forward(self, x: torch.Tensor, state: DecodeState | None = None, bias: torch.Tensor | None = None,
                keep: int = 0, tail: torch.Tensor | None = None, pad: int = 0) -> torch.Tensor:
        """x [B, L, C]; `bias` [C]: the previous conv's bias, added here (one launch fewer, and one pass less
        over the activation, when the Triton kernel runs; the same values either way). keep / tail / pad: the
        result as the next causal conv's input window (causal_window), [B, keep + L + pad, C]. Without the kernel
        it is the kernel's torch reference (engine/kernels/snake.py), the same expression."""
        freq, inv_mag = self.params()
        ks = self.kernels
        b, n, c = x.shape
        if ks is not None and "snake" in ks.active and x.is_cuda and b * (keep + n + pad) * c < 2 ** 30:  # int32
            return ks.snake(x, freq, inv_mag, bias, keep=keep, tail=tail, pad=pad)
        return snake_reference(x, freq, inv_mag, bias, keep=keep, tail=tail, pad=pad)


class ConvNeXtBlock(nn.Module):
    """Depthwise causal conv (k=7) -> LayerNorm -> 4x MLP with GELU -> γ-scaled residual."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor, state: DecodeState | None = None) -> torch.Tensor:
        h = self.pwconv2(self.act(self.pwconv1(self.norm(self.dwconv(x, state)))))  # time-major: no transposes
        return x + self.gamma * h


class ResidualUnit(nn.Module):
    """SnakeBeta -> dilated causal conv (k=7) -> SnakeBeta -> 1x1 conv, plus the input."""

    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, 1)

    def forward(self, x: torch.Tensor, state: DecodeState | None = None, x_bias: torch.Tensor | None = None
                ) -> torch.Tensor:
        """x_bias: a bias not yet added to x (the wave block's transposed conv's), added where x is read."""
        h = self.conv1(x, state, with_bias=False, act=self.act1, act_bias=x_bias)  # its bias goes into act2
        ks, conv2 = self.act2.kernels, self.conv2.conv
        if ks is not None and "snake_conv1x1" in ks.active and h.is_cuda and snake_conv1x1_runs(h, conv2.out_channels):
            # act2, the 1x1 conv and the residual add in one launch (the 96- and 192-channel units): no pass over
            # the activation or the conv output
            return ks.snake_conv1x1(h, *self.act2.params(), self.conv1.conv.bias, conv2.weight.squeeze(-1), conv2.bias,
                                    x, x_bias)
        y = self.conv2(self.act2(h, bias=self.conv1.conv.bias), state)
        return (x if x_bias is None else x + x_bias) + y


class WaveBlock(nn.Module):
    """SnakeBeta -> causal transposed conv (halves channels, upsamples by `rate`) -> residual units 1, 3, 9."""

    def __init__(self, in_dim: int, out_dim: int, rate: int):
        super().__init__()
        units = [ResidualUnit(out_dim, d) for d in (1, 3, 9)]
        self.block = nn.ModuleList([SnakeBeta(in_dim), CausalConvTranspose1d(in_dim, out_dim, 2 * rate, rate), *units])

    def forward(self, x: torch.Tensor, state: DecodeState | None = None) -> torch.Tensor:
        act, upsample, *units = self.block
        # The activation writes the transposed conv's input window; the conv's bias is added where its output
        # is read, by the first unit's two launches (a separate bias add is a whole pass over the output).
        x = upsample(x, state, act=act, with_bias=False)
        x_bias = upsample.conv.bias
        for unit in units:
            x, x_bias = unit(x, state, x_bias), None
        return x
