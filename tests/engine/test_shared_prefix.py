"""Takes of one prompt read its K/V from one row's copy (FrameState.share, engine/kernels/attention._launch).

Only the Triton split-KV attention reads through the table (tests/kernels/test_kernels.py checks its reads against
caches copied that way; tests/gpu/test_shared_prefix_gpu.py checks whole requests). Here, on the CPU: the
table the graph runner keeps. A row may read another row's copy only while that copy cannot be overwritten,
i.e. when no slot is prefilled twice in the run (no more rows than slots)."""
import pytest
import torch

from engine import Engine, Request
from engine.decode import EagerFrames, Row, decode_rows
from tests.support.decoding import collect
from engine.gpu.frame_graph import GraphedFrames


@pytest.fixture(scope="module")
def engine(tiny_checkpoints):
    return Engine.load(tiny_checkpoints["custom_voice"], device="cpu", dtype="fp32", max_seq_len=400)


def _prompt(engine, text):
    req = Request(mode="custom", text=text, language="English", speaker="ryan")
    return engine.prepare(req, 1, engine.defaults.replace(max_new_tokens=6))[0]


def _decode(engine, runner, rows, slots):
    params = engine.defaults.replace(max_new_tokens=6).greedy()
    return collect(decode_rows(runner, rows, slots=slots, params=params, eos_id=engine.cfg.talker.codec_eos_id))


class Opened(EagerFrames):
    def open(self, **kw):
        self.refills = kw["refills"]
        super().open(**kw)


@pytest.mark.parametrize("rows, slots, refills", [(2, 2, False), (3, 4, False), (3, 2, True)])
def test_decode_rows_says_whether_a_slot_is_prefilled_twice(engine, rows, slots, refills):
    prompt = _prompt(engine, "Each row has a slot of its own.")
    runner = Opened(engine.talker)
    _decode(engine, runner, [Row(prompt, k, 6) for k in range(rows)], slots)
    assert runner.refills is refills


def test_takes_read_the_first_takes_copy(engine):
    """Two items of two takes each in four slots: each item's takes read its first slot's copy of its prompt."""
    a, b = _prompt(engine, "The first item."), _prompt(engine, "The second item is a little longer.")
    runner = GraphedFrames(engine.talker, 400, capture=False)
    _decode(engine, runner, [Row(a, 0, 6), Row(a, 1, 6), Row(b, 2, 6), Row(b, 3, 6)], slots=4)
    la, lb = a.prefill.shape[1], b.prefill.shape[1]
    assert runner.s.share.tolist() == [[0, 0, 2, 2], [la, la, lb, lb]]


def test_one_take_and_padding_rows_read_their_own(engine):
    """A prompt with one take, and the bucket's padding row (3 rows in a 4-row bucket), share nothing."""
    a, b = _prompt(engine, "Alone."), _prompt(engine, "Two takes of this one.")
    runner = GraphedFrames(engine.talker, 400, capture=False)
    _decode(engine, runner, [Row(a, 0, 6), Row(b, 1, 6), Row(b, 2, 6)], slots=3)
    lb = b.prefill.shape[1]
    assert runner.s.share.tolist() == [[0, 1, 1, 3], [0, lb, lb, 0]]


def test_refilled_slots_share_nothing(engine):
    """More rows than slots: a slot whose row ends is prefilled again while the other takes still run, so no
    row reads another's copy. Then the next run that fits shares again (open resets the table)."""
    prompt = _prompt(engine, "Three takes in two slots.")
    runner = GraphedFrames(engine.talker, 400, capture=False)
    _decode(engine, runner, [Row(prompt, k, 6) for k in range(3)], slots=2)
    assert runner.s.share.tolist() == [[0, 1], [0, 0]]
    _decode(engine, runner, [Row(prompt, k, 6) for k in range(2)], slots=2)
    assert runner.s.share.tolist() == [[0, 0], [prompt.prefill.shape[1]] * 2]


def test_sharing_leaves_the_torch_path_unchanged(engine):
    """The torch attention reads each row's own copy: takes decoded through the table equal the eager runner."""
    prompt = _prompt(engine, "The same prompt for three takes.")
    rows = [Row(prompt, k, 6) for k in range(3)]
    eager, n_eager = _decode(engine, EagerFrames(engine.talker), rows, slots=3)
    graph, n_graph = _decode(engine, GraphedFrames(engine.talker, 400, capture=False), rows, slots=3)
    assert n_eager == n_graph and torch.equal(eager, graph)
