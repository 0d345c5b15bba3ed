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


def _equal_alone(e, items, results, params) -> list:
    """Each item of a batch equals itself generated alone; returns every row's frames."""
    for item, res in zip(items, results):
        p = params if item.max_new_tokens is None else params.replace(max_new_tokens=item.max_new_tokens)
        alone = e.generate(item.request, takes=item.takes, seed=item.seed, params=p)
        assert res.lengths == alone.lengths, (item.request.text, res.lengths, alone.lengths)
        for i in range(item.takes):
            assert torch.equal(res.codes[i], alone.codes[i]), f"{item.request.text!r} take {i}"
        assert res.audio.shape == alone.audio.shape and res.audio.is_contiguous() and alone.audio.is_contiguous()
        if res.audio.numel():
            assert float((res.audio - alone.audio).abs().max()) <= 1e-4, item.request.text
    return [n // 1920 for res in results for n in res.lengths]


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
    results = e.generate(ITEMS, params=params, max_rows=4, chunk_frames=4)  # 7 rows in 4 slots
    ends = _equal_alone(e, ITEMS, results, params)
    print(f"triton {triton} greedy {greedy}: row ends {ends}, batch {results[0].stats['batch']}")
    assert len(set(ends)) >= 3, ends


def test_fp32_rows_in_other_attention_windows_than_alone(eos_checkpoint, monkeypatch):
    """With 32-position windows the batch attends over the longest row's window while each row alone uses
    its own: the extra positions are masked, so the codes must still be identical."""
    from engine.gpu import frame_graph

    monkeypatch.setattr(frame_graph, "WINDOW_STEP", 32)
    e = _engine(eos_checkpoint, "off")
    params = e.defaults.replace(max_new_tokens=120)
    results = e.generate(ITEMS, params=params, max_rows=4, chunk_frames=4)
    for item, res in zip(ITEMS, results):
        p = params if item.max_new_tokens is None else params.replace(max_new_tokens=item.max_new_tokens)
        alone = e.generate(item.request, takes=item.takes, seed=item.seed, params=p)
        for i in range(item.takes):
            assert torch.equal(res.codes[i], alone.codes[i]), f"{item.request.text!r} take {i}"
    assert len({k[1] for k in e.runner.graphs}) >= 2  # several windows were really used


def test_graphs_are_reused_across_admissions(tiny_checkpoints):
    e = _engine(tiny_checkpoints["custom_voice"], "off")
    items = [BatchItem(_req(f"Line number {k}."), seed=k, max_new_tokens=20 + 7 * k) for k in range(10)]
    e.generate(items, max_rows=4)
    graphs = len(e.runner.graphs)
    res = e.generate(items, max_rows=4)
    assert len(e.runner.graphs) == graphs  # same buckets and windows: nothing new is captured
    assert [r.lengths[0] // 1920 for r in res] == [20 + 7 * k for k in range(10)]
    assert res[0].stats["batch"]["occupancy"] > 0.6


@pytest.mark.parametrize("greedy", [True, False])
def test_fp32_rows_that_all_fit_decode_the_codec_during_the_frames(eos_checkpoint, greedy):
    """Every row holds a slot from the first frame (7 rows, 16 slots): the codec runs on a side stream while the
    frames run (as in generate), and each item, its takes sitting anywhere in the batch, equals itself alone."""
    e = _engine(eos_checkpoint, "off")
    params = e.defaults.replace(max_new_tokens=300)
    params = params.greedy() if greedy else params
    results = e.generate(ITEMS, params=params)
    assert {r.stats["codec"] for r in results} == {"batched"}
    assert results[0].stats["batch"]["slots"] == 7
    _equal_alone(e, ITEMS, results, params)
    assert len({n for r in results for n in r.lengths}) >= 3  # rows ended at different frames
    one = e.generate([ITEMS[2]], params=params)  # the nodes' case: one line, its takes
    assert one[0].stats["codec"] == "batched"
    _equal_alone(e, [ITEMS[2]], one, params)


def test_fp32_icl_rows_share_the_reference_during_the_frames(tiny_checkpoints):
    """Segments of one cloned voice (one reference) overlap the codec; two voices decode it after the frames."""
    from engine import Voice

    e = _engine(tiny_checkpoints["base"], "off")
    g = torch.Generator().manual_seed(3)

    def voice(frames):
        return Voice(spk_embedding=0.1 * torch.randn(e.cfg.embedding_width, generator=g),
                     model_size=e.cfg.tts_model_size, ref_codes=torch.randint(0, 2048, (frames, 16), generator=g),
                     ref_text="Reference words.")

    mine, other = voice(13), voice(21)
    clone = [BatchItem(Request(mode="clone", text=t, language="English", voice=mine), takes=k, seed=s,
                       max_new_tokens=n) for t, k, s, n in (("First segment.", 2, 1, 30), ("Second one.", 1, 2, 17))]
    params = e.defaults.replace(max_new_tokens=40)
    results = e.generate(clone, params=params)
    assert {r.stats["codec"] for r in results} == {"batched"}
    _equal_alone(e, clone, results, params)
    mixed = clone + [BatchItem(Request(mode="clone", text="Another voice.", language="English", voice=other),
                               seed=3, max_new_tokens=25)]
    results = e.generate(mixed, params=params)
    assert {r.stats["codec"] for r in results} == {"per row"}
    _equal_alone(e, mixed, results, params)
