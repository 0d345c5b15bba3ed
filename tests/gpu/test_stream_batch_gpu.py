"""Engine.stream (a list) under CUDA graphs (skipped without CUDA): in fp32 each take's joined chunks equal that
take generated alone (greedy codes identical, audio within 1e-4), with every row's codec chunks replayed
from the captured one-row pieces (rows take turns on the graph state), nothing captured during the
requests, and an early close handing the engine and the graph state back."""
import numpy as np
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
    BatchItem(_req("One more row than slots."), seed=6),
]


def _engine(path):
    return Engine.load(path, device="cuda", dtype="fp32", cuda_graphs="on", triton="off", max_seq_len=512)


def _joined(chunks):
    out = {}
    for c in chunks:
        codes, audio = out.setdefault((c.item, c.take), ([], []))
        codes.append(c.codes)
        audio.append(c.audio)
    return {k: (torch.cat(c), torch.cat(a)) for k, (c, a) in out.items()}


def _check_alone(e, items, params, joined):
    ends = []
    for k, item in enumerate(items):
        p = params if item.max_new_tokens is None else params.replace(max_new_tokens=item.max_new_tokens)
        alone = e.generate(item.request, takes=item.takes, seed=item.seed, params=p)
        for i in range(item.takes):
            codes, audio = joined[(k, i)]
            assert torch.equal(codes, alone.codes[i]), f"{item.request.text!r} take {i}"
            n = alone.lengths[i]
            assert audio.shape[0] == n
            if n:
                assert float((audio - alone.audio[i, :n]).abs().max()) <= 1e-4, (k, i)
            ends.append(n // 1920)
    return ends


@pytest.mark.parametrize("greedy", [True, False])
def test_fp32_streamed_list_takes_equal_each_alone_under_graphs(eos_checkpoint, greedy):
    e = _engine(eos_checkpoint)
    assert e.info.cuda_graphs and e.codec_graphs is not None
    params = e.defaults.replace(max_new_tokens=300)
    params = params.greedy() if greedy else params
    cg = e.codec_graphs
    late, eager, replays = cg.late_captures, cg.eager_pieces, cg.replays
    chunks = list(e.stream(ITEMS, params=params, chunk_frames=4, first_chunk_frames=2, max_rows=4))
    assert (chunks[0].item, chunks[0].take) == (0, 0) and chunks[0].codes.shape[0] <= 2
    assert cg.late_captures == late and cg.eager_pieces == eager and cg.replays > replays  # all rows graphed
    assert cg.private_streams == 0
    ends = _check_alone(e, ITEMS, params, _joined(chunks))
    print(f"greedy {greedy}: row ends {ends}, codec replays {cg.replays - replays}")
    assert len(set(ends)) >= 3, ends


def test_fp32_streamed_list_icl_rows_under_graphs(tiny_checkpoints):
    e = _engine(tiny_checkpoints["base"])
    t = np.arange(2 * 24000) / 24000
    wav = (0.3 * np.sin(2 * np.pi * 190 * t)).astype(np.float32)
    icl = e.extract_voice(wav, 24000, ref_text="A reference line.")
    xvec = e.extract_voice(wav[: 24000], 24000)
    items = [BatchItem(Request(mode="clone", text=f"Line {k} of a cloned voice.", language="English",
                               voice=icl if k % 2 == 0 else xvec), seed=k, max_new_tokens=10 + 6 * k)
             for k in range(5)]
    params = e.defaults.greedy().replace(max_new_tokens=60)
    chunks = list(e.stream(items, params=params, chunk_frames=5, max_rows=3))
    _check_alone(e, items, params, _joined(chunks))


def test_early_close_under_graphs_frees_the_engine_and_the_codec_state(eos_checkpoint):
    e = _engine(eos_checkpoint)
    params = e.defaults.greedy().replace(max_new_tokens=60)
    gen = e.stream(ITEMS, params=params, chunk_frames=2, max_rows=4)
    next(gen), next(gen)
    gen.close()
    assert not e._lock.busy
    private = e.codec_graphs.private_streams
    alone = e.generate(ITEMS[0].request, seed=1, params=params)
    streamed = torch.cat([c.audio for c in e.stream(ITEMS[0].request, seed=1, params=params)])
    assert e.codec_graphs.private_streams == private  # the one-row graph state was handed back
    assert float((streamed - alone.audio[0]).abs().max()) <= 1e-4
