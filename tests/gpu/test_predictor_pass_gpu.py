"""The persistent code-predictor pass (engine/kernels/predictor_pass.py) on CUDA: the real predictor size
at every batch bucket, with the multi-program grid barrier and the L2 prefetch the interpreter cannot run;
and a whole engine with it, whose fp32 greedy codes must equal the plain eager runner's."""
import pytest
import torch

pytestmark = pytest.mark.gpu

from engine import Engine, Request, kernels
from engine.decode import EagerFrames
from engine.kernels import selftest as st
from tests.support.decoding import decode_codes

REAL = {"hidden": 1024, "inter": 3072, "layers": 5, "nh": 16, "nkv": 8, "d": 128}  # 0.6B and 1.7B predictor


@pytest.fixture(autouse=True, scope="module")
def _need_triton():
    ok, why = kernels.available("cuda")
    if not ok:
        pytest.skip(why)


# Each case compiles its own kernel variant (rows 1, 2: FMAs; 3..16: tensor cores), so the list stays short.
@pytest.mark.parametrize("dtype,rows,prefetch", [(torch.bfloat16, 1, True), (torch.bfloat16, 16, True),
                                                 (torch.bfloat16, 2, False), (torch.float32, 1, True)])
def test_real_size(dtype, rows, prefetch):
    cosine = st.check_predictor_pass("cuda", dtype, rows, positions=16, vocab=2048, prefetch=prefetch, **REAL)
    assert cosine >= 0.999


def test_grid_is_resident_and_barrier_holds_many_replays():
    from engine.kernels import predictor_pass as kp

    fs = st.predictor_stack("cuda", torch.bfloat16, **{k: REAL[k] for k in ("hidden", "inter", "nh", "nkv", "d")})
    run = kp.PredictorPass(fs)
    from engine.model.kv_cache import KVCache

    cache = KVCache(2, 1, 8, 16, 128, torch.bfloat16, "cuda")
    pos = torch.tensor([3], device="cuda")
    bias = torch.where(torch.arange(16, device="cuda") <= 3, 0.0, float("-inf")).to(torch.bfloat16)
    x = torch.randn(1, 1, 1024, device="cuda", dtype=torch.bfloat16)
    head = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16) * 0.03
    first = run(x, cache, pos, bias, fs.rope(pos, torch.bfloat16), head).clone()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert set(run.grids.values()) and max(run.grids.values()) <= sms
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(x, cache, pos, bias, fs.rope(pos, torch.bfloat16), head)
    for _ in range(200):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, first)  # deterministic: fixed tiles, fixed summation order
    assert run.barrier.tolist() == [0, 0]


@pytest.mark.parametrize("takes", [1, 3])
def test_fp32_greedy_engine_equals_eager(tiny_checkpoints, monkeypatch, takes):
    monkeypatch.setenv(kernels.PERSISTENT_PREDICTOR_ENV, "1")
    eng = Engine.load(tiny_checkpoints["custom_voice"], device="cuda", dtype="fp32", cuda_graphs="on",
                      triton="on", max_seq_len=512)
    assert "predictor_pass" in eng.info.kernels
    req = Request(mode="custom", text="One launch per predictor pass must decode the same codes.",
                  language="English", speaker="ryan")
    params = eng.defaults.greedy().replace(max_new_tokens=220)
    graphed, _ = decode_codes(eng, eng.runner, req, takes, params)
    assert eng.runner.fused["predictor"].persistent, "the persistent pass ran (no fallback)"
    plain, _ = decode_codes(eng, EagerFrames(eng.talker), req, takes, params)
    assert graphed.shape == (takes, 220, 16)
    assert torch.equal(graphed.cpu(), plain.cpu())
