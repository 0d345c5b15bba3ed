"""Triton kernels (engine/kernels) against their plain-torch references, on CPU through Triton's
interpreter (TRITON_INTERPRET=1 for the whole process; scripts/test.sh runs this file on its own). Small row counts keep this file near a
minute on two cores; tests/gpu/test_kernels_gpu.py runs the same checks on CUDA at every decode size.

Tolerances: tests/support/kernels_selftest.py (about two ulps of the dtype; RoPE outputs absolute to the normed
magnitude; sampling ids exact, a differing row allowed only where the reference race is tied to 1e-5).
"""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed (scripts/setup_env.sh --full installs it)", allow_module_level=True)
if os.environ.get("TRITON_INTERPRET") != "1":
    # The interpreter must be chosen before triton is first imported, i.e. for the whole process:
    # scripts/test.sh runs this file in its own pytest process with TRITON_INTERPRET=1.
    pytest.skip("run with TRITON_INTERPRET=1 in its own process (scripts/test.sh does)", allow_module_level=True)

from engine import kernels
from engine.kernels.counters import SHARED
from tests.support import kernels_selftest as st

DEV = "cpu"
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
ROWS = [1, 4, 16]


def test_import_does_not_import_triton():
    code = "import sys, engine.kernels as k; k.select('off'); k.Kernels(); assert 'triton' not in sys.modules"
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=str(Path(__file__).resolve().parents[2]))


def test_select_modes():
    ks, why = kernels.select("off")
    assert ks.active == () and "off" in why
    ks, why = kernels.select("auto", "cpu")  # "auto" never picks the interpreter
    assert ks.active == () and "interpreter" in why
    ks, why = kernels.select("on", "cpu")  # asked for explicitly (tests), it runs
    assert ks.active == kernels.NAMES and "interpreter" in why
    with pytest.raises(ValueError):
        kernels.select("yes")


def test_on_without_device_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    ok, why = kernels.available("cpu")
    assert not ok and "CUDA" in why
    with pytest.raises(kernels.KernelUnavailableError, match="cannot run"):
        kernels.select("on", "cpu")
    ks, why = kernels.select("auto", "cpu")
    assert ks.active == () and "CUDA" in why


def test_off_path_is_the_reference():
    x = torch.randn(2, 1, 64)
    w = torch.randn(64)
    from engine.kernels import rms_norm

    assert torch.equal(kernels.Kernels().rms_norm(x, w, 1e-6), rms_norm.reference(x, w, 1e-6))
    assert torch.allclose(kernels.Kernels(["rms_norm"]).rms_norm(x, w, 1e-6), rms_norm.reference(x, w, 1e-6),
                          atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("n", [1024, 2048])
def test_rms_norm(dtype, m, n):
    st.check_rms_norm(DEV, dtype, m, n, seed=m + n)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b,c,length", [(1, 16, 1), (2, 8, 37), (3, 5, 300), (1, 96, 48)])
def test_snake(dtype, b, c, length):
    st.check_snake(DEV, dtype, b, c, length, seed=b + c + length)
    st.check_snake(DEV, dtype, b, c, length, seed=b + c + length, row_pad=3)  # rows at a stride
    st.check_snake(DEV, dtype, b, c, length, seed=b + c + length, bias=True)  # a conv's bias fused
    # a causal conv's input window: the state's tail (or zeros) in front, zero rows up to the folded grid
    st.check_snake(DEV, dtype, b, c, length, seed=b + c + length, keep=6, tail=True, pad=2, bias=True)
    st.check_snake(DEV, dtype, b, c, length, seed=b + c + length, keep=54, pad=(-(54 + length)) % 9, row_pad=3)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b,c,length", [(1, 4, 7), (1, 16, 5), (2, 32, 37), (3, 48, 20)])
def test_snake_conv1x1(dtype, b, c, length):
    st.check_snake_conv1x1(DEV, dtype, b, c, length, seed=b + c + length)
    st.check_snake_conv1x1(DEV, dtype, b, c, length, seed=b + c + length, x_bias=True, row_pad=3)


def test_snake_in_the_codec_decoder():
    """CodecDecoder.use_kernels routes every SnakeBeta through the table (CUDA inputs only: on CPU tensors the
    decoder keeps the torch ops even with the kernel active) and None puts the torch ops back."""
    from engine.checkpoint import presets
    from engine.codec.config import CodecConfig
    from engine.codec.decoder import CodecDecoder, SnakeBeta

    dec = CodecDecoder(CodecConfig.from_dict(presets.codec_config("tiny")).decoder)
    snakes = [m for m in dec.modules() if isinstance(m, SnakeBeta)]
    ks = kernels.Kernels(["snake"])
    dec.use_kernels(ks)
    assert snakes and all(m.kernels is ks for m in snakes)
    x = torch.randn(1, 7, snakes[0].alpha.shape[0])  # time-major [B, L, C]
    with torch.inference_mode():
        assert torch.equal(snakes[0](x), kernels.Kernels().snake(x, *snakes[0].params()))
    dec.use_kernels(None)
    assert all(m.kernels is None for m in snakes)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b", [1, 4])
def test_qk_norm_rope_kv(dtype, b):
    st.check_qk_norm_rope_kv(DEV, dtype, b, pos=5 + b, seed=b)


def test_qk_norm_rope_kv_16_rows():
    st.check_qk_norm_rope_kv(DEV, torch.bfloat16, 16, pos=31, seed=3)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_qk_norm_rope_kv_rows_at_their_own_positions(dtype):
    st.check_qk_norm_rope_kv(DEV, dtype, 4, pos=2, seed=5, per_row=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_qk_norm_rope_kv_prefill(dtype):
    st.check_qk_norm_rope_kv_prefill(DEV, dtype, 5, nh=4, nkv=2, d=32, seed=11)


def test_attention_rows_of_different_lengths():
    st.check_attention(DEV, torch.float32, 4, seq=40, window=32, filled=20, per_row=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b", [1, 4])
def test_attention_predictor_window(dtype, b):
    st.check_attention(DEV, dtype, b, seq=16, window=16, filled=2 + 3 * b, seed=b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("chunk", [None, 256], ids=["plan", "one_program"])
def test_attention_long_window(dtype, chunk):
    splits = st.check_attention(DEV, dtype, 2, seq=320, window=256, filled=200, block_n=64, chunk=chunk)["splits"]
    assert (splits > 1) == (chunk is None)


# Split-KV ("flash-decoding") path at small head shapes (G = 2 query heads per kv head) with small chunks,
# so several splits run; per-row lengths leave whole splits masked (a row of 1 position: all but one).
SMALL_HEADS = {"nh": 4, "nkv": 2, "d": 32}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("dot", [False, True], ids=["fma", "dot"])
@pytest.mark.parametrize("b,window,chunk,lengths", [
    (1, 48, 16, [40]),  # B = 1: per_row is off, the [1, 1, 1, W] bias is read as shared
    (3, 300, 64, [300, 131, 1]),  # the last chunk is partial; row 2 sees one position
    (3, 160, 32, [97, 160, 33]),
])
def test_attention_split_rows_of_different_lengths(dtype, dot, b, window, chunk, lengths):
    launch = st.check_attention(DEV, dtype, b, **SMALL_HEADS, seq=window + 8, window=window, lengths=lengths,
                                chunk=chunk, seed=window + b, config={"USE_DOT": dot})
    assert launch["splits"] == -(-window // chunk) > 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("combine", [4, 32], ids=["in_rounds", "at_once"])
def test_attention_split_combine(dtype, combine):
    """More splits than COMBINE_BLOCK: the maxima first, then the partials in rounds; up to it: one round."""
    launch = st.check_attention(DEV, dtype, 2, **SMALL_HEADS, seq=168, window=160, lengths=[160, 70], chunk=16,
                                seed=4, config={"COMBINE_BLOCK": combine})
    assert (launch["SP"] > launch["SB"]) == (combine == 4) and launch["splits"] == 10


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_attention_split_shared_bias(dtype):
    launch = st.check_attention(DEV, dtype, 3, **SMALL_HEADS, seq=140, window=128, filled=70, chunk=32, seed=9)
    assert launch["splits"] == 4


def test_attention_split_narrow_heads_skip_tensor_cores():
    """D = 8 (the tiny test checkpoints): USE_DOT falls back to FMA products (tl.dot needs 16+)."""
    st.check_attention(DEV, torch.float32, 2, nh=4, nkv=2, d=8, seq=80, window=64, lengths=[60, 3], chunk=16,
                       config={"USE_DOT": True})


@pytest.mark.parametrize("nh,nkv", [(6, 2), (2, 2)], ids=["G3", "G1"])
@pytest.mark.parametrize("dot", [False, True], ids=["fma", "dot"])
def test_attention_split_other_groups(nh, nkv, dot):
    """Query heads per kv head not a power of two (padded rows), and no GQA."""
    st.check_attention(DEV, torch.float32, 2, nh=nh, nkv=nkv, d=32, seq=100, window=96, lengths=[96, 20], chunk=32,
                       config={"USE_DOT": dot})


def test_attention_split_is_deterministic_and_rearms():
    """Two launches give the same bits (fixed combine order), and the second finds its counters at zero."""
    from engine.kernels import attention as ka

    q, kc, vc = (torch.randn(shape) for shape in ((2, 4, 32), (2, 2, 100, 32), (2, 2, 100, 32)))
    bias = torch.where(torch.arange(96)[None] < torch.tensor([[96], [40]]), 0.0, float("-inf"))[:, None, None]
    first = ka.attention(q, kc, vc, bias, 0.2, chunk=16)
    assert torch.equal(first, ka.attention(q, kc, vc, bias, 0.2, chunk=16))
    assert int(SHARED.get("attention", torch.device(DEV)).abs().sum()) == 0
    torch.testing.assert_close(first, ka.reference(q, kc, vc, bias, 0.2), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("dot", [False, True], ids=["fma", "dot"])
def test_attention_split_shared_prefix(dtype, dot):
    """Rows that read a prompt's K/V from another row's copy (takes): row 1 from row 0 below 97 (inside a block),
    row 2 from row 0 below 64 (a block edge), row 3 its own. The rows' own prefixes differ, so ignoring the
    share fails."""
    launch = st.check_attention(DEV, dtype, 4, **SMALL_HEADS, seq=168, window=160, lengths=[150, 150, 150, 120],
                                chunk=32, seed=11, config={"USE_DOT": dot},
                                share=[(0, 0), (0, 97), (0, 64), (3, 0)])
    assert launch["splits"] == 5


def test_rope_attention_split_shared_prefix():
    """The fused path: the shared prefix is read from row 0, and each row still writes its own token's k / v."""
    launch = st.check_rope_attention(DEV, torch.float32, 3, **SMALL_HEADS, seq=88, window=80, pos=70, chunk=16,
                                     share=[(0, 0), (0, 41), (0, 70)])
    assert launch["splits"] == 5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b, per_row", [(1, False), (3, True)])
def test_rope_attention_predictor_window(dtype, b, per_row):
    st.check_rope_attention(DEV, dtype, b, seq=16, window=16, pos=9, seed=b, per_row=per_row)


@pytest.mark.parametrize("pos, chunk", [(5, 16), (40, 16), (63, 32), (70, 16), (30, 64)])
def test_rope_attention_split_owner_writes(pos, chunk):
    """The split holding pos writes the token's k / v (70: past the window, the last split does)."""
    launch = st.check_rope_attention(DEV, torch.float32, 2, **SMALL_HEADS, seq=80, window=64, pos=pos,
                                     per_row=True, chunk=chunk)
    assert launch["splits"] == 64 // chunk


# Device length (no bias): one grid for every length up to the caches' room; each row cuts its own length, read
# from its position on the device, into at most `want` chunks, and the programs past its count return at once.
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("dot", [False, True], ids=["fma", "dot"])
@pytest.mark.parametrize("combine", [4, 32], ids=["in_rounds", "at_once"])
def test_attention_device_length(dtype, dot, combine):
    """Rows of 300, 131 and 1 positions in a 320-position room: 19, 9 and 1 of the grid's 20 splits work."""
    launch = st.check_attention(DEV, dtype, 3, **SMALL_HEADS, seq=320, lengths=[300, 131, 1], chunk=16, seed=5,
                                config={"USE_DOT": dot, "COMBINE_BLOCK": combine}, device_length=True)
    assert launch["splits"] == 20 and launch["want"] == 4 * 132 // 6


def test_attention_device_length_grows_chunks():
    """Past `want` chunks of the least size, a row's chunks grow (1000 positions: 21 chunks of 48, not 63 of 16),
    and the grid holds `want` splits; a shared position (pos one for all rows) and a shared prefix."""
    launch = st.check_attention(DEV, torch.float32, 3, **SMALL_HEADS, seq=1024, filled=1000, chunk=16, seed=6,
                                config={"PROGRAMS_PER_SM": 1}, share=[(0, 0), (0, 999), (0, 640)],
                                device_length=True)
    assert launch["splits"] == launch["want"] == 132 // 6


def test_attention_device_length_kernels_dispatch():
    """Kernels.attention with no bias: the Triton launch and the torch reference (the mask built over the room)."""
    q, kc, vc = (torch.randn(shape) for shape in ((2, 4, 32), (2, 2, 100, 32), (2, 2, 100, 32)))
    pos = torch.tensor([80, 5])
    got = kernels.Kernels(["attention"]).attention(q, kc, vc, None, 0.2, pos=pos)
    bias = torch.where(torch.arange(100)[None] <= pos[:, None], 0.0, float("-inf"))[:, None, None]
    torch.testing.assert_close(got, kernels.Kernels().attention(q, kc, vc, None, 0.2, pos=pos), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, kernels.Kernels().attention(q, kc, vc, bias, 0.2), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pos, per_row", [(70, True), (5, True), (63, False)])
def test_rope_attention_device_length(pos, per_row):
    """The fused path with no bias: the split holding each row's position writes its k / v, the others read."""
    launch = st.check_rope_attention(DEV, torch.float32, 3, **SMALL_HEADS, seq=80, pos=pos, per_row=per_row,
                                     chunk=16, device_length=True)
    assert launch["splits"] == 5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b, per_row", [(1, False), (2, False), (2, True)])
def test_attention_o_proj(dtype, b, per_row):
    """q/k norm + RoPE + cache write + attention + o_proj with the residual in one launch (several column
    blocks, every kv head a split), rows at one position and each at its own."""
    st.check_attention_o_proj(DEV, dtype, b, **SMALL_HEADS, seq=20, window=16, pos=9, n=48, seed=b, per_row=per_row)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_attention_o_proj_deferred_sum(dtype):
    """With defer the kv heads' partials are left for the next linear; their sum is the finished launch's."""
    st.check_attention_o_proj(DEV, dtype, 1, **SMALL_HEADS, seq=20, window=16, pos=9, n=48, seed=3, defer=True)


def test_attention_o_proj_edges():
    """The last position of a short window, the first position with one query head a kv head, and three
    query heads a kv head (padded to four)."""
    st.check_attention_o_proj(DEV, torch.float32, 1, **SMALL_HEADS, seq=20, window=5, pos=4, n=40)
    st.check_attention_o_proj(DEV, torch.float32, 1, nh=4, nkv=4, d=32, seq=20, window=16, pos=0, n=40)
    st.check_attention_o_proj(DEV, torch.float32, 2, nh=6, nkv=2, d=32, seq=20, window=16, pos=11, n=24,
                              per_row=True)


def test_attention_o_proj_dispatch(monkeypatch):
    """Kernels.attention_o_proj runs the one launch where it fits (one row, a short window), and the
    separate ops elsewhere."""
    from engine.kernels import attention_o_proj as kao

    assert kao.fits(1, 16) and kao.fits(1, 64) and not kao.fits(kao.FUSE_ROWS + 1, 16) and not kao.fits(1, 128)
    calls = []
    monkeypatch.setattr(kao, "attention_o_proj", lambda *a, **kw: calls.append(a[0].shape[0]))
    ks = kernels.Kernels(kernels.NAMES)
    nh, nkv, d = 4, 2, 32
    for b, window in ((1, 16), (2, 16), (1, 256)):
        qkv = torch.randn(b, 1, (nh + 2 * nkv) * d)
        cache = torch.zeros(b, nkv, window, d)
        cos, sin = st.rope_tables(d, 1, torch.float32, DEV)
        bias = torch.zeros(window)
        ks.attention_o_proj(qkv, torch.ones(nh + nkv, d), cos, sin, 1e-6, cache, cache.clone(), torch.tensor([1]),
                            bias, 0.1, nh, nkv, torch.randn(16, nh * d), torch.randn(b, 1, 16))
    assert calls == [1]


def test_attention_plan():
    from engine.kernels import attention as ka

    assert ka.plan(1, 8, 16)["splits"] == 1  # the predictor's window: one program per (row, kv head)
    assert ka.plan(4, 8, 16, block_n=16)["BLOCK_N"] == 16
    for b in (1, 4, 16):
        for window in (256, 512, 1024, 2048, 4096):
            p = ka.plan(b, 8, window, sms=132)
            assert p["splits"] > 1 and p["chunk"] % p["BLOCK_N"] == 0 and p["chunk"] >= ka.CONFIG["MIN_CHUNK"]
            assert (p["splits"] - 1) * p["chunk"] < window <= p["splits"] * p["chunk"]  # no empty split
            assert p["SP"] >= p["splits"] and p["SP"] % p["SB"] == 0
            if b * 8 * 2 <= ka.CONFIG["PROGRAMS_PER_SM"] * 132:  # room for several splits per (row, head)
                assert b * 8 * p["splits"] <= 2 * ka.CONFIG["PROGRAMS_PER_SM"] * 132
    assert ka.plan(1, 8, 256)["chunk"] == ka.CONFIG["MIN_CHUNK"]  # B = 1: as many programs as chunks allow
    assert ka.plan(1, 8, 256, chunk=256)["splits"] == 1  # a chunk covering the window: one program
    assert ka.plan(1, 8, 300, chunk=64)["splits"] == 5
    assert ka.plan(2, 2, 48, chunk=16, config={"USE_DOT": True})["BLOCK_N"] == 16
    assert ka.plan(2, 2, 48, chunk=8, config={"USE_DOT": True})["BLOCK_N"] == 16  # tensor cores: >= 16


# Small blocks and program targets so both the single-pass and the split-K (last arrival reduces) paths run.
SMALL_LINEAR = {"BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 4, "num_stages": 1}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", [1, 5, 16])
@pytest.mark.parametrize("prologue,residual,bias", [("rms_norm", False, False), ("none", True, False),
                                                    ("silu_mul", True, False), ("none", False, True)])
@pytest.mark.parametrize("target", [1, 64])
def test_linear(dtype, m, prologue, residual, bias, target):
    splits = st.check_linear(DEV, dtype, m, 40, 200, prologue, residual, bias, seed=m, config=SMALL_LINEAR,
                             target=target)
    assert (splits > 1) == (target > 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", [1, 5, 16])
@pytest.mark.parametrize("prologue,residual,bias", [("rms_norm", False, False), ("silu_mul", True, False),
                                                    ("none", False, True)])
@pytest.mark.parametrize("target", [1, 64])
def test_linear_swapped_operands(dtype, m, prologue, residual, bias, target):
    """The transposed tensor-core product (weight tile on the MMA's M side) gives the same result."""
    st.check_linear(DEV, dtype, m, 40, 200, prologue, residual, bias, seed=m,
                    config={**SMALL_LINEAR, "FMA_ROWS": 0, "SWAP_AB": True}, target=target)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rows_planned_alike_keep_each_rows_bits(dtype):
    """Batch invariance (Kernels.plan_rows): a row's linear and attention results are the same bits alone and
    beside other rows, where the row count alone would pick other paths (FMAs at one row, 16-row tensor-core
    tiles at five; the attention's chunks by rows)."""
    g = torch.Generator().manual_seed(3)
    x, w, nw = (torch.randn(*shape, generator=g).to(dtype) for shape in ((5, 200), (40, 200), (200,)))
    ks = kernels.Kernels(kernels.NAMES, plan_rows=64)
    for prologue in ("rms_norm", "none"):
        kw = {"prologue": prologue, "norm_weight": nw if prologue == "rms_norm" else None}
        assert torch.equal(ks.linear(x[:1], w, **kw)[0], ks.linear(x, w, **kw)[0])
    # A row of 2000 positions: alone it would be cut in 63 chunks, beside four others in 52.
    q, kc, vc = (torch.randn(*shape, generator=g).to(dtype) for shape in ((5, 4, 32), (5, 2, 2048, 32), (5, 2, 2048, 32)))
    pos = torch.tensor([2000, 131, 1, 77, 1500])
    alone = ks.attention(q[:1], kc[:1], vc[:1], None, 0.2, pos=pos[:1])
    assert torch.equal(alone[0], ks.attention(q, kc, vc, None, 0.2, pos=pos)[0])
    atol, rtol = st.ATTN_TOL[dtype]
    torch.testing.assert_close(alone, kernels.Kernels().attention(q[:1], kc[:1], vc[:1], None, 0.2, pos=pos[:1]),
                               atol=atol, rtol=rtol)


def test_rows_planned_alike_make_the_same_fusion_choices():
    """With plan_rows every choice that depends on the row count is made as for plan_rows rows."""
    free, alike = kernels.Kernels(kernels.NAMES), kernels.Kernels(kernels.NAMES, plan_rows=64)
    assert free.defers("linear", 1) and free.defers("attention_o_proj", 1)
    assert not alike.defers("linear", 1) and not alike.defers("attention_o_proj", 1)
    assert alike._rows(1) == 64 and free._rows(1) == 1
    _, why = kernels.select("on", "cpu", plan_rows=64)
    assert "as for 64 rows" in why


def test_many_rows_take_cublas_for_the_matmul(monkeypatch):
    """From CUBLAS_FROM_ROWS rows the linear's matmul is torch's (the RMSNorm prologue the Triton RMSNorm's launch,
    the residual in the matmul's epilogue), unless launches are planned alike for batch invariance."""
    from engine.kernels import linear as kl
    from engine.kernels import linear_plan

    g = torch.Generator().manual_seed(4)
    x, w, nw, res = (torch.randn(*shape, generator=g) for shape in ((40, 96), (24, 96), (96,), (40, 24)))
    launched = []
    monkeypatch.setattr(kl, "linear", lambda *a, **k: launched.append(a[0].shape[0]) or kl.reference(*a, **{
        n: v for n, v in k.items() if n not in ("pdl", "counters", "defer", "plan_rows")}))
    ks = kernels.Kernels(kernels.NAMES)
    got = ks.linear(x, w, prologue="rms_norm", norm_weight=nw, residual=res)
    torch.testing.assert_close(got, kl.reference(x, w, prologue="rms_norm", norm_weight=nw, residual=res))
    assert launched == [] and linear_plan.CUBLAS_FROM_ROWS <= 40
    ks.linear(x[:8], w, prologue="rms_norm", norm_weight=nw)  # fewer rows: the Triton linear
    kernels.Kernels(kernels.NAMES, plan_rows=64).linear(x, w)  # planned alike: the Triton linear at any rows
    assert launched == [8, 40]


def test_many_rows_take_the_swiglu_launch_and_may_sum_into_a_spent_residual():
    """On cuBLAS a SwiGLU prologue is the Triton SwiGLU's one launch, and with spend_residual the matmul adds into
    the residual's memory: the same sums as the copy torch's addmm makes first. Without it the residual is kept."""
    from engine.kernels import linear as kl

    g = torch.Generator().manual_seed(5)
    gu, w, res = (torch.randn(*shape, generator=g) for shape in ((40, 1, 192), (24, 96), (40, 1, 24)))
    ks = kernels.Kernels(kernels.NAMES)
    want = kl.reference(gu, w, prologue="silu_mul", residual=res)
    kept = res.clone()
    torch.testing.assert_close(ks.linear(gu, w, prologue="silu_mul", residual=res), want)
    assert torch.equal(res, kept)
    got = ks.linear(gu, w, prologue="silu_mul", residual=res, spend_residual=True)
    assert got.data_ptr() == res.data_ptr() and got.shape == want.shape
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m,inter", [(1, 64), (3, 1000), (40, 1536)])
def test_silu_mul(dtype, m, inter):
    st.check_silu_mul(DEV, dtype, m, inter, seed=m + inter)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_stack_step_at_many_rows_matches_the_reference_and_keeps_its_input(dtype):
    """A 3-layer stack step of 40 rows (cuBLAS matmuls, the Triton RMSNorm and SwiGLU, residual sums made in the
    layers' own spent rows) == the same step with every op as its torch reference; the caller's input is kept."""
    from engine.gpu.fused_layers import FusedStack
    from engine.model.kv_cache import KVCache

    fs = st.predictor_stack(DEV, dtype, hidden=32, inter=128, layers=3, nh=2, nkv=2, std=0.1)
    x = torch.randn(40, 1, 32, generator=torch.Generator().manual_seed(2)).to(dtype)
    kept = x.clone()
    pos, bias = torch.tensor([0]), torch.where(torch.arange(8) <= 0, 0.0, float("-inf")).to(dtype)
    outs = []
    for ks in (kernels.Kernels(), kernels.Kernels(kernels.NAMES)):
        outs.append(FusedStack(fs.stack, ks).step(x, KVCache(3, 40, 2, 8, 32, dtype, DEV), pos, bias))
        assert torch.equal(x, kept)
    tol = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 6e-2, "rtol": 3e-2}
    torch.testing.assert_close(outs[1], outs[0], **tol)


def test_linear_plan_paths():
    """FMAs up to FMA_ROWS rows; above, the swapped tensor-core product when a prologue is fused, the plain
    one otherwise and for a long SwiGLU (which torch runs)."""
    from engine.kernels import linear as kl

    assert not kl.plan(kl.FMA_ROWS, 4096, 1024, prologue="rms_norm")["USE_DOT"]
    for prologue in ("rms_norm", "silu_mul"):
        p = kl.plan(16, 1024, 3072, prologue=prologue)
        assert p["USE_DOT"] and p["SWAP_AB"] and p["PROLOGUE"] == prologue
        assert p["BLOCK_N"] == kl.CONFIG[f"dot_{prologue}"]["BLOCK_N"]
    p = kl.plan(16, 1024, 2048)
    assert p["USE_DOT"] and not p["SWAP_AB"] and p["BLOCK_N"] == kl.CONFIG["dot"]["BLOCK_N"]
    p = kl.plan(8, 12288, 2048, prologue="rms_norm", sms=132)  # 192 swapped tiles > one wave: plain tiles
    assert p["USE_DOT"] and not p["SWAP_AB"] and p["PROLOGUE"] == "rms_norm"
    p = kl.plan(16, 2048, kl.SWIGLU_IN_DOT_MAX_K + 64, prologue="silu_mul")
    assert p["PROLOGUE"] == "none" and not p["SWAP_AB"]
    assert kl.plan(1, 2048, 6144, prologue="silu_mul")["PROLOGUE"] == "silu_mul"  # FMAs keep it fused


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", [1, 4])
@pytest.mark.parametrize("prologue", ["rms_norm", "none"])
def test_linear_one_tile(dtype, m, prologue):
    """K fits one tile: the weight load is issued before the row's norm (no K loop)."""
    st.check_linear(DEV, dtype, m, 40, 200, prologue, seed=m, config={**SMALL_LINEAR, "BLOCK_K": 256}, target=1)
    if m > 1:  # and the swapped tensor-core product
        st.check_linear(DEV, dtype, m, 40, 200, prologue, seed=m, target=1,
                        config={**SMALL_LINEAR, "BLOCK_K": 256, "FMA_ROWS": 0, "SWAP_AB": True})


def test_linear_long_swiglu_on_tensor_cores():
    """Past SWIGLU_IN_DOT_MAX_K the tensor-core path takes the SwiGLU from torch; the result is the same."""
    from engine.kernels import linear as kl

    k = kl.SWIGLU_IN_DOT_MAX_K + 64
    st.check_linear(DEV, torch.bfloat16, 4, 16, k, "silu_mul", True, config={**SMALL_LINEAR, "BLOCK_K": 256},
                    target=4)


def test_linear_rows_past_one_tile():
    """32 rows (the predictor's two-token step at 16 takes) take a 32-row tile."""
    st.check_linear(DEV, torch.bfloat16, 32, 24, 96, "rms_norm", config=SMALL_LINEAR, target=8)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("prologue", ["rms_norm", "none"])
@pytest.mark.parametrize("consumer", [{"target": 1, "BLOCK_K": 256}, {"target": 1}, {"target": 64}],
                         ids=["one_tile", "k_loop", "split"])
def test_linear_deferred_sum_same_bits(dtype, m, prologue, consumer):
    """A split-K launch with defer leaves its partials (split_sum.py); the next linear makes the row from them
    in its prologue (one tile, a K loop, itself split) and stores it in out. Both the consumer's result and the
    stored row equal the finished launch's, bit for bit."""
    from engine.kernels import linear as kl
    from engine.kernels import split_sum

    g = torch.Generator().manual_seed(m)
    x0, r = torch.randn(m, 1, 160, generator=g).to(dtype), torch.randn(m, 1, 96, generator=g).to(dtype)
    w1, w2 = (torch.randn(96, 160, generator=g) * 0.1).to(dtype), (torch.randn(40, 96, generator=g) * 0.1).to(dtype)
    nw = (1 + 0.1 * torch.randn(96, generator=g)).to(dtype)
    y = kl.linear(x0, w1, residual=r, config=SMALL_LINEAR, target=64)
    left = kl.linear(x0, w1, residual=r, config=SMALL_LINEAR, target=64, defer=True)
    assert isinstance(left, split_sum.SplitSum) and left.splits > 1
    assert torch.equal(split_sum.reference(left), y)
    norm = {"norm_weight": nw} if prologue == "rms_norm" else {}
    cfg = {**SMALL_LINEAR, "BLOCK_K": consumer.get("BLOCK_K", 32)}
    want = kl.linear(y, w2, prologue=prologue, **norm, config=cfg, target=consumer["target"])
    got = kl.linear(left, w2, prologue=prologue, **norm, config=cfg, target=consumer["target"])
    assert torch.equal(got, want)
    assert torch.equal(left.out, y)


def test_linear_defer_only_where_it_pays(monkeypatch):
    """defer returns the finished tensor where there is no sum to leave (an unsplit launch), on the tensor-core
    path (3+ rows), and where the consumer's row is wider than its one FMA tile."""
    from engine.kernels import linear as kl

    def launch(m, k, **kw):
        x, w, r = torch.randn(m, k), torch.randn(40, k) * 0.1, torch.randn(m, 40)
        y = kl.linear(x, w, residual=r, defer=True, **kw)
        assert isinstance(y, torch.Tensor)
        torch.testing.assert_close(y, r + x @ w.T, atol=1e-4, rtol=1e-4)

    launch(1, 64, config={**SMALL_LINEAR, "BLOCK_K": 64}, target=1)
    launch(5, 200, config=SMALL_LINEAR, target=64)
    monkeypatch.setitem(kl.CONFIG, "fma", {**kl.CONFIG["fma"], "BLOCK_K": 32})
    launch(1, 200, config=SMALL_LINEAR, target=64)


def test_linear_counters_rearm():
    """Split-K counters are left at zero, so a second launch (a graph replay) reduces again."""
    for _ in range(2):
        st.check_linear(DEV, torch.float32, 3, 48, 160, "none", True, config=SMALL_LINEAR, target=40)
        assert int(SHARED.get("linear", torch.device(DEV)).abs().sum()) == 0


def test_engine_tables_own_their_counters(monkeypatch):
    """A Kernels table's split launches count in its own counters, not
    the process's SHARED set, so Engine.release can free them; they re-arm, and release drops them."""
    from engine.kernels import counters as arrivals

    shared = arrivals.Counters()
    monkeypatch.setattr(arrivals, "SHARED", shared)
    ks = kernels.Kernels(["linear", "attention"])
    x, w = torch.randn(3, 1, 160), torch.randn(48, 160) * 0.1
    for _ in range(2):
        y = ks.linear(x, w, config=SMALL_LINEAR, target=40)
        torch.testing.assert_close(y, x @ w.T, atol=1e-4, rtol=1e-4)
    assert int(ks.counters.get("linear", DEV).abs().sum()) == 0
    assert not shared._made, "a table's launch counted in the shared set"
    ks.counters.release()
    assert not ks.counters._made


def test_linear_unrolled_split_sum_same_bits(monkeypatch):
    """The last arrival's unrolled sum (every partial loaded in one round, splits past the count masked) gives
    the same bits as the loop over the splits; more splits than UNROLL_SPLITS take the loop."""
    from engine.kernels import linear as kl
    from engine.kernels import linear_plan

    assert [kl.unrolled_splits(s) for s in (1, 2, 3, 7, 16, 17)] == [0, 2, 4, 8, 16, 0]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 1, 200, generator=g)  # fp32 out: the sum's own rounding shows any change of order
    w = torch.randn(40, 200, generator=g) * 0.07
    r = torch.randn(2, 1, 40, generator=g)
    assert kl.plan(2, 40, 200, SMALL_LINEAR, 64)["splits"] == 7  # unrolled to 8, one masked
    unrolled = kl.linear(x, w, residual=r, config=SMALL_LINEAR, target=64)
    monkeypatch.setattr(linear_plan, "UNROLL_SPLITS", 0)
    assert torch.equal(unrolled, kl.linear(x, w, residual=r, config=SMALL_LINEAR, target=64))
    monkeypatch.undo()
    assert st.check_linear(DEV, torch.float32, 2, 40, 600, "none", True, config=SMALL_LINEAR, target=64) == 19


def test_linear_unrolled_norm_same_bits(monkeypatch):
    """The RMSNorm prologue's sum of squares unrolled over the row's steps gives the same bits as the loop
    (same order); rows whose tiles hold more than UNROLL_NORM_VALUES values take the loop."""
    from engine.kernels import linear as kl
    from engine.kernels import linear_plan

    assert [kl.norm_steps(k, 256, 16) for k in (256, 1000, 1024, 1025, 2048)] == [1, 4, 4, 0, 0]
    assert [kl.norm_steps(k, 1024, 1) for k in (1024, 2048, 6144)] == [1, 2, 6]
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 1, 200, generator=g)
    w = torch.randn(40, 200, generator=g) * 0.07
    nw = torch.rand(200, generator=g) + 0.5
    p = kl.plan(3, 40, 200, SMALL_LINEAR, 8, prologue="rms_norm")
    assert kl.norm_steps(200, p["BLOCK_K"], p["BLOCK_M"]) == 7  # 16-row tiles (tensor cores), 7 steps of 32
    unrolled = kl.linear(x, w, prologue="rms_norm", norm_weight=nw, config=SMALL_LINEAR, target=8)
    monkeypatch.setattr(linear_plan, "UNROLL_NORM_VALUES", 0)
    assert torch.equal(unrolled, kl.linear(x, w, prologue="rms_norm", norm_weight=nw, config=SMALL_LINEAR, target=8))


SAMPLE_CASES = st.SAMPLE_CASES


@pytest.mark.parametrize("vocab", [2048, 3072])
@pytest.mark.parametrize("case", list(SAMPLE_CASES))
def test_sample_matches_choose(vocab, case):
    st.check_sample_exact(DEV, 24, vocab, seed=len(case) + vocab, **SAMPLE_CASES[case])


@pytest.mark.parametrize("case", ["default", "k20_p05_t13"])
def test_sample_in_kernel_uniforms(case):
    st.check_sample_exact(DEV, 16, 2048, seed=5, rng="hash", **SAMPLE_CASES[case])


@pytest.mark.parametrize("do_sample", [True, False])
def test_sample_codebook0_penalty_and_bookkeeping(do_sample):
    st.check_sample_penalty(DEV, 6, do_sample=do_sample, t=1 if do_sample else 4)


def test_sample_codebook0_rows_at_their_own_frames():
    st.check_sample_penalty(DEV, 6, t=0, min_new=3, per_row=True)  # rows 0-2 still mask EOS, rows 3-5 not


@pytest.mark.parametrize("penalty", [True, False])
def test_sample_rows_with_settings_of_their_own(penalty):
    st.check_sample_per_row_settings(DEV, penalty=penalty)


@pytest.mark.parametrize("width", [40, 1100])
def test_sample_returns_embedding_rows(width):
    """embed=table: the same ids, and the table's rows at them (a row wider than one 1024 block too)."""
    from engine import sampling
    from engine.kernels import sample as k

    logits, settings = st.sampling_case(DEV, 5, 2048, 3, **SAMPLE_CASES["default"])
    keys = sampling.take_keys(3, range(5), DEV)
    draw = {"keys": keys, "step": torch.tensor([2], device=DEV), "slot": 4}
    table = torch.randn(2048, width, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    ids = k.sample(logits, *settings, **draw)
    got_ids, rows = k.sample(logits, *settings, **draw, embed=table)
    assert torch.equal(got_ids, ids)
    assert torch.equal(rows, table[ids])
    ref_ids, ref_rows = k.reference(logits, *settings, **draw, embed=table)
    assert torch.equal(ref_rows, table[ref_ids])


def test_sample_returns_rows_of_a_second_table():
    """embed2 (the 1.7B's projected copy, frame_graph.projected_tables): its rows at the same ids come last,
    whatever its width; and it needs embed."""
    from engine import sampling
    from engine.kernels import sample as k

    logits, settings = st.sampling_case(DEV, 3, 2048, 3, **SAMPLE_CASES["default"])
    draw = {"keys": sampling.take_keys(5, range(3), DEV), "step": torch.tensor([1], device=DEV), "slot": 2}
    gen = torch.Generator().manual_seed(2)
    table, table2 = torch.randn(2048, 40, generator=gen), torch.randn(2048, 1100, generator=gen)
    ids, rows, rows2 = k.sample(logits, *settings, **draw, embed=table, embed2=table2)
    assert torch.equal(ids, k.sample(logits, *settings, **draw))
    assert torch.equal(rows, table[ids]) and torch.equal(rows2, table2[ids])
    ref_ids, _, ref_rows2 = k.reference(logits, *settings, **draw, embed=table, embed2=table2)
    assert torch.equal(ref_rows2, table2[ref_ids])
    with pytest.raises(Exception, match="embed2 comes with embed"):
        k.sample(logits, *settings, **draw, embed2=table2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_sample_negative_zero_ties_positive_zero(dtype):
    """Top-1 of a row whose maximum is 0.0 at one id and -0.0 at another keeps both (they compare equal,
    as in the torch path); the uniforms make the -0.0 id win the race, so dropping it changes the id."""
    from engine.kernels import sample as ksample
    from engine.kernels import sample as k

    vocab = 64
    logits = torch.full((1, vocab), -10.0)
    logits[0, 3], logits[0, 7] = 0.0, -0.0
    logits = logits.to(dtype)
    u = torch.full((1, vocab), 0.5)
    u[0, 7] = 0.999
    f32 = {"device": DEV, "dtype": torch.float32}
    settings = (torch.tensor(True, device=DEV), torch.tensor(1.0, **f32),
                torch.tensor(ksample.kth_index(1, vocab), device=DEV), torch.tensor(1.0, **f32))
    want = k.reference(logits, *settings, u=u)
    assert want.tolist() == [7]
    assert k.sample(logits, *settings, u=u).tolist() == [7]


def test_sample_distribution_chi_square():
    st.check_sample_distribution(DEV, 240, top_k=4, top_p=0.95, temperature=1.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
# 1: q/k norm, attention and o_proj in one launch; 4: q/k norm + RoPE fused into the attention (FUSE_MIN_ROWS)
@pytest.mark.parametrize("rows", [1, 2, 4])
def test_layer_step_matches_fused_layer(dtype, rows):
    """FusedLayer.step with every kernel on == the same step with every op as its torch reference
    (a small random layer, 3 tokens)."""
    fs = st.predictor_stack(DEV, dtype, layers=1, rope_theta=10000.0, std=0.08)
    fl = fs.layers[0]
    ks = kernels.Kernels(kernels.NAMES)
    caches = [torch.zeros(rows, 2, 8, 32, dtype=dtype) for _ in range(4)]
    for t in range(3):
        x = torch.randn(rows, 1, 128, generator=torch.Generator().manual_seed(t)).to(dtype)
        pos = torch.tensor([t])
        cos, sin = fs.rope(pos, dtype)
        bias = torch.where(torch.arange(8) <= t, 0.0, float("-inf")).to(dtype)
        want = fl.step(kernels.Kernels(), x, cos, sin, caches[0], caches[1], pos, bias)
        got = fl.step(ks, x, cos, sin, caches[2], caches[3], pos, bias)
        tol = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 6e-2, "rtol": 3e-2}
        torch.testing.assert_close(got, want, **tol)
        torch.testing.assert_close(caches[2], caches[0], **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [1, 2])
def test_stack_step_with_deferred_sums_same_bits(monkeypatch, dtype, rows):
    """A 3-layer stack step with every kernel on, its linears split (K in 32-wide tiles, rows 32 wide): down_proj's
    sum is left to the next layer's qkv launch and o_proj's to gate/up (split_sum.py), and the steps give the same
    bits and caches as with no launch deferred (DEFER_ROWS all 0)."""
    from engine.gpu.fused_layers import FusedStack
    from engine.kernels import linear as kl
    from engine.kernels import split_sum
    from engine.model.kv_cache import KVCache

    monkeypatch.setitem(kl.CONFIG, "fma", {**kl.CONFIG["fma"], "BLOCK_N": 32, "BLOCK_K": 32})  # rows: one tile
    left = []

    made = split_sum.SplitSum.__init__

    def counted(self, part, *args):
        left.append(part.shape[0])
        made(self, part, *args)

    monkeypatch.setattr(split_sum.SplitSum, "__init__", counted)
    fs = st.predictor_stack(DEV, dtype, hidden=32, inter=128, layers=3, nh=2, nkv=2, std=0.1)
    runs = []
    for limits in ({"linear": 0, "attention_o_proj": 0}, dict(split_sum.DEFER_ROWS)):
        monkeypatch.setattr(split_sum, "DEFER_ROWS", limits)
        stack = FusedStack(fs.stack, kernels.Kernels(kernels.NAMES))
        cache = KVCache(3, rows, 2, 8, 32, dtype, DEV)
        outs = []
        for t in range(2):
            x = torch.randn(rows, 1, 32, generator=torch.Generator().manual_seed(t)).to(dtype)
            pos = torch.tensor([t])
            bias = torch.where(torch.arange(8) <= t, 0.0, float("-inf")).to(dtype)
            outs.append(stack.step(x, cache, pos, bias))
        runs.append((outs, cache.store.clone()))
    # per step: o_proj's sum left in every layer (at one row the attention + o_proj launch's), down_proj's in
    # all but the last
    assert len(left) == 2 * (3 + 2), left
    for a, b in zip(runs[0][0], runs[1][0]):
        assert torch.equal(a, b)
    assert torch.equal(runs[0][1], runs[1][1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_layer_prefill_matches_fused_layer(dtype):
    """FusedLayer.prefill with every kernel on == the same prefill with every op as its torch reference
    (a small random layer, 6 tokens)."""
    fs = st.predictor_stack(DEV, dtype, layers=1, rope_theta=10000.0, std=0.08)
    fl = fs.layers[0]
    caches = [torch.zeros(1, 2, 8, 32, dtype=dtype) for _ in range(4)]
    x = torch.randn(6, 128, generator=torch.Generator().manual_seed(1)).to(dtype)
    cos, sin = fs.rope(torch.arange(6), dtype)
    want = fl.prefill(kernels.Kernels(), x, cos, sin, caches[0], caches[1])
    got = fl.prefill(kernels.Kernels(kernels.NAMES), x, cos, sin, caches[2], caches[3])
    tol = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 6e-2, "rtol": 3e-2}
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(caches[2], caches[0], **tol)
    torch.testing.assert_close(caches[3], caches[1], **tol)






@pytest.mark.parametrize("takes", [1, 3])
def test_frames_with_device_lengths_equal_windowed_frames(tiny_checkpoints, monkeypatch, takes):
    """The frame body whose talker attention reads each row's length on the device (one graph for every
    position: no window, no bias) decodes the greedy codes of the torch attention over windows, crossing
    several of them (16 positions each here); takes share the prompt's K/V from one row."""
    from engine import Engine, Request
    from engine.gpu import frame_graph
    from tests.support.decoding import decode_codes

    monkeypatch.setattr(frame_graph, "WINDOW_STEP", 16)
    engine = Engine.load(tiny_checkpoints["custom_voice"], device="cpu", dtype="fp32", max_seq_len=400)
    windowed = frame_graph.GraphedFrames(engine.talker, 400, capture=False)
    lengths = frame_graph.GraphedFrames(engine.talker, 400, capture=False, kernels=kernels.Kernels(("attention",)))
    assert lengths.device_length and not windowed.device_length
    assert lengths._window(390) is None and windowed._window(390) == 400
    params = engine.defaults.greedy().replace(max_new_tokens=24)
    req = Request(mode="custom", text="Lengths read on the device.", language="English", speaker="ryan")
    want, n_want = decode_codes(engine, windowed, req, takes, params, seed=3)
    got, n_got = decode_codes(engine, lengths, req, takes, params, seed=3)
    assert n_got == n_want
    assert torch.equal(got, want)


def test_attention_o_proj_dispatch_without_a_bias():
    """A room short enough for the fused attention + o_proj launch, with no bias (device lengths): the dispatch
    runs the two ops instead (that launch takes a bias), and matches the torch references."""
    qkv, w, cos, sin, caches, mine, pos = st._decode_token_case(DEV, torch.float32, 1, 4, 2, 32, 32, [9], 16, 3)
    gen = torch.Generator().manual_seed(4)
    weight, residual = torch.randn(48, 4 * 32, generator=gen), torch.randn(1, 1, 48, generator=gen)
    args = (w, cos, sin, 1e-6)
    fast = kernels.Kernels(("linear", "qk_norm_rope_kv", "attention", "attention_o_proj"))
    got = fast.attention_o_proj(qkv, *args, *mine, pos, None, 0.2, 4, 2, weight, residual)
    want = kernels.Kernels().attention_o_proj(qkv, *args, *caches, pos, None, 0.2, 4, 2, weight, residual)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_sample_into_slots():
    st.check_sample_into_slots(DEV, 5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("b,hidden,d", [(1, 48, 16), (3, 40, 8)])
@pytest.mark.parametrize("block", [256, 16], ids=["one_program_a_row", "three_programs_a_row"])
def test_talker_input(monkeypatch, dtype, b, hidden, d, block):
    from engine.kernels import frame_glue

    monkeypatch.setattr(frame_glue, "INPUT_BLOCK", block)  # 16: the last program's columns partly masked
    st.check_talker_input(DEV, dtype, b, hidden, d, seed=b)
    st.check_talker_input(DEV, dtype, b, hidden, d, seed=b + 1, exact_sums=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("b,hidden", [(1, 48), (6, 40)])
def test_frame_tail(dtype, b, hidden):
    st.check_frame_tail(DEV, dtype, b, hidden, seed=b)


@pytest.mark.parametrize("takes", [1, 3])
def test_frames_with_frame_glue_equal_torch_glue(tiny_checkpoints, takes):
    """The frame body with its glue as two launches (frame_glue: the talker's input and RoPE rows, its final
    norm and the rows' bookkeeping) decodes the same codes and lengths as with the torch ops, sampling on, past
    each take's frame budget (the sampler writes into the frame's slots either way)."""
    from engine import Engine, Request
    from engine.gpu import frame_graph
    from tests.support.decoding import decode_codes

    engine = Engine.load(tiny_checkpoints["custom_voice"], device="cpu", dtype="fp32", max_seq_len=200)
    params = engine.defaults.replace(max_new_tokens=12, min_new_tokens=0)
    req = Request(mode="custom", text="Glue in two launches.", language="English", speaker="ryan")
    runs = []
    for names in (("sample",), ("sample", "frame_glue")):
        runner = frame_graph.GraphedFrames(engine.talker, 200, capture=False, kernels=kernels.Kernels(names))
        runs.append(decode_codes(engine, runner, req, takes, params, seed=4))
    (want, n_want), (got, n_got) = runs
    assert n_got == n_want
    assert torch.equal(got, want)


def test_frames_with_rows_of_their_own_settings_equal_torch_sampling(tiny_checkpoints):
    """The frame body with the sampling kernel, rows of one loop sampling with settings of their own (greedy
    beside sampled, other temperatures, top-k, top-p, penalties, min_new_tokens, more rows than slots), decodes
    the same codes as with the torch sampling."""
    from engine import Engine, Request
    from engine.decode import Row, decode_rows
    from engine.gpu import frame_graph

    engine = Engine.load(tiny_checkpoints["custom_voice"], device="cpu", dtype="fp32", max_seq_len=200)
    base = engine.defaults.replace(max_new_tokens=8, min_new_tokens=0)
    own = [base, base.greedy(), base.replace(temperature=1.4, top_k=0, top_p=0.8),
           base.replace(repetition_penalty=1.6, min_new_tokens=4, subtalker_top_k=3), None]
    rows = []
    for k, p in enumerate(own):
        req = Request(mode="custom", text=f"Row {k} samples its own way.", language="English", speaker="ryan")
        prompt, _, frames = engine.prepare(req, 1, p or base)
        rows.append(Row(prompt, 300 + k, frames - k, params=p))  # other budgets: rows end apart
    runs = []
    for names in ((), ("sample",)):
        runner = frame_graph.GraphedFrames(engine.talker, 200, capture=False, kernels=kernels.Kernels(names))
        out = {}
        for c in decode_rows(runner, rows, slots=3, params=base, eos_id=engine.cfg.talker.codec_eos_id,
                             chunk_frames=3):
            for slot, r in enumerate(c.rows):
                if r >= 0:
                    out.setdefault(r, []).append(c.codes[slot][c.valid[slot]])
        runs.append([torch.cat(out[r]) for r in range(len(rows))])
    for r, (want, got) in enumerate(zip(*runs)):
        assert torch.equal(got, want), f"row {r}"
