"""Rows with different prompts in one batch (Engine.generate (a list)): each item equals itself generated
alone, in CPU fp32, greedy and sampled, with rows of different modes, prompt lengths and ends, more rows
than slots (continuous admission) and takes inside items."""
import numpy as np
import pytest
import torch

from engine import BatchItem, Engine, Request
from engine.decode import EagerFrames, Row, decode_rows
from engine.gpu import frame_graph
from engine.gpu.frame_graph import GraphedFrames


@pytest.fixture(scope="module")
def custom(eos_checkpoint):
    return Engine.load(eos_checkpoint, device="cpu", dtype="fp32")


@pytest.fixture(scope="module")
def base(eos_base_checkpoint):
    return Engine.load(eos_base_checkpoint, device="cpu", dtype="fp32")


def _custom(text, speaker="ryan", language="English", **kw):
    return Request(mode="custom", text=text, language=language, speaker=speaker, **kw)


def custom_items():
    return [
        BatchItem(_custom("Short one."), seed=1),
        BatchItem(_custom("A much longer line, so that its prompt and its trailing text differ a lot from the "
                          "others in the batch.", speaker="vivian", non_streaming_mode=False), seed=2),
        BatchItem(_custom("Takes ride along as rows of their own.", instruct="Speak slowly."), takes=2, seed=3,
                  first_take=1),
        BatchItem(_custom("Ein deutscher Satz mit anderer Sprache.", language="German", speaker="ryan"), seed=4,
                  max_new_tokens=9),
        BatchItem(_custom("Auto language, streaming layout.", language="auto", non_streaming_mode=False), seed=5),
    ]


def _assert_items_equal_alone(engine, items, params, results):
    ends = []
    for item, res in zip(items, results):
        alone = engine.generate(item.request, takes=item.takes, seed=item.seed, first_take=item.first_take,
                                params=params if item.max_new_tokens is None
                                else params.replace(max_new_tokens=item.max_new_tokens))
        assert res.lengths == alone.lengths
        for i in range(item.takes):
            assert torch.equal(res.codes[i], alone.codes[i]), f"{item.request.text!r} take {i}"
        assert res.audio.shape == alone.audio.shape
        if res.audio.numel():
            assert float((res.audio - alone.audio).abs().max()) <= 1e-5
        ends += [n // 1920 for n in res.lengths]
    return ends


@pytest.mark.parametrize("greedy", [True, False])
def test_mixed_custom_rows_equal_each_alone(custom, greedy):
    params = custom.defaults.replace(max_new_tokens=30)
    params = params.greedy() if greedy else params
    items = custom_items()
    results = custom.generate(items, params=params, max_rows=3, chunk_frames=3)  # 6 rows in 3 slots
    ends = _assert_items_equal_alone(custom, items, params, results)
    assert len(set(ends)) >= 3 and min(ends) < 30, ends  # rows end at different frames, some by EOS
    batch = results[0].stats["batch"]
    assert batch["rows"] == 6 and batch["slots"] == 3 and 0 < batch["occupancy"] <= 1


def test_mixed_clone_rows_equal_each_alone(base):
    t = np.arange(2 * 24000) / 24000
    wav = (0.3 * np.sin(2 * np.pi * 190 * t)).astype(np.float32)
    icl = base.extract_voice(wav, 24000, ref_text="A reference line.")
    xvec = base.extract_voice(wav[: 24000], 24000)
    items = [
        BatchItem(Request(mode="clone", text="In-context cloning of a voice.", language="English", voice=icl), seed=1),
        BatchItem(Request(mode="clone", text="Only the x-vector here.", language="English", voice=xvec), seed=2),
        BatchItem(Request(mode="clone", text="ICL again, but the whole text goes into the prompt first.",
                          language="English", voice=icl, non_streaming_mode=True), seed=3),
        BatchItem(Request(mode="clone", text="Un autre texte.", language="French", voice=xvec), takes=2, seed=4),
    ]
    for params in (base.defaults.greedy().replace(max_new_tokens=24), base.defaults.replace(max_new_tokens=24)):
        results = base.generate(items, params=params, max_rows=4, chunk_frames=5)
        _assert_items_equal_alone(base, items, params, results)


def test_design_rows_equal_each_alone(tiny_checkpoints):
    e = Engine.load(tiny_checkpoints["voice_design"], device="cpu", dtype="fp32")
    items = [BatchItem(Request(mode="design", text=text, language="English", instruct=ins), seed=k)
             for k, (text, ins) in enumerate([("A calm line.", "A warm low voice."),
                                              ("A second, longer line with more words in it.", "Bright and fast."),
                                              ("Third.", "Whispering.")])]
    params = e.defaults.greedy().replace(max_new_tokens=12)
    _assert_items_equal_alone(e, items, params, e.generate(items, params=params))


def test_progress_counts_frames_over_all_rows(tiny_checkpoints):
    e = Engine.load(tiny_checkpoints["custom_voice"], device="cpu", dtype="fp32")  # EOS off: exact budgets
    items = [BatchItem(_custom("One."), max_new_tokens=5), BatchItem(_custom("Two."), takes=2, max_new_tokens=9),
             BatchItem(_custom("Three."), max_new_tokens=3)]
    seen = []
    results = e.generate(items, max_rows=2, chunk_frames=2, on_progress=lambda d, t: seen.append((d, t)))
    assert [r.lengths for r in results] == [[5 * 1920], [9 * 1920] * 2, [3 * 1920]]
    assert seen[-1] == (26, 26)
    assert all(d <= t for d, t in seen) and [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_batch_input_errors(custom):
    from engine.errors import InvalidInputError

    assert custom.generate([]) == []
    with pytest.raises(InvalidInputError):
        custom.generate([BatchItem(_custom("x"))], max_rows=0)
    with pytest.raises(InvalidInputError, match="speaker"):
        custom.generate([BatchItem(_custom("x")), BatchItem(_custom("y", speaker="nobody"))])


@pytest.mark.parametrize("greedy", [True, False])
def test_static_frame_body_serves_mixed_rows(custom, monkeypatch, greedy):
    """The graph frame body (per-row positions, masks, trailing text, budgets) run uncaptured on the CPU
    equals the eager runner on a mixed batch with admissions."""
    monkeypatch.setattr(frame_graph, "WINDOW_STEP", 16)  # cross several attention windows
    params = custom.defaults.replace(max_new_tokens=40, top_p=0.9)
    params = params.greedy() if greedy else params
    rows = []
    for k, item in enumerate(custom_items()):
        prompt, _, frames = custom.prepare(item.request, item.takes, params, max_new_tokens=item.max_new_tokens)
        rows += [Row(prompt, 1000 + 7 * k + i, frames) for i in range(item.takes)]

    def run(runner):
        out = {}
        for c in decode_rows(runner, rows, slots=3, params=params, eos_id=custom.cfg.talker.codec_eos_id,
                             chunk_frames=4):
            for slot, r in enumerate(c.rows):
                if r >= 0:
                    out.setdefault(r, []).append(c.codes[slot][c.valid[slot]])
        return {r: torch.cat(v) for r, v in out.items()}

    eager = run(EagerFrames(custom.talker))
    graph = run(GraphedFrames(custom.talker, custom.config.max_seq_len, capture=False))
    assert sorted(eager) == list(range(len(rows)))
    for r in eager:
        assert torch.equal(eager[r], graph[r]), f"row {r}"


@pytest.mark.parametrize("graph", [False, True])
def test_rows_with_their_own_sampling_equal_each_alone(custom, graph):
    """Rows of one loop with sampling settings of their own (greedy beside sampled, other temperatures, top-k,
    top-p, penalties, min_new_tokens), on the eager runner and on the graph frame body run uncaptured: each row
    equals itself decoded alone with its settings as the loop's."""
    base = custom.defaults.replace(max_new_tokens=24)
    own = [base, base.greedy(), base.replace(temperature=1.4, top_k=0, top_p=0.8),
           base.replace(repetition_penalty=1.6, min_new_tokens=6, subtalker_top_k=3),
           base.replace(subtalker_dosample=False, top_k=5), None]  # None: the loop's settings (base)
    rows = []
    for k, (item, p) in enumerate(zip(custom_items(), own)):
        prompt, _, frames = custom.prepare(item.request, 1, p or base, max_new_tokens=item.max_new_tokens)
        rows.append(Row(prompt, 2000 + k, frames, params=p))

    def run(rows, params, slots):
        runner = GraphedFrames(custom.talker, custom.config.max_seq_len, capture=False) if graph \
            else EagerFrames(custom.talker)
        out = {}
        for c in decode_rows(runner, rows, slots=slots, params=params, eos_id=custom.cfg.talker.codec_eos_id,
                             chunk_frames=4):
            for slot, r in enumerate(c.rows):
                if r >= 0:
                    out.setdefault(r, []).append(c.codes[slot][c.valid[slot]])
        return [torch.cat(out[r]) for r in range(len(rows))]

    together = run(rows, base, slots=4)  # more rows than slots: later rows take over slots of other settings
    for r, row in enumerate(rows):
        alone = run([Row(row.prompt, row.key, row.max_frames)], row.params or base, slots=1)[0]
        assert torch.equal(together[r], alone), f"row {r}"
    assert len({len(c) for c in together}) >= 3  # the settings make the rows differ
