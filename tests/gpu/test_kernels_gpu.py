"""Triton kernels against their plain-torch references on CUDA at every decode shape (rows 1, 4, 8, 16;
widths of the 0.6B and 1.7B models), plus many sampled rows and a large-draw chi-square test.
Same checks and tolerances as tests/kernels/test_kernels.py (tests/support/kernels_selftest.py)."""
import pytest
import torch

pytestmark = pytest.mark.gpu

from engine import kernels
from tests.support import kernels_selftest as st
from engine.kernels.counters import SHARED

DEV = "cuda"
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
ROWS = [1, 4, 8, 16]


@pytest.fixture(autouse=True, scope="module")
def _need_triton():  # CUDA itself is checked by the gpu marker (tests/conftest.py)
    ok, why = kernels.available("cuda")
    if not ok:
        pytest.skip(why)


def test_select_on():
    ks, why = kernels.select("on", "cuda")
    assert ks.active == kernels.NAMES, why


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", ROWS)
def test_rms_norm(dtype, m):
    for n in (1024, 2048):
        st.check_rms_norm(DEV, dtype, m, n, seed=m + n)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", [1, 33, 64])
def test_silu_mul(dtype, m):
    for inter in (3072, 6144):  # the 0.6B's and the 1.7B's talker
        st.check_silu_mul(DEV, dtype, m, inter, seed=m + inter)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b", [1, 16])
def test_snake(dtype, b):
    """Every SnakeBeta shape of the real codec at 1 and 32 frames (1 and 16 rows)."""
    for c, length in st.SNAKE_SHAPES:
        st.check_snake(DEV, dtype, b, c, length, seed=c + length)
        st.check_snake(DEV, dtype, b, c, length, seed=c + length, row_pad=7)  # a folded conv's sliced output
        st.check_snake(DEV, dtype, b, c, length, seed=c + length, bias=True)  # a conv's bias fused


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b", [1, 16])
def test_snake_conv1x1(dtype, b):
    """Every residual unit's width of the real codec, rows contiguous and at a stride, with the deferred bias."""
    for c, length in st.SNAKE_CONV1X1_SHAPES:
        st.check_snake_conv1x1(DEV, dtype, b, c, length, seed=c + length)
        st.check_snake_conv1x1(DEV, dtype, b, c, length, seed=c + length, x_bias=True, row_pad=5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", ROWS)
def test_linear(dtype, m):
    """Every decode matmul of the 0.6B / 1.7B layers and heads, with the launch plan the engine uses."""
    for n, k, prologue, residual, bias in st.LINEAR_SHAPES:
        st.check_linear(DEV, dtype, m, n, k, prologue, residual, bias, seed=m + n)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", ROWS)
def test_split_sum(dtype, m):
    """Deferred split-K sums at the decode shapes (split_sum.py): down_proj into the next qkv, o_proj into
    gate/up, and the attention + o_proj launch's kv-head partials; each made sum equals the finished launch's."""
    from engine.kernels import linear as kl

    left = [st.check_split_sum(DEV, dtype, m, producer, consumer, seed=m) for producer, consumer in st.SPLIT_SUM_SHAPES]
    assert left == [m <= kl.FMA_ROWS, m <= kl.FMA_ROWS, False, False], left  # 0.6B-wide rows, FMA rows only
    if m == 1:
        st.check_attention_o_proj(DEV, dtype, 1, seq=16, window=16, pos=9, seed=5, defer=True)


def test_linear_split_k_in_cuda_graph():
    """Replays of a captured split-K launch keep reducing correctly (the counters re-arm)."""
    from engine.kernels import linear as kl

    x = torch.randn(4, 1, 3072, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(1024, 3072, device=DEV, dtype=torch.bfloat16) / 40
    r = torch.randn(4, 1, 1024, device=DEV, dtype=torch.bfloat16)
    assert kl.plan(4, 1024, 3072)["splits"] > 1
    kl.linear(x, w, residual=r)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = kl.linear(x, w, residual=r)
    for scale in (1.0, -2.0, 0.5):
        x.mul_(scale)
        g.replay()
        torch.testing.assert_close(y.float(), kl.exact(x, w, residual=r).float(), atol=1.6e-2, rtol=1.6e-2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b", ROWS)
def test_qk_norm_rope_kv(dtype, b):
    for pos in (0, 17, 2047):
        st.check_qk_norm_rope_kv(DEV, dtype, b, seq=2048, pos=pos, seed=b + pos)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_qk_norm_rope_kv_rows_at_their_own_positions(dtype):
    st.check_qk_norm_rope_kv(DEV, dtype, 16, seq=2048, pos=1000, seed=7, per_row=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_qk_norm_rope_kv_prefill(dtype):
    for t in (1, 64, 200, 512):
        st.check_qk_norm_rope_kv_prefill(DEV, dtype, t, seq=2048, seed=t)


def test_attention_rows_of_different_lengths():
    for dtype in DTYPES:
        st.check_attention(DEV, dtype, 16, seq=600, window=512, filled=500, block_n=64, per_row=True)


@pytest.mark.parametrize("b", [4, 16])
def test_attention_shared_prefix(b):
    """Takes reading a prompt's K/V from row 0's copy (the rows' own prefixes differ, so ignoring it fails), at the
    talker's shapes, in the split path and the fused one."""
    share = [(0, 0)] + [(0, 311)] * (b - 2) + [(b - 1, 0)]
    for dtype in DTYPES:
        st.check_attention(DEV, dtype, b, seq=800, window=768, filled=560, seed=b, share=share)
        st.check_rope_attention(DEV, dtype, b, seq=800, window=768, pos=560, seed=b, share=share)


def test_sample_codebook0_rows_at_their_own_frames():
    st.check_sample_penalty(DEV, 16, t=0, min_new=8, per_row=True)


@pytest.mark.parametrize("penalty", [True, False])
def test_sample_rows_with_settings_of_their_own(penalty):
    st.check_sample_per_row_settings(DEV, penalty=penalty)


def test_qk_norm_rope_kv_in_cuda_graph():
    """pos is read on the device: one captured graph writes wherever pos points at replay."""
    from engine.kernels import qk_norm_rope_kv as k

    b, nh, nkv, d = 2, 16, 8, 128
    qkv = torch.randn(b, (nh + 2 * nkv) * d, device=DEV, dtype=torch.bfloat16)
    w = torch.ones(nh + nkv, d, device=DEV, dtype=torch.bfloat16)
    cos, sin = st.rope_tables(d, 0, torch.bfloat16, DEV)
    kc, vc = (torch.zeros(b, nkv, 8, d, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    pos = torch.tensor([0], device=DEV)
    k.qk_norm_rope_kv(qkv, w, cos, sin, 1e-6, kc, vc, pos, nh, nkv)  # compile outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        k.qk_norm_rope_kv(qkv, w, cos, sin, 1e-6, kc, vc, pos, nh, nkv)
    kc.zero_()
    vc.zero_()
    for p in (3, 5):
        pos.fill_(p)
        g.replay()
    torch.cuda.synchronize()
    filled = vc.abs().sum((0, 1, 3)) > 0
    assert filled.tolist() == [False, False, False, True, False, True, False, False]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b", ROWS)
def test_attention(dtype, b):
    st.check_attention(DEV, dtype, b, seq=16, window=16, filled=1 + b - 1, seed=b)
    for w in (256, 1024, 2048):
        st.check_attention(DEV, dtype, b, seq=w + 64, window=w, filled=w - 5, seed=b + w, block_n=64)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b", ROWS)
def test_rope_attention(dtype, b):
    """The fused q/k norm + RoPE + cache write + attention at the predictor's window and the talker's
    split windows, rows at one shared position and (b > 1) each at its own."""
    for per_row in (False, True) if b > 1 else (False,):
        st.check_rope_attention(DEV, dtype, b, seq=16, window=16, pos=9, seed=b, per_row=per_row)
        for w in (256, 1024, 2048):
            st.check_rope_attention(DEV, dtype, b, seq=w + 64, window=w, pos=w - 5 - b, seed=b + w,
                                    per_row=per_row)


def test_rope_attention_in_cuda_graph():
    """pos is read on the device: one captured graph writes k / v wherever pos points at replay, with
    the window's split programs (256 positions) and the one-program path (16)."""
    from engine.kernels import attention as ka

    b, nh, nkv, d = 2, 16, 8, 128
    for window in (16, 256):
        qkv = torch.randn(b, (nh + 2 * nkv) * d, device=DEV, dtype=torch.bfloat16)
        w = torch.ones(nh + nkv, d, device=DEV, dtype=torch.bfloat16)
        cos, sin = st.rope_tables(d, 0, torch.bfloat16, DEV)
        kc, vc = (torch.zeros(b, nkv, window, d, device=DEV, dtype=torch.bfloat16) for _ in range(2))
        bias = torch.zeros(window, device=DEV, dtype=torch.bfloat16)
        pos = torch.tensor([0], device=DEV)
        ka.rope_attention(qkv, w, cos, sin, 1e-6, kc, vc, pos, bias, d ** -0.5, nh, nkv)  # compile first
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            ka.rope_attention(qkv, w, cos, sin, 1e-6, kc, vc, pos, bias, d ** -0.5, nh, nkv)
        kc.zero_()
        vc.zero_()
        for p in (3, window - 2):
            pos.fill_(p)
            g.replay()
        torch.cuda.synchronize()
        filled = (vc.abs().sum((0, 1, 3)) > 0).nonzero().flatten().tolist()
        assert filled == [3, window - 2], (window, filled)
        assert torch.equal(kc.abs().sum((0, 1, 3)) > 0, vc.abs().sum((0, 1, 3)) > 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b", [1, 2])
def test_attention_o_proj(dtype, b):
    """The predictor's q/k norm + attention + o_proj launch at real shapes, at every column block width,
    rows at one position and each at its own, the window's first and last positions."""
    for per_row in (False, True) if b > 1 else (False,):
        for cfg in ({"BLOCK_N": 8, "num_warps": 4}, {"BLOCK_N": 32, "num_warps": 2}, {"BLOCK_N": 64, "num_warps": 8}):
            st.check_attention_o_proj(DEV, dtype, b, seq=16, window=16, pos=9, seed=b, per_row=per_row, config=cfg)
        for pos in (0, 15):
            st.check_attention_o_proj(DEV, dtype, b, seq=16, window=16, pos=pos, seed=b + pos, per_row=per_row)


def test_attention_o_proj_in_cuda_graph():
    """pos is read on the device: one captured graph writes k / v wherever pos points at replay and
    attends with them; the split-K counters are left armed for the next replay."""
    from engine.kernels import attention_o_proj as kao

    b, nh, nkv, d, window = 1, 16, 8, 128, 16
    dt = torch.bfloat16
    qkv = torch.randn(b, (nh + 2 * nkv) * d, device=DEV, dtype=dt)
    w = torch.ones(nh + nkv, d, device=DEV, dtype=dt)
    cos, sin = st.rope_tables(d, 0, dt, DEV)
    kc, vc = (torch.zeros(b, nkv, window, d, device=DEV, dtype=dt) for _ in range(2))
    bias = torch.zeros(window, device=DEV, dtype=dt)
    pos = torch.tensor([0], device=DEV)
    wo = torch.randn(1024, nh * d, device=DEV, dtype=dt) * 0.02
    res = torch.randn(b, 1, 1024, device=DEV, dtype=dt)
    args = (qkv, w, cos, sin, 1e-6, kc, vc, pos, bias, d ** -0.5, nh, nkv, wo, res)
    kao.attention_o_proj(*args)  # compile first
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = kao.attention_o_proj(*args)
    kc.zero_()
    vc.zero_()
    for p in (3, window - 2):
        pos.fill_(p)
        g.replay()
        want_k, want_v = kc.clone(), vc.clone()
        want = kao.reference(*args[:5], want_k, want_v, *args[7:])
        torch.testing.assert_close(y, want, atol=3.2e-2, rtol=3.2e-2)
    torch.cuda.synchronize()
    filled = (vc.abs().sum((0, 1, 3)) > 0).nonzero().flatten().tolist()
    assert filled == [3, window - 2], filled
    assert torch.equal(kc.abs().sum((0, 1, 3)) > 0, vc.abs().sum((0, 1, 3)) > 0)
    assert int(SHARED.get("linear", torch.device(DEV)).abs().sum()) == 0


SAMPLE_CASES = st.SAMPLE_CASES


@pytest.mark.parametrize("vocab", [2048, 3072])
@pytest.mark.parametrize("case", list(SAMPLE_CASES))
def test_sample_matches_choose(vocab, case):
    st.check_sample_exact(DEV, 4096, vocab, seed=len(case) + vocab, max_flips=4, **SAMPLE_CASES[case])
    st.check_sample_exact(DEV, 1024, vocab, seed=len(case), rng="hash", max_flips=2, **SAMPLE_CASES[case])


@pytest.mark.parametrize("do_sample", [True, False])
def test_sample_codebook0_penalty_and_bookkeeping(do_sample):
    st.check_sample_penalty(DEV, 16, do_sample=do_sample, t=1 if do_sample else 4)


def test_sample_into_slots():
    st.check_sample_into_slots(DEV, 16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b,hidden,d", st.FRAME_GLUE_SHAPES)
def test_frame_glue(dtype, b, hidden, d):
    """The talker's input and RoPE rows, its final norm and the rows' bookkeeping, at the frame graph's shapes."""
    st.check_talker_input(DEV, dtype, b, hidden, d, seed=b + hidden)
    st.check_talker_input(DEV, dtype, b, hidden, d, seed=b + hidden + 1, exact_sums=True)
    st.check_frame_tail(DEV, dtype, b, hidden, seed=b + hidden)


@pytest.mark.parametrize("top_k,top_p,temperature", [(50, 1.0, 0.9), (50, 0.9, 0.9), (0, 0.8, 1.2), (8, 1.0, 2.0)])
def test_sample_distribution_chi_square(top_k, top_p, temperature):
    st.check_sample_distribution(DEV, 400_000, top_k=top_k, top_p=top_p, temperature=temperature)
