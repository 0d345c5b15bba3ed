"""Rows with different prompts under CUDA graphs (skipped without CUDA): in fp32 each item of a mixed batch
equals itself generated alone (greedy and sampled, with and without the Triton kernels), the graphs serve
admissions without recapturing per row, and batch 1 is unchanged."""
import pytest
import torch

from engine import BatchItem, Engine, Request

pytestmark = pytest.mark.gpu


def _req(text, speaker="ryan", language="English", **kw):
    return Request(mode="custom", text=text, language=language, speaker=speaker, **kw)


ITEMS = [
    BatchItem(_req("Short one."), seed=1),
    BatchItem(_req("A much longer line, so that its prompt and its trailing text differ a lot from the others "
                   "in the batch, and its window grows past the others.", speaker="vivian",
                   non_streaming_mode=False), seed=2),
    BatchItem(_req("Takes ride along as rows of their own.", instruct="Speak slowly."), takes=2, seed=3),
    BatchItem(_req("Ein deutscher Satz.", language="German"), seed=4, max_new_tokens=40),
    BatchItem(_req("Auto language, streaming layout.", language="auto", non_streaming_mode=False), seed=5),
    BatchItem(_req("One more row than slots."), seed=6),
]


def _engine(path, triton):
    return Engine.load(path, device="cuda", dtype="fp32", cuda_graphs="on", triton=triton, max_seq_len=512)


@pytest.mark.parametrize("triton", ["off", "on"])
@pytest.mark.parametrize("greedy", [True, False])
def test_fp32_mixed_rows_equal_each_alone_under_graphs(eos_checkpoint, triton, greedy):
    if triton == "on":
        from engine import kernels

        ok, why = kernels.available("cuda")
        if not ok:
            pytest.skip(why)
    e = _engine(eos_checkpoint, triton)
    assert e.info.cuda_graphs
    params = e.defaults.replace(max_new_tokens=300)
    params = params.greedy() if greedy else params
    results = e.generate_batch(ITEMS, params=params, max_rows=4, chunk_frames=4)  # 7 rows in 4 slots
    ends = []
    for item, res in zip(ITEMS, results):
        p = params if item.max_new_tokens is None else params.replace(max_new_tokens=item.max_new_tokens)
        alone = e.generate(item.request, takes=item.takes, seed=item.seed, params=p)
        assert res.lengths == alone.lengths, (item.request.text, res.lengths, alone.lengths)
        for i in range(item.takes):
            assert torch.equal(res.codes[i], alone.codes[i]), f"{item.request.text!r} take {i}"
        if res.audio.numel():
            assert float((res.audio - alone.audio).abs().max()) <= 1e-4
        ends += [n // 1920 for n in res.lengths]
    print(f"triton {triton} greedy {greedy}: row ends {ends}, batch {results[0].stats['batch']}")
    assert len(set(ends)) >= 3, ends


def test_fp32_rows_in_other_attention_windows_than_alone(eos_checkpoint, monkeypatch):
    """With 32-position windows the batch attends over the longest row's window while each row alone uses
    its own: the extra positions are masked, so the codes must still be identical."""
    from engine.gpu import frame_graph

    monkeypatch.setattr(frame_graph, "WINDOW_STEP", 32)
    e = _engine(eos_checkpoint, "off")
    params = e.defaults.replace(max_new_tokens=120)
    results = e.generate_batch(ITEMS, params=params, max_rows=4, chunk_frames=4)
    for item, res in zip(ITEMS, results):
        p = params if item.max_new_tokens is None else params.replace(max_new_tokens=item.max_new_tokens)
        alone = e.generate(item.request, takes=item.takes, seed=item.seed, params=p)
        for i in range(item.takes):
            assert torch.equal(res.codes[i], alone.codes[i]), f"{item.request.text!r} take {i}"
    assert len({k[1] for k in e.runner.graphs}) >= 2  # several windows were really used


def test_graphs_are_reused_across_admissions(tiny_checkpoints):
    e = _engine(tiny_checkpoints["custom_voice"], "off")
    items = [BatchItem(_req(f"Line number {k}."), seed=k, max_new_tokens=20 + 7 * k) for k in range(10)]
    e.generate_batch(items, max_rows=4)
    graphs = len(e.runner.graphs)
    res = e.generate_batch(items, max_rows=4)
    assert len(e.runner.graphs) == graphs  # same buckets and windows: nothing new is captured
    assert [r.lengths[0] // 1920 for r in res] == [20 + 7 * k for k in range(10)]
    assert res[0].stats["batch"]["occupancy"] > 0.6
