"""CUDA-graph correctness on the GPU (skipped without CUDA).

"Eager" here is the same frame body run without capture; the graph must replay it exactly. In fp32
the graphed codes must also equal the plain eager runner (dynamic cache slicing, SDPA).
"""
import pytest
import torch

from engine import Engine, Request
from engine.decode import EagerFrames
from engine.gpu.frame_graph import GraphedFrames
from tests.support.decoding import decode_codes, joined_take

pytestmark = pytest.mark.gpu


FRAMES = 220  # crosses the 256-position attention window


def _req():
    return Request(mode="custom", text="Graphs must replay the eager frame exactly, frame after frame.",
                   language="English", speaker="ryan")


def _codes(engine, runner, takes, params, seed=0, first_take=0):
    codes, lengths = decode_codes(engine, runner, _req(), takes, params, seed=seed, first_take=first_take)
    return codes.cpu(), lengths


@pytest.fixture(scope="module")
def fp32(tiny_checkpoints):
    return Engine.load(tiny_checkpoints["custom_voice"], device="cuda", dtype="fp32", cuda_graphs="on",
                       triton="off", max_seq_len=512)


@pytest.fixture(scope="module")
def bf16(tiny_checkpoints):
    return Engine.load(tiny_checkpoints["custom_voice"], device="cuda", dtype="bf16", cuda_graphs="on",
                       triton="off", max_seq_len=512)


def test_graphs_are_on(fp32):
    assert fp32.info.cuda_graphs and isinstance(fp32.runner, GraphedFrames)


@pytest.mark.parametrize("takes", [1, 3])
def test_fp32_greedy_graph_equals_eager(fp32, takes):
    params = fp32.defaults.greedy().replace(max_new_tokens=FRAMES)
    graphed, _ = _codes(fp32, fp32.runner, takes, params)
    uncaptured, _ = _codes(fp32, GraphedFrames(fp32.talker, 512, capture=False), takes, params)
    plain, _ = _codes(fp32, EagerFrames(fp32.talker), takes, params)
    assert graphed.shape == (takes, FRAMES, 16)
    assert torch.equal(graphed, uncaptured)
    assert torch.equal(graphed, plain)


def test_fp32_sampled_graph_equals_eager(fp32):
    params = fp32.defaults.replace(max_new_tokens=FRAMES, top_p=0.9)
    graphed, _ = _codes(fp32, fp32.runner, 2, params, seed=5)
    uncaptured, _ = _codes(fp32, GraphedFrames(fp32.talker, 512, capture=False), 2, params, seed=5)
    assert torch.equal(graphed, uncaptured)


def test_bf16_graph_equals_eager_then_structure(bf16):
    """The frame graphs replay the uncaptured frame body exactly. Both prefill with the module's forward
    here: the prefill graphs run the fused prefill, which rounds at other points in bf16 (checked on its
    own in tests/gpu/test_prefill_graph.py); with them the codes are checked for structure."""
    params = bf16.defaults.greedy().replace(max_new_tokens=FRAMES)
    runner = bf16.runner
    saved, runner.prefill_graphs = runner.prefill_graphs, None
    try:
        graphed, _ = _codes(bf16, runner, 1, params)
    finally:
        runner.prefill_graphs = saved
    uncaptured, _ = _codes(bf16, GraphedFrames(bf16.talker, 512, capture=False), 1, params)
    plain, _ = _codes(bf16, EagerFrames(bf16.talker), 1, params)
    assert torch.equal(graphed, uncaptured)
    same = int((graphed[0] == plain[0]).all(1).long().cumprod(0).sum())
    print(f"bf16: graphed and plain eager agree on the first {same} of {FRAMES} frames")
    fused, _ = _codes(bf16, runner, 1, params)
    same = int((fused[0] == graphed[0]).all(1).long().cumprod(0).sum())
    print(f"bf16: with the fused prefill graphs, the first {same} of {FRAMES} frames agree")
    for codes in (graphed, fused):
        assert codes.shape == (1, FRAMES, 16)
        assert (codes >= 0).all() and (codes < 2048).all()


def test_takes_in_a_batch_equal_takes_alone_under_graphs(fp32):
    params = fp32.defaults.replace(max_new_tokens=60)
    batch, _ = _codes(fp32, fp32.runner, 4, params, seed=3)
    for i in range(4):
        alone, _ = _codes(fp32, fp32.runner, 1, params, seed=3, first_take=i)
        assert torch.equal(alone[0], batch[i]), f"take {i}"


def test_same_seed_reproducible_under_graphs(fp32):
    params = fp32.defaults.replace(max_new_tokens=40)
    a, _ = _codes(fp32, fp32.runner, 2, params, seed=8)
    b, _ = _codes(fp32, fp32.runner, 2, params, seed=8)
    assert torch.equal(a, b)


@pytest.mark.parametrize("chunk", [4, 8])
def test_streaming_equals_generate_under_graphs(fp32, chunk):
    params = fp32.defaults.replace(max_new_tokens=30)
    whole = fp32.generate(_req(), takes=2, seed=2, params=params)
    parts = list(fp32.stream(_req(), takes=2, seed=2, params=params, chunk_frames=chunk))
    for i in range(2):
        joined = joined_take(parts, i)
        assert joined.shape[0] == whole.lengths[i]
        assert float((joined - whole.audio[i, : whole.lengths[i]]).abs().max()) <= 1e-5


def test_sampling_params_change_without_recapture(fp32):
    runner = fp32.runner
    fp32.generate(_req(), params=fp32.defaults.replace(max_new_tokens=5))
    graphs = len(runner.graphs)
    fp32.generate(_req(), params=fp32.defaults.replace(max_new_tokens=5, temperature=0.5, top_k=7, top_p=0.8,
                                                       subtalker_top_k=3, repetition_penalty=1.3))
    fp32.generate(_req(), params=fp32.defaults.greedy().replace(max_new_tokens=5))
    assert len(runner.graphs) == graphs
