"""Triton launches compiled for an H100 (sm_90) on a machine without a GPU, instead of run.

Triton's wheel carries ptxas, so a kernel launched through its usual launcher can be compiled to a cubin
here: inside `compile_only()`, JITFunction.run compiles the launch's signature, constexprs and options and
returns; no kernel runs and no output is computed (the self-test's comparisons are switched off). The
*_launches functions run tests/support/kernels_selftest.py's launchers at the 0.6B / 1.7B shapes in bf16, as the
decode does. Used by tests/kernels/test_kernel_compile.py (does every launcher compile?); resource_usage reads a
compiled kernel's registers and spills."""
from __future__ import annotations

import contextlib
import inspect
import os
import subprocess
import tempfile

import torch

POINTER = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.int64: "*i64",
           torch.int32: "*i32", torch.uint8: "*u8", torch.bool: "*i1"}
KERNEL_MODULES = ("linear", "qk_norm_rope_kv", "attention", "attention_o_proj", "rms_norm", "sample", "snake",
                  "snake_conv1x1", "frame_glue")
BF16 = torch.bfloat16


def linear_launches(rows: int) -> None:
    from tests.support import kernels_selftest as st

    for n, k, prologue, residual, bias in st.LINEAR_SHAPES:
        st.check_linear("cpu", BF16, rows, n, k, prologue, residual, bias)
    for producer, consumer in st.SPLIT_SUM_SHAPES:  # the deferred split-K sums, left and made
        st.check_split_sum("cpu", BF16, rows, producer, consumer)


def attention_launches(rows: int) -> None:
    """The one-program window (16, the predictor) and split-KV (256, the talker), plain and fused with RoPE;
    the talker's device-length split-KV over a 4096-position room, plain and fused; up to its rows, the
    predictor's attention fused into o_proj."""
    from engine.kernels import attention_o_proj
    from tests.support import kernels_selftest as st

    for w in (16, 256):
        st.check_attention("cpu", BF16, rows, seq=max(64, w), window=w, filled=w - 3)
        st.check_rope_attention("cpu", BF16, rows, seq=max(64, w), window=w, pos=w - 3 - rows, per_row=rows > 1)
    st.check_attention("cpu", BF16, rows, seq=4096, filled=300, per_row=rows > 1, device_length=True)
    st.check_rope_attention("cpu", BF16, rows, seq=4096, pos=300, per_row=rows > 1, device_length=True)
    if rows <= attention_o_proj.MAX_ROWS:
        st.check_attention_o_proj("cpu", BF16, rows, seq=16, window=16, pos=9, per_row=rows > 1, defer=rows == 1)


def small_launches(rows: int) -> None:
    """rms_norm, silu_mul, qk_norm_rope_kv, and sampling: the residual codebooks' bf16 logits (2048 ids, 16-bit keys),
    float32 logits at the talker's 3072, the embedding rows handed back (into the frame's slots too), and codebook
    0 with its penalty; the frame graph's glue (frame_glue) at the 0.6B and 1.7B talker widths."""
    from engine import sampling
    from engine.kernels import sample
    from tests.support import kernels_selftest as st

    st.check_rms_norm("cpu", BF16, rows, 1024)
    st.check_silu_mul("cpu", BF16, rows, 3072)
    st.check_qk_norm_rope_kv("cpu", BF16, rows, seq=64, per_row=rows > 1)
    draw = {"keys": sampling.take_keys(0, range(rows), "cpu"), "step": torch.tensor([3]), "slot": 0}
    for vocab, dtype in ((2048, BF16), (3072, torch.float32)):
        logits, settings = st.sampling_case("cpu", rows, vocab, 0, dtype=dtype)
        sample.sample(logits, *settings, **draw)
    # as a frame launches them: with the chosen ids' embedding rows, and on the 1.7B their projected rows too
    logits, settings = st.sampling_case("cpu", rows, 2048, 0, dtype=BF16)
    table, projected = torch.zeros(2048, 2048, dtype=BF16), torch.zeros(2048, 1024, dtype=BF16)
    for second in (None, projected):
        sample.sample(logits, *settings, **draw, embed=table, embed2=second)
    st.check_sample_penalty("cpu", rows)
    st.check_sample_into_slots("cpu", rows)
    for hidden in (1024, 2048):
        st.check_talker_input("cpu", BF16, rows, hidden, 128)
        st.check_frame_tail("cpu", BF16, rows, hidden)


def codec_launches(rows: int) -> None:
    """The codec's SnakeBeta and its fused residual-unit tail at the four wave blocks' widths (1-frame lengths)."""
    from tests.support import kernels_selftest as st

    for c, length in st.SNAKE_CONV1X1_SHAPES[:4]:
        st.check_snake("cpu", BF16, rows, c, length)
        st.check_snake_conv1x1("cpu", BF16, rows, c, length, x_bias=True)


def signature(jit_fn, args, kwargs):
    """(signature, constexprs, options, attrs) of one launch, as Triton's launcher would bind them: attrs marks
    the pointers and integers divisible by 16, which lets the compiler pipeline the loads through shared memory
    (without them a tile's shared memory is far below what the GPU sees)."""
    defaults = inspect.signature(jit_fn.fn).parameters
    values = dict(zip((p.name for p in jit_fn.params), args))
    options = {}
    for key, value in kwargs.items():
        (values if key in defaults else options)[key] = value
    sig, consts, attrs = {}, {}, {}
    for i, p in enumerate(jit_fn.params):
        v = values[p.name] if p.name in values else defaults[p.name].default
        aligned = not p.do_not_specialize_on_alignment and not p.do_not_specialize
        if p.is_constexpr or v is None:
            sig[p.name], consts[p.name] = "constexpr", v
        elif isinstance(v, torch.Tensor):
            sig[p.name] = POINTER[v.dtype]
            aligned = aligned and v.data_ptr() % 16 == 0
        elif isinstance(v, bool):
            sig[p.name], aligned = "i1", False
        elif isinstance(v, int):
            sig[p.name] = "i32" if -2 ** 31 <= v < 2 ** 31 else "i64"
            aligned = aligned and v % 16 == 0
        else:
            sig[p.name], aligned = "fp32", False
        if aligned and sig[p.name] != "constexpr":
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, consts, options, attrs


class NotLoaded:
    """What a compile-only `warmup()` hands back: a kernel whose binary is never loaded."""

    def _init_handles(self):
        pass


def resource_usage(compiled) -> dict:
    """Registers a thread, stack (spill) bytes a thread, static shared memory and SASS instructions of a
    compiled kernel, from the cuobjdump that Triton's wheel carries."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        text = subprocess.run([tool, "--dump-resource-usage", path], capture_output=True, text=True,
                              check=True).stdout
        sass = subprocess.run([tool, "--dump-sass", path], capture_output=True, text=True, check=True).stdout
    fields = dict(item.split(":") for line in text.splitlines() if "REG:" in line for item in line.split())
    # an instruction's line: "/*0a30*/  FFMA R1, ... ;  /* 0x... */"; a line of encoding alone has no text
    # between its comments
    instructions = sum(1 for line in sass.splitlines()
                       if line.lstrip().startswith("/*") and line.split("*/", 1)[1].strip().split("/*")[0].strip())
    return {"regs": int(fields["REG"]), "stack": int(fields["STACK"]), "shared": int(fields["SHARED"]),
            "instructions": instructions}


# An H100's (and H200's) shared memory a block may use: a launch that needs more is refused before it runs.
SHARED_LIMIT = 232448


@contextlib.contextmanager
def compile_only(on_compile=None):
    """Within: every Triton launch compiles for sm_90 and returns. Yields the distinct compiles (a dict of their
    shared memory bytes);
    on_compile(kernel name, constexprs, options, compiled kernel) is called once for each. A launch whose
    kernel needs more shared memory than SHARED_LIMIT raises OutOfResources, as Triton's runtime does."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.errors import OutOfResources
    from triton.runtime.jit import JITFunction

    from tests.support import kernels_selftest as selftest

    modules = [importlib.import_module(f"engine.kernels.{name}") for name in KERNEL_MODULES]
    done = {}  # compile key -> the kernel's shared memory bytes

    def run(self, *args, grid, warmup, **kwargs):
        sig, consts, options, attrs = signature(self, args, kwargs)
        key = (self.fn.__name__, tuple(sig.items()), repr(sorted(consts.items(), key=str)), repr(sorted(options.items())),
               repr(sorted(attrs)))
        if key not in done:
            compiled = triton.compile(ASTSource(self, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                                      options=options)
            done[key] = compiled.metadata.shared
            if on_compile is not None:
                on_compile(self.fn.__name__, consts, options, compiled)
        if done[key] > SHARED_LIMIT:
            raise OutOfResources(done[key], SHARED_LIMIT, "shared memory")
        return NotLoaded()

    saved = {"env": os.environ.pop("TRITON_INTERPRET", None), "run": JITFunction.run,
             "close": selftest._close, "verdict": selftest._verdict}
    for module in modules:
        module._kernel.cache_clear()  # built again without the interpreter (a jit made under it only interprets)
    JITFunction.run = run
    selftest._close = selftest._verdict = lambda *a, **k: None  # the outputs were never computed
    try:
        yield done
    finally:
        JITFunction.run = saved["run"]
        selftest._close, selftest._verdict = saved["close"], saved["verdict"]
        if saved["env"] is not None:
            os.environ["TRITON_INTERPRET"] = saved["env"]
        for module in modules:
            module._kernel.cache_clear()
