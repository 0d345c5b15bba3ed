"""Split-KV ("flash-decoding") decode attention on CUDA at the talker's shapes (nh 16, nkv 8, D 128 for
0.6B and 1.7B; windows 256..2048, multiples of frame_graph.WINDOW_STEP) against the torch reference, with
per-row lengths (rows shorter than the window leave whole splits masked), and inside a CUDA graph whose
replays must find the arrival counters re-armed. Tolerances: tests/support/kernels_selftest.py ATTN_TOL."""
import pytest
import torch

pytestmark = pytest.mark.gpu

from engine import kernels
from engine.kernels import attention as ka
from engine.kernels import pdl as kpdl
from tests.support import kernels_selftest as st
from engine.kernels.counters import SHARED

DEV = "cuda"
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
NH, NKV, D = 16, 8, 128


@pytest.fixture(autouse=True, scope="module")
def _need_triton():  # CUDA itself is checked by the gpu marker (tests/conftest.py)
    ok, why = kernels.available("cuda")
    if not ok:
        pytest.skip(why)


def lengths(b: int, window: int) -> list:
    """Row 0 is the longest (it set the window); the others shorter, one of them a single position."""
    return [1 if 0 < i == b - 1 else max(1, window - 3 - window * i // b) for i in range(b)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b", [1, 4, 16])
@pytest.mark.parametrize("window", [256, 512, 1024, 2048])
@pytest.mark.parametrize("dot", [False, True], ids=["fma", "dot"])
def test_talker_windows(dtype, b, window, dot):
    launch = st.check_attention(DEV, dtype, b, NH, NKV, D, seq=window + 64, window=window,
                                lengths=lengths(b, window), seed=b + window, config={"USE_DOT": dot})
    assert launch["splits"] > 1, launch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("chunk", [32, 64, 128, 256, 512])
def test_chunks(dtype, chunk):
    for b in (1, 16):
        st.check_attention(DEV, dtype, b, NH, NKV, D, seq=1100, window=1024, lengths=lengths(b, 1024),
                           chunk=chunk, seed=chunk + b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_shared_bias(dtype):
    for window in (256, 1024):
        st.check_attention(DEV, dtype, 4, NH, NKV, D, seq=window + 8, window=window, filled=window - 100, seed=3)


@pytest.mark.parametrize("dot", [False, True], ids=["fma", "dot"])
@pytest.mark.parametrize("pdl", [False, True], ids=["plain", "pdl"])
def test_split_in_cuda_graph(dot, pdl):
    """One capture, replays with other queries, caches and row lengths: each matches the reference
    (the counters re-arm), and two replays of the same inputs give the same bits."""
    if pdl and not kpdl.support(DEV)[0]:
        pytest.skip(kpdl.support(DEV)[1])
    b, window, dt = 4, 1024, torch.bfloat16
    cfg = {"USE_DOT": dot}
    q = torch.randn(b, NH, D, device=DEV, dtype=dt)
    kc, vc = (torch.randn(b, NKV, 2048, D, device=DEV, dtype=dt) for _ in range(2))
    bias = torch.zeros(b, 1, 1, window, device=DEV, dtype=dt)

    def set_lengths(seen):
        pos = torch.arange(window, device=DEV)[None] < torch.tensor(seen, device=DEV)[:, None]
        bias.copy_(torch.where(pos, 0.0, float("-inf")).to(dt)[:, None, None])

    set_lengths([window, 700, 300, 1])
    assert ka.plan(b, NKV, window, torch.cuda.get_device_properties(0).multi_processor_count, None, cfg)["splits"] > 1
    ka.attention(q, kc, vc, bias, D ** -0.5, config=cfg, pdl=pdl)  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = ka.attention(q, kc, vc, bias, D ** -0.5, config=cfg, pdl=pdl)
    for seen in ([900, 1024, 5, 513], [1, 2, 1000, 256]):
        q.copy_(torch.randn_like(q))
        kc.mul_(-1.5)
        set_lengths(seen)
        g.replay()
        torch.cuda.synchronize()
        first = out.clone()
        torch.testing.assert_close(out.float(), ka.reference(q, kc, vc, bias, D ** -0.5).float(),
                                   atol=3.2e-2, rtol=3.2e-2)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, first)
    assert int(SHARED.get("attention", out.device).abs().sum()) == 0


def room_lengths(b: int, room: int) -> list:
    """Rows from near the room down to one position, across the chunk sizes' changes (a length's chunks grow
    past `want` chunks of MIN_CHUNK)."""
    picks = [room - 1, 2113, 1000, 300, 33, 1, 4000, 257]
    return [picks[i % len(picks)] for i in range(b)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b", [1, 4, 16])
@pytest.mark.parametrize("dot", [False, True], ids=["fma", "dot"])
def test_device_length(dtype, b, dot):
    """No bias: each row's length read from its position on the device, over a 4096-position room (the
    engine's default max_seq_len), plain and fused with q/k norm + RoPE + the cache write."""
    for i, length in enumerate(room_lengths(b, 4096)[:3] if b == 1 else [None]):
        seen = [length] if length else room_lengths(b, 4096)
        st.check_attention(DEV, dtype, b, NH, NKV, D, seq=4096, lengths=seen, seed=b + i, config={"USE_DOT": dot},
                           device_length=True)
    st.check_rope_attention(DEV, dtype, b, NH, NKV, D, seq=4096, pos=2500, per_row=b > 1, seed=b,
                            config={"USE_DOT": dot}, device_length=True)


@pytest.mark.parametrize("pdl", [False, True], ids=["plain", "pdl"])
def test_device_length_in_cuda_graph(pdl):
    """One capture serves every length: replays after the rows' positions change (past the grid's first
    chunks, down to one position) match the reference, twice with the same bits, and the counters re-arm."""
    if pdl and not kpdl.support(DEV)[0]:
        pytest.skip(kpdl.support(DEV)[1])
    b, room, dt = 4, 4096, torch.bfloat16
    q = torch.randn(b, NH, D, device=DEV, dtype=dt)
    kc, vc = (torch.randn(b, NKV, room, D, device=DEV, dtype=dt) for _ in range(2))
    pos = torch.tensor([10, 20, 30, 40], device=DEV)
    ka.attention(q, kc, vc, None, D ** -0.5, pdl=pdl, pos=pos)  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = ka.attention(q, kc, vc, None, D ** -0.5, pdl=pdl, pos=pos)
    for seen in ([4095, 700, 3000, 0], [0, 1, 2112, 255], [33, 4000, 1024, 100]):
        q.copy_(torch.randn_like(q))
        kc.mul_(-1.5)
        pos.copy_(torch.tensor(seen, device=DEV))
        g.replay()
        torch.cuda.synchronize()
        first = out.clone()
        torch.testing.assert_close(out.float(), ka.reference(q, kc, vc, None, D ** -0.5, pos=pos).float(),
                                   atol=3.2e-2, rtol=3.2e-2)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, first)
    assert int(SHARED.get("attention", out.device).abs().sum()) == 0
