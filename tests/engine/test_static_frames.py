"""The CUDA-graph frame body (engine/gpu) run eagerly on the CPU equals the eager frame runner.

Everything the graph captures (static-cache attention with a position tensor, tensor-valued sampling
settings, the trailing-text table, bucket padding rows) is exercised here without a GPU; tests/gpu
checks the captured replay itself.
"""
import pytest
import torch

from engine import Engine, Request
from engine.gpu import buckets, frame_graph
from engine.gpu.frame_graph import GraphedFrames
from engine.gpu.fused_layers import FusedStack
from tests.support.decoding import decode_codes


@pytest.fixture(scope="module")
def engine(tiny_checkpoints):
    return Engine.load(tiny_checkpoints["custom_voice"], device="cpu", dtype="fp32", max_seq_len=400)


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("takes", [1, 3])
def test_static_frame_body_equals_eager(engine, monkeypatch, greedy, takes):
    monkeypatch.setattr(frame_graph, "WINDOW_STEP", 16)  # cross several attention windows
    params = engine.defaults.replace(max_new_tokens=48, temperature=0.8, top_k=30, top_p=0.9,
                                     subtalker_top_k=20, subtalker_top_p=0.95)
    if greedy:
        params = params.greedy()
    req = Request(mode="custom", text="Static frames must match the eager loop.", language="English", speaker="ryan")
    eager, n_eager = decode_codes(engine, engine.runner, req, takes, params, seed=9)
    graph, n_graph = decode_codes(engine, GraphedFrames(engine.talker, 400, capture=False), req, takes, params, seed=9)
    assert n_eager == n_graph
    assert torch.equal(eager, graph)


def test_projected_tables_are_the_projected_rows(engine):
    """The tiny predictor is narrower than its talker (as the 1.7B's): the frame's predictor inputs are rows of
    projected copies of the c0 table and codebooks 1..14, each the projection of the plain row (the test above
    runs them against the eager loop, which projects every input)."""
    talker = engine.talker
    proj = talker.code_predictor.small_to_mtp_projection
    assert isinstance(proj, torch.nn.Linear)
    tables = frame_graph.projected_tables(talker)
    plain = [talker.model.codec_embedding.weight] + [e.weight for e in talker.code_predictor.model.codec_embedding]
    assert len(tables) == len(plain) - 1  # the last codebook feeds no pass
    for table, rows in zip(tables, plain):
        assert table.shape == (rows.shape[0], proj.out_features) and table.dtype == rows.dtype
        torch.testing.assert_close(table, proj(rows), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("pad", [0, 21])
def test_fused_prefill_equals_module_forward(engine, pad):
    """FusedStack.prefill (what the prefill graphs capture; every op its torch reference here) against the
    module's forward at the prompt's exact length: the same hidden states and K/V, with padding rows after
    the prompt or without."""
    talker = engine.talker
    req = Request(mode="custom", text="The fused prefill follows the module.", language="English", speaker="ryan")
    prompt = engine.builder.build(req)
    length = prompt.prefill.shape[1]
    fused = FusedStack(talker.model)
    x = torch.cat([prompt.prefill, torch.zeros(1, pad, prompt.prefill.shape[2])], 1)
    with torch.inference_mode():
        want_cache, got_cache = talker.new_cache(1, 128), talker.new_cache(1, 128)
        want = talker.model(prompt.prefill, want_cache, 0)
        got = fused.prefill(x, got_cache, fused.rope(torch.arange(length + pad), x.dtype))
    assert got.shape == x.shape
    torch.testing.assert_close(got[:, :length], want, atol=1e-5, rtol=1e-5)
    for mine, theirs in zip(got_cache.k + got_cache.v, want_cache.k + want_cache.v):
        torch.testing.assert_close(mine[:, :, :length], theirs[:, :, :length], atol=1e-5, rtol=1e-5)


def test_batch_buckets():
    assert [buckets.batch_bucket(n) for n in (1, 2, 3, 5, 8, 9, 16, 17, 33, 64)] == [1, 2, 4, 8, 8, 16, 16, 32, 64, 64]
    with pytest.raises(ValueError):
        buckets.batch_bucket(65)


def test_bucket_for_takes_its_own_then_the_loads():
    assert buckets.bucket_for(2, captured={1, 4}, warm=(1, 4)) == 4  # the load's 4-row graphs: no capture
    assert buckets.bucket_for(2, captured={1, 2, 4}, warm=(1, 4)) == 2  # its own, once it exists
    assert buckets.bucket_for(3, captured={1}, warm=(1,)) == 4  # nothing larger from the load: its own
    assert buckets.bucket_for(4, captured={1, 16}, warm=(1,)) == 4  # a request's 16-row capture is no default
    assert buckets.bucket_for(5, captured={1, 4}, warm=(1, 4)) == 8
    assert buckets.bucket_for(1, captured=set(), warm=()) == 1


def test_talker_and_predictor_run_the_engines_kernels(engine):
    """Both stacks of the frame run the engine's kernel table; with the attention kernel on, the talker reads
    each row's length on the device (one graph a bucket). Building the runner launches nothing."""
    from engine.kernels import Kernels

    ks = Kernels(("linear", "attention"))
    runner = GraphedFrames(engine.talker, 400, capture=False, kernels=ks)
    assert runner.fused["talker"].ks is ks and runner.fused["predictor"].ks is ks
    assert runner.device_length


def test_release_drops_the_merged_weights(tiny_checkpoints):
    """The fused steps merge q/k/v and gate/up into tensors the parameters then view; release() moves the
    parameters, so it must also drop those merged tensors (on a GPU they would stay allocated, unreachable)."""
    from engine.gpu.fused_layers import fused

    eng = Engine.load(tiny_checkpoints["custom_voice"], device="cpu", dtype="fp32", max_seq_len=64)
    FusedStack(eng.talker.model)
    FusedStack(eng.talker.code_predictor.model)
    layers = [m for m in eng.talker.modules() if "_fused" in m.__dict__]
    assert layers
    merged = fused(layers[0]).qkv
    assert layers[0].self_attn.q_proj.weight.data_ptr() == merged.data_ptr()  # a view of the merged rows
    eng.release()
    assert not [m for m in eng.talker.modules() if "_fused" in m.__dict__]
