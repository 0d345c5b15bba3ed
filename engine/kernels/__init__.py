"""Optional Triton kernels for the single-token decode step, the graphed sampling and the codec's SnakeBeta
(alone, and with a residual unit's 1x1 conv and residual add).

Importing this package never imports Triton: each kernel module builds its Triton function on first
use. Every kernel module holds the kernel, its launcher and a plain-torch `reference` with the same
numerics as engine/gpu/fused_layers.py (sample.choose for the sampling); the reference is the "off"
path and the test oracle.

Use:
    ks, why = select(mode, device)   # mode "auto" | "on" | "off"
    ks.active                        # names of the kernels that run as Triton
    ks.rms_norm(x, w, eps) ...       # dispatches to Triton or to the reference

A `Kernels` object belongs to one engine instance (FusedStack / GraphedFrames hold it); nothing is patched
on any class. Apply it before capturing graphs: a graph records whichever path ran at capture.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import threading

from ..errors import Qwen3TTSError

# rope_attention: qk_norm_rope_kv and attention in one launch (attention.rope_attention); without it the
# decode step runs them as two (each by its own switch). attention_o_proj: those and the o_proj linear in one
# launch where it fits (one row, a short window: the code predictor at one take).
# snake_conv1x1: the codec residual unit's SnakeBeta, 1x1 conv and residual add in one launch.
# frame_glue: the frame graph's steps between the predictor and the talker, and after the talker (frame_glue.py).
NAMES = ("linear", "rms_norm", "qk_norm_rope_kv", "attention", "rope_attention", "attention_o_proj", "sample",
         "frame_glue", "snake", "snake_conv1x1")
MODES = ("auto", "on", "off")


class KernelUnavailableError(Qwen3TTSError):
    """kernels="on" was asked for on a machine where the Triton kernels cannot run."""


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def emulate_rne(dtype) -> bool:
    """A kernel's EMULATE_RNE: the interpreter's fp32 -> bf16 cast truncates, so there bf16 rounding is done on
    the bits (linear._round); compiled kernels cast with round-to-nearest-even."""
    import torch

    return dtype == torch.bfloat16 and interpreting()


def available(device=None) -> tuple[bool, str]:
    """(True, what runs) when the Triton kernels can run on `device` (default: cuda), else (False, why).

    Under TRITON_INTERPRET=1 the kernels also run on CPU tensors (slowly: tests only)."""
    import torch

    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed (pip install triton)"
    dev = torch.device(device) if device is not None else torch.device("cuda")
    if interpreting():
        return True, "triton interpreter (TRITON_INTERPRET=1)"
    if dev.type != "cuda":
        return False, f"the Triton kernels need a CUDA device (got {dev.type})"
    if not torch.cuda.is_available():
        return False, "CUDA is not available"
    major, _ = torch.cuda.get_device_capability(dev)
    if major < 8:
        return False, f"needs compute capability >= 8.0 (bf16); device has {major}.x"
    try:
        import triton
    except (ImportError, OSError, RuntimeError) as exc:  # a broken install must not break "auto"
        return False, f"triton failed to import: {exc}"
    return True, f"triton {triton.__version__} on {torch.cuda.get_device_name(dev)}"


@functools.cache
def _module(name: str):
    """A kernel module (imports no Triton until a kernel runs); cached, as it is looked up on every call."""
    return importlib.import_module(f"{__name__}.{name}")


class Kernels:
    """Dispatch table of one engine instance: each op runs as Triton if its name is in `active`."""

    def __init__(self, active=(), pdl=False, counters=None, plan_rows=None):
        unknown = set(active) - set(NAMES)
        if unknown:
            raise ValueError(f"unknown kernels {sorted(unknown)}; known: {NAMES}")
        self.active = tuple(n for n in NAMES if n in active)
        self.pdl = bool(pdl) and bool(self.active)  # launch with programmatic dependent launch (pdl.py)
        # Batch invariance: every launch planned, and every fused-or-not choice made, as for this many rows
        # whatever the rows given, so a row's sums run in one order and its result is the same bits alone or
        # beside others. None: each launch is planned for its own rows (fastest).
        self.plan_rows = plan_rows
        # The split kernels' arrival counters (counters.py): this engine's own, so Engine.release can free them
        self.counters = _module("counters").Counters() if counters is None else counters

    def __repr__(self) -> str:
        return f"Kernels(active={self.active}, pdl={self.pdl}, plan_rows={self.plan_rows})"

    def _rows(self, rows: int) -> int:
        """The row count a launch of `rows` rows is planned for."""
        return self.plan_rows or rows

    def __bool__(self) -> bool:
        return bool(self.active)

    def _run(self, name, triton_fn, reference_fn, *args, triton_only=None, **kw):
        """`name`'s module: its Triton launcher (with this table's PDL setting) if active, else its reference.
        triton_only: keyword arguments only the launcher takes (hints the reference has no use for)."""
        m = _module(name)
        if name in self.active:
            return getattr(m, triton_fn)(*args, pdl=self.pdl, **(triton_only or {}), **kw)
        return getattr(m, reference_fn)(*args, **kw)

    def defers(self, producer: str, rows: int) -> bool:
        """Whether a `producer` launch ("linear", "attention_o_proj") of `rows` rows may leave its split-K sum to
        the next linear (split_sum.py): both run as Triton."""
        limit = _module("split_sum").DEFER_ROWS.get(producer, 0)
        return "linear" in self.active and producer in self.active and self._rows(rows) <= limit

    def linear(self, x, weight, defer=False, spend_residual=False, **kw):
        """x: a tensor, or a SplitSum left by a deferred launch (only ever given where the Triton linear runs).
        defer: see linear.linear (the caller asked `defers`). spend_residual: the caller reads the residual no more,
        so the result may be made in its memory (where cuBLAS runs the matmul: no copy of it first)."""
        if "linear" in self.active and self._on_cublas(x):
            return self._cublas_linear(x, weight, spend_residual=spend_residual, **kw)
        return self._run("linear", "linear", "reference", x, weight,
                         triton_only={"counters": self.counters, "defer": defer, "plan_rows": self.plan_rows}, **kw)

    def _on_cublas(self, x) -> bool:
        """Whether a linear of x's rows runs its matmul on cuBLAS (linear_plan.CUBLAS_FROM_ROWS): never where
        launches are planned alike, as cuBLAS picks its sum order by shape."""
        if self.plan_rows or isinstance(x, _module("split_sum").SplitSum):
            return False
        return x.shape[:-1].numel() >= _module("linear_plan").CUBLAS_FROM_ROWS

    def _cublas_linear(self, x, weight, prologue="none", norm_weight=None, eps=1e-6, bias=None, residual=None,
                       spend_residual=False):
        """The linear's torch reference with its prologue as one Triton launch (the RMSNorm, or the SwiGLU)."""
        if prologue == "rms_norm":
            x, prologue = self.rms_norm(x, norm_weight, eps), "none"
        elif prologue == "silu_mul":
            x, prologue = _module("silu_mul").silu_mul(x, pdl=self.pdl), "none"
        return _module("linear").reference(x, weight, prologue=prologue, bias=bias, residual=residual,
                                           spend_residual=spend_residual)

    def rms_norm(self, x, weight, eps):
        return self._run("rms_norm", "rms_norm", "reference", x, weight, eps)

    def qk_norm_rope_kv(self, qkv, qk_norm_weight, cos, sin_signed, eps, k_cache, v_cache, pos, nh, nkv):
        return self._run("qk_norm_rope_kv", "qk_norm_rope_kv", "reference", qkv, qk_norm_weight, cos, sin_signed,
                         eps, k_cache, v_cache, pos, nh, nkv)

    def qk_norm_rope_kv_prefill(self, qkv, qk_norm_weight, cos, sin_signed, eps, k_cache, v_cache, nh, nkv):
        return self._run("qk_norm_rope_kv", "prefill", "prefill_reference", qkv, qk_norm_weight, cos, sin_signed,
                         eps, k_cache, v_cache, nh, nkv)

    def attention(self, q, k_cache, v_cache, bias, scale, share=None, pos=None):
        """share (attention._launch): which row each row reads its prompt's K/V from. Only the kernel uses it; the
        torch reference reads each row's own copy, which holds the same values. bias None: each row attends
        positions 0..pos (the kernel reads them on the device; the reference builds the mask over the room)."""
        return self._run("attention", "attention", "reference", q, k_cache, v_cache, bias, scale, pos=pos,
                         triton_only={"share": share, "counters": self.counters, "plan_rows": self.plan_rows})

    def rope_attention(self, qkv, qk_norm_weight, cos, sin_signed, eps, k_cache, v_cache, pos, bias, scale, nh, nkv,
                       share=None):
        """qk_norm_rope_kv then attention -> [B, nkv, g, D]: one Triton launch when "rope_attention" is
        active and there are at least attention.FUSE_MIN_ROWS rows (fewer run faster as two), else the two ops."""
        fused = _module("attention")
        if "rope_attention" in self.active and self._rows(qkv.shape[0]) >= fused.FUSE_MIN_ROWS:
            return fused.rope_attention(qkv, qk_norm_weight, cos, sin_signed, eps, k_cache, v_cache, pos, bias, scale,
                                        nh, nkv, pdl=self.pdl, share=share, counters=self.counters,
                                        plan_rows=self.plan_rows)
        q = self.qk_norm_rope_kv(qkv, qk_norm_weight, cos, sin_signed, eps, k_cache, v_cache, pos, nh, nkv)
        return self.attention(q, k_cache, v_cache, bias, scale, share, pos=pos)

    def attention_o_proj(self, qkv, qk_norm_weight, cos, sin_signed, eps, k_cache, v_cache, pos, bias, scale, nh, nkv,
                         weight, residual, share=None, defer=False, spend_residual=False):
        """rope_attention, then o_proj (`weight`) with the residual added -> [B, 1, N]: one Triton launch when
        "attention_o_proj" is active and fits (attention_o_proj.fits: one row, a short window), else
        those ops by their own switches. defer: whichever launch makes o_proj may leave its sum to the next
        linear (a SplitSum) where `defers` allows it. spend_residual: see `linear`."""
        fused = _module("attention_o_proj")
        b = qkv.shape[0]
        # The fused launch takes a bias; without one (each row's length read on the device) the two ops run.
        if "attention_o_proj" in self.active and bias is not None and fused.fits(self._rows(b), bias.shape[-1]):
            return fused.attention_o_proj(qkv, qk_norm_weight, cos, sin_signed, eps, k_cache, v_cache, pos, bias, scale,
                                          nh, nkv, weight, residual, pdl=self.pdl, counters=self.counters,
                                          defer=defer and self.defers("attention_o_proj", b))
        out = self.rope_attention(qkv, qk_norm_weight, cos, sin_signed, eps, k_cache, v_cache, pos, bias, scale, nh,
                                  nkv, share)
        return self.linear(out.reshape(b, 1, nh * k_cache.shape[-1]), weight, residual=residual,
                           defer=defer and self.defers("linear", b), spend_residual=spend_residual)

    def mlp(self, x, gate_up, norm_weight, eps, down, defer=False):
        """x + down(SwiGLU(rms_norm(x) @ gate_up^T)) -> like x, as two linears: the norm in the gate/up launch's
        prologue, SwiGLU in the down launch's prologue and the residual in its epilogue. x may be a SplitSum (the
        launch before left its sum); defer: the down launch may leave its own sum to the next linear. x is spent:
        the result may be made in its memory."""
        rows = x.shape[:-1].numel()
        gu = self.linear(x, gate_up, prologue="rms_norm", norm_weight=norm_weight, eps=eps)
        return self.linear(gu, down, prologue="silu_mul", residual=_module("split_sum").made(x),
                           defer=defer and self.defers("linear", rows), spend_residual=True)

    def sample(self, logits, do_sample, temperature, k_index, top_p, **kw):
        return self._run("sample", "sample", "reference", logits, do_sample, temperature, k_index, top_p, **kw)

    def talker_input(self, rows, trailing, trailing_start, t, trailing_last, rope_table, pos):
        """The talker's next input and its RoPE angles: (x [B, H], cos [B, D], sin [B, D]) (frame_glue.py)."""
        return self._run("frame_glue", "talker_input", "talker_input_reference", rows, trailing, trailing_start, t,
                         trailing_last, rope_table, pos)

    def frame_tail(self, out, norm_weight, eps, hidden, finished, valid, t, limit, pos):
        """The talker's final norm into `hidden`, and each row's frame bookkeeping, in place (frame_glue.py)."""
        return self._run("frame_glue", "frame_tail", "frame_tail_reference", out, norm_weight, eps, hidden, finished,
                         valid, t, limit, pos)

    def snake(self, x, freq, inv_mag, bias=None, **window):
        """window: keep / tail / pad, the result laid out as the next causal conv's input (snake.py)."""
        return self._run("snake", "snake", "reference", x, freq, inv_mag, bias, **window)

    def snake_conv1x1(self, h, freq, inv_mag, h_bias, weight, bias, x, x_bias=None):
        """x [+ x_bias] + conv1x1(snake(h + h_bias)): a residual unit's second half (snake_conv1x1.py)."""
        return self._run("snake_conv1x1", "snake_conv1x1", "reference", h, freq, inv_mag, h_bias, weight, bias, x,
                         x_bias)


def select(mode: str = "auto", device=None, plan_rows=None) -> tuple[Kernels, str]:
    """Kernels for one engine instance and a sentence saying what was chosen and why.

    "off": references only. "on": all of NAMES, or KernelUnavailableError. "auto": on when available().
    plan_rows: see Kernels (the load's batch_invariant)."""
    if mode not in MODES:
        raise ValueError(f"kernels must be one of {MODES} (got {mode!r})")
    if mode == "off":
        return Kernels(), "triton kernels off (kernels='off')"
    ok, why = available(device)
    if ok and mode == "auto" and interpreting():  # the interpreter is for tests: "auto" never picks it
        ok, why = False, "TRITON_INTERPRET=1 is set (interpreter for tests only)"
    if not ok:
        if mode == "on":
            raise KernelUnavailableError(f"kernels='on' but the Triton kernels cannot run: {why}")
        return Kernels(), f"triton kernels off (auto): {why}"
    pdl, pdl_why = _pdl_choice(device)
    ks = Kernels(NAMES, pdl=pdl, plan_rows=plan_rows)
    if not interpreting():
        _prehash_triton()
    shaped = f"; every launch planned as for {plan_rows} rows (batch invariant)" if plan_rows else ""
    return ks, f"triton kernels on ({why}): {', '.join(ks.active)}; {pdl_why}{shaped}"


def _prehash_triton() -> None:
    """Start Triton's one-time cache key on a thread now, so it overlaps the weights' loading.

    The first kernel a process compiles or loads from the cache waits for Triton to hash its own
    ~500 MB library, a noticeable part of a load.
    hashlib releases the GIL, so the thread runs beside the loader. The result is cached by Triton; if
    the first kernel comes before the thread is done, Triton computes it again, as it would have anyway."""
    try:
        from triton.runtime.cache import triton_key
    except ImportError:
        return

    def run():
        with contextlib.suppress(Exception):  # only a head start: the first kernel computes (and reports) it
            triton_key()

    threading.Thread(target=run, name="triton-cache-key", daemon=True).start()


def _pdl_choice(device) -> tuple[bool, str]:
    """Programmatic dependent launch rides with the kernels where the device has it (Hopper+)."""
    from . import pdl

    ok, why = pdl.support(device)
    return ok, "programmatic dependent launch on" if ok else f"programmatic dependent launch off: {why}"
