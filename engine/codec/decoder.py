"""The 12 Hz codec decoder: 16 codebooks per frame -> 24 kHz waveform, 1920 samples per frame.

Pipeline (QWEN3_TTS_FACTS.md §8): split residual VQ lookup -> causal conv -> sliding-window transformer
-> 2 x (causal transposed conv + ConvNeXt) -> causal conv -> 4 waveform blocks (SnakeBeta, causal
transposed conv, 3 dilated residual units) -> SnakeBeta -> causal conv -> clamp to [-1, 1].

Every stage is causal, so each module takes an optional `DecodeState`. Without one, a module sees the
whole sequence with zero left padding. With one, it prepends what it kept from the previous chunk
(conv input tails, transposed-conv overlap, the transformer's K/V of the last `sliding_window - 1`
frames and the absolute frame position) and keeps what the next chunk will need. A fresh state is all
zeros, which is exactly the one-pass zero padding (the transformer masks the zero K/V rows that lie
before frame 0), so one-pass and chunked decoding run the same code.

The state has static shapes and is updated in place only (its buffers are allocated on first use and
never rebound; the frame position is a device tensor), so the same chunked code runs eagerly and inside
a CUDA graph captured over the state's buffers (engine/gpu/codec_graph.py).

Module and parameter names equal the official decoder's, so the `decoder.*` tensors of
speech_tokenizer/model.safetensors load with `load_state_dict(strict=True)`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InvalidInputError
from ..kernels.snake import reference as snake_reference
from ..kernels.snake_conv1x1 import runs as snake_conv1x1_runs
from ..model.layers import RMSNorm, RotaryEmbedding, SwiGLU, apply_rope, sdpa
from .config import DecoderConfig


class DecodeState:
    """What a chunked decode carries from one chunk to the next (see the module docstring).

    Buffers are created zero-filled on first use and afterwards only written in place, so a CUDA graph
    captured over them stays valid; `zero_()` turns the state back into a fresh one without reallocating.
    """

    def __init__(self) -> None:
        self.tails: dict[nn.Module, torch.Tensor] = {}  # conv input tails [B, keep, C], keyed by module
        self.kv: dict[nn.Module, tuple[torch.Tensor, torch.Tensor]] = {}  # [B, kv_heads, window-1, d] each
        self.frames: torch.Tensor | None = None  # long [1]: absolute position of the next frame

    def position(self, device) -> torch.Tensor:
        if self.frames is None:
            self.frames = torch.zeros(1, dtype=torch.long, device=device)
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
        for dst, src in zip(mine, saved):
            dst.copy_(src)


def _window(module: nn.Module, x: torch.Tensor, keep: int, state: DecodeState | None, act: SnakeBeta | None = None,
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


def _derived(owner: nn.Module, name: str, params: list[torch.Tensor], make):
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


# ----------------------------------------------------------------------------------------------------
# Convolutions and activations
# ----------------------------------------------------------------------------------------------------
# The waveform path runs time-major: activations are [B, L, C], contiguous, channels fastest. A conv
# sees them as a channels-last [B, C, 1, L] view (no copy) and its weight is stored channels fastest
# (_channels_fastest) once at construction, so cuDNN runs its NHWC kernels with no layout conversion at all.
# With [B, C, L] activations and weights it converted every weight (and most inputs) on every call: 39
# nchwToNhwc launches, 21% of a 1-frame piece's kernel time on an H100 / H200, plus the transposes around
# the ConvNeXt blocks and the transformer. 1x1 convs run as matmuls over the time-major rows (F.linear).
#
# On CUDA, dilated convs run as a plain 2-D conv over the input viewed as [B, C, L / d, d] (_folded).
# For the 384- and 192-channel wave blocks at dilation 3 and 9, cuDNN 9 picks its legacy
# implicit_convolve_sgemm (0.45-0.6 ms a conv for a 32-frame piece on an H200; 6 ms at 16 rows; benchmark
# mode picks the same); folded they take 0.06-0.1 ms (bench/results/codec_pieces_h200.md). Time-major,
# the fold is a free view: [B, L, C] is [B, L / d, d, C]. False: every conv runs as a dilated conv.
FOLD_DILATED_CONVS = True
#
# The ConvNeXt blocks' depthwise convs are the one kind that runs on a [B, C, L] copy: cuDNN's channels-last
# depthwise conv builds its plan for each new input length in ~0.22 s on an H100 (every other conv of a
# piece: 2-3.5 ms; its NCHW depthwise plan: the same), which put ~1 s on the codec capture at load; the two
# layout copies cost a few microseconds (bench/codec_first_run.py, first_piece16_conv_shapes_ms).


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
        x = _window(self, x, self.left, state, act, act_bias, conv.dilation[0] if fold else 1)
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
        to a multiple of d, unless _window already did), i.e. a channels-last [B, C, L / d, d]: output
        t = h * d + w sums x[t + j * d] over taps j, exactly the dilated conv's terms; the n real outputs are
        kept (a slice of time, no copy). n: the real length, when x carries _window's end padding."""
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
        x = _window(self, x, self.context, state, act)
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
        """(freq, inv_mag) [C] in the parameters' dtype, kept (_derived) unless autograd tracks α or β or they
        are inference tensors. The kept pair follows in-place updates (load_state_dict, copy_) and moves (.to);
        a write through `.data` bypasses the version counter (assign new parameters instead)."""
        return _derived(self, "params", [self.alpha, self.beta], lambda a, b: (a.exp(), 1.0 / (b.exp() + 1e-9)))

    def forward(self, x: torch.Tensor, state: DecodeState | None = None, bias: torch.Tensor | None = None,
                keep: int = 0, tail: torch.Tensor | None = None, pad: int = 0) -> torch.Tensor:
        """x [B, L, C]; `bias` [C]: the previous conv's bias, added here (one launch fewer, and one pass less
        over the activation, when the Triton kernel runs; the same values either way). keep / tail / pad: the
        result as the next causal conv's input window (_window), [B, keep + L + pad, C]. Without the kernel
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


# ----------------------------------------------------------------------------------------------------
# Sliding-window transformer
# ----------------------------------------------------------------------------------------------------
class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class _RMSNorm(RMSNorm):
    """The transformer's RMSNorm as torch's one rms_norm op (fused on CUDA: 2 kernels instead of 8), then the
    weight: the same rounding points as RMSNorm (normalised in fp32, rounded to x.dtype, then scaled; rms_norm
    computes half-precision inputs in fp32 itself, a float64 input is normalised in fp32 as RMSNorm does)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float() if x.dtype == torch.float64 else x
        return self.weight * F.rms_norm(x32, (x.shape[-1],), eps=self.eps).to(x.dtype)


def _merged_rows(owner: nn.Module, name: str, linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The linears' weights (and biases) stacked by output rows, made once and kept (_derived): one matmul
    computes every output row as the separate ones do."""
    biases = [lin.bias for lin in linears if lin.bias is not None]
    params = [lin.weight for lin in linears] + biases
    n = len(linears)

    def make(*ps):
        return torch.cat(ps[:n]), (torch.cat(ps[n:]) if len(ps) > n else None)

    return _derived(owner, name, params, make)


class SlidingAttention(nn.Module):
    """Causal self-attention in which frame i sees frames i - window + 1 .. i (RoPE, no q/k norm)."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        h, d, bias = cfg.hidden_size, cfg.head_dim, cfg.attention_bias
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=bias)
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, d
        self.window = cfg.sliding_window

    def forward(self, x, cos, sin, mask, state: DecodeState | None = None) -> torch.Tensor:
        """`mask` [n, keys] from SlidingTransformer.mask (keys = n, or window - 1 + n with a state)."""
        b, n, _ = x.shape
        h, hk = self.heads, self.kv_heads
        weight, bias = _merged_rows(self, "_qkv", [self.q_proj, self.k_proj, self.v_proj])
        qkv = F.linear(x, weight, bias).view(b, n, h + 2 * hk, self.head_dim)  # q, k, v in one matmul
        qk = apply_rope(qkv[:, :, : h + hk], cos[:, None], sin[:, None])  # RoPE on q and k in one pass
        q, k = qk[:, :, :h].transpose(1, 2), qk[:, :, h:].transpose(1, 2)
        v = qkv[:, :, h + hk:].transpose(1, 2)
        if state is not None:  # fixed-size past: the last window - 1 keys (zeros before frame 0, masked)
            past = state.kv.get(self)
            if past is None:
                zeros = k.new_zeros(b, self.kv_heads, self.window - 1, self.head_dim)
                past = state.kv[self] = (zeros, zeros.clone())
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
            keep = self.window - 1
            past[0].copy_(k[:, :, k.shape[2] - keep:])
            past[1].copy_(v[:, :, v.shape[2] - keep:])
        if self.kv_heads != self.heads:
            rep = self.heads // self.kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = sdpa(q, k, v, attn_mask=mask, scale=self.head_dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.self_attn = SlidingAttention(cfg)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        """SwiGLU with gate and up in one matmul."""
        mlp = self.mlp
        weight, _ = _merged_rows(self, "_gate_up", [mlp.gate_proj, mlp.up_proj])
        gate_up = F.linear(x, weight)
        inter = gate_up.shape[-1] // 2
        return mlp.down_proj(F.silu(gate_up[..., :inter]) * gate_up[..., inter:])

    def forward(self, x, cos, sin, mask, state: DecodeState | None = None) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, mask, state))
        return x + self.mlp_layer_scale(self._mlp(self.post_attention_layernorm(x)))


class SlidingTransformer(nn.Module):
    """latent -> hidden projection, pre-norm layers with layer scale, final norm, hidden -> latent."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.layers = nn.ModuleList([TransformerLayer(cfg) for _ in range(cfg.num_layers)])
        self.norm = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)
        self.cfg = cfg

    def mask(self, n: int, device, first: torch.Tensor | None) -> torch.Tensor:
        """Bool [n, keys]: query i sees key j iff 0 <= i - j < window (relative to the chunk).

        One pass (first None): keys are the n frames themselves. Chunked: keys are window - 1 past
        frames then the n new ones, and past keys before frame 0 (first + j - (window - 1) < 0) are the
        zero padding of a fresh state, so they are masked too. Tensor ops only, no host sync.
        """
        past = 0 if first is None else self.cfg.sliding_window - 1
        q = torch.arange(n, device=device)[:, None]
        k = torch.arange(-past, n, device=device)[None, :]
        mask = (k <= q) & (k > q - self.cfg.sliding_window)
        if first is not None:
            mask = mask & (k + first >= 0)
        return mask

    def forward(self, x: torch.Tensor, state: DecodeState | None = None) -> torch.Tensor:
        """x [B, T, latent] -> [B, T, latent]; positions continue from state.frames when chunked."""
        h = self.input_proj(x)
        n = h.shape[1]
        first = state.position(h.device) if state is not None else None
        pos = torch.arange(n, device=h.device)
        if first is not None:
            pos = pos + first  # integers < 2^24 become exact fp32 angles: the same as one pass
        cos, sin = self.rotary(pos, h.dtype)
        mask = self.mask(n, h.device, first)
        for layer in self.layers:
            h = layer(h, cos, sin, mask, state)
        return self.output_proj(self.norm(h))


# ----------------------------------------------------------------------------------------------------
# Split residual vector quantizer (decode side only)
# ----------------------------------------------------------------------------------------------------
class Codebook(nn.Module):
    """Codebook stored as running sums: vector = embedding_sum / max(cluster_usage, 1e-5)."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def lookup(self, codes: torch.Tensor) -> torch.Tensor:
        # Look up, then divide: the same one division per element as dividing the whole table first.
        return F.embedding(codes, self.embedding_sum) / self.cluster_usage.clamp(min=1e-5)[codes][..., None]


class _CodebookSlot(nn.Module):
    """Holds one codebook under the name `_codebook` (the official nesting)."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self._codebook = Codebook(size, dim)


class _CodebookList(nn.Module):
    def __init__(self, count: int, size: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleList([_CodebookSlot(size, dim) for _ in range(count)])


class ResidualGroup(nn.Module):
    """A run of residual codebooks summed in a narrow space, then projected out (1x1 conv, no bias).

    `input_proj` serves only the encoder side; it is kept so the checkpoint's keys load strictly.
    """

    def __init__(self, count: int, size: int, dim: int, io_dim: int):
        super().__init__()
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)
        self.vq = _CodebookList(count, size, dim)

    def _codewords(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(every codebook's vectors stacked [count * size, dim], each codebook's offset in it [count, 1]), kept
        (_derived): embedding_sum / max(cluster_usage, 1e-5), the same division per element as Codebook.lookup."""
        books = [slot._codebook for slot in self.vq.layers]
        count = len(books)

        def make(*ps):
            table = torch.cat([s / u.clamp(min=1e-5)[:, None] for s, u in zip(ps[:count], ps[count:])])
            offsets = torch.arange(count, device=table.device)[:, None] * books[0].embedding_sum.shape[0]
            return table, offsets

        return _derived(self, "_table", [b.embedding_sum for b in books] + [b.cluster_usage for b in books], make)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, K, T] -> [B, T, io_dim] (time-major): the K lookups in one embedding, summed in one op."""
        table, offsets = self._codewords()
        vectors = F.embedding(codes + offsets, table)  # [B, K, T, dim]
        total = vectors[:, 0] if vectors.shape[1] == 1 else vectors.sum(1)
        return F.linear(total, self.output_proj.weight.squeeze(-1))  # the 1x1 conv on [B, T, dim]


class SplitQuantizer(nn.Module):
    """Codebook 0 (semantic) and codebooks 1..15 (acoustic) decoded separately, then added."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        dim, n_sem = cfg.codebook_dim // 2, cfg.num_semantic_quantizers
        self.n_semantic = n_sem
        self.rvq_first = ResidualGroup(n_sem, cfg.codebook_size, dim, cfg.codebook_dim)
        self.rvq_rest = ResidualGroup(cfg.num_quantizers - n_sem, cfg.codebook_size, dim, cfg.codebook_dim)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, 16, T] -> [B, T, codebook_dim]."""
        return self.rvq_first.decode(codes[:, : self.n_semantic]) + self.rvq_rest.decode(codes[:, self.n_semantic:])


# ----------------------------------------------------------------------------------------------------
# The decoder
# ----------------------------------------------------------------------------------------------------
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
        """Moves and casts (.to, .cpu, .half...) drop what _derived kept for the old parameters: kept, it would
        hold device memory after Engine.release() moved the weights to the CPU."""
        for m in self.modules():
            m.__dict__.pop("_derived", None)
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

    def forward(self, codes: torch.Tensor, state: DecodeState | None = None, check: bool = True) -> torch.Tensor:
        """Decode codes [B, Q, T]. With `state`, this call continues the previous chunk exactly."""
        if check:
            self.check_codes(codes)
        codes = codes.long()
        h = self.pre_conv(self.quantizer.decode(codes), state)  # [B, T, latent]: time-major from here on
        h = self.pre_transformer(h, state)
        if state is not None:
            state.position(codes.device).add_(codes.shape[-1])
        for stage in self.upsample:
            for layer in stage:
                h = layer(h, state)
        *body, act, out_conv = self.decoder
        for layer in body:
            h = layer(h, state)
        h = out_conv(h, state, act=act)  # the last SnakeBeta writes the output conv's input window
        return h.clamp(-1.0, 1.0).squeeze(2)
