"""Takes read their prompt's K/V from the first take's copy (skipped without CUDA). Each row's own copy is then
overwritten with garbage after the prefill: the takes still equal an untouched run bit for bit, so the talker's
attention read only the first take's copy. With the copies shared off (a run that refills slots), the same
garbage changes the takes, so the check can fail."""
import pytest
import torch

from engine import Engine, Request
from engine.gpu import frame_graph

pytestmark = pytest.mark.gpu

REQ = Request(mode="custom", text="Four takes of one line share its prompt: the attention reads one copy of it.",
              language="English", speaker="ryan")


@pytest.fixture(scope="module")
def engine(tiny_checkpoints):
    from engine import kernels

    ok, why = kernels.available("cuda")
    if not ok:
        pytest.skip(why)
    # EOS off: every take runs its whole budget, so every poisoned take has frames to differ in
    return Engine.load(tiny_checkpoints["custom_voice"], device="cuda", dtype="fp32", cuda_graphs="on", triton="on",
                       max_seq_len=512)


def _poison_other_takes(monkeypatch):
    admit = frame_graph.GraphedFrames.admit

    def poisoned(self, slots, prompt, keys, max_frames, params=None):
        admit(self, slots, prompt, keys, max_frames, params)
        n = prompt.prefill.shape[1]
        for layer in (*self.s.cache.k, *self.s.cache.v):
            layer[slots[1:], :, :n] = 1e3 * torch.randn_like(layer[slots[1:], :, :n])

    monkeypatch.setattr(frame_graph.GraphedFrames, "admit", poisoned)


def _same_take(a, b, i) -> bool:
    return a.lengths[i] == b.lengths[i] and torch.equal(a.codes[i], b.codes[i])


@pytest.mark.parametrize("takes", [2, 4])
def test_takes_read_only_the_first_takes_copy(engine, monkeypatch, takes):
    params = engine.defaults.replace(max_new_tokens=120)
    clean = engine.generate(REQ, takes=takes, seed=5, params=params)
    _poison_other_takes(monkeypatch)
    shared = engine.generate(REQ, takes=takes, seed=5, params=params)
    assert all(_same_take(shared, clean, i) for i in range(takes))
    assert clean.lengths == [120 * 1920] * takes  # EOS off: the whole budget

    opened = frame_graph.GraphedFrames.open
    monkeypatch.setattr(frame_graph.GraphedFrames, "open", lambda self, **kw: opened(self, **{**kw, "refills": True}))
    own = engine.generate(REQ, takes=takes, seed=5, params=params)
    assert _same_take(own, clean, 0)  # the first take's copy was never touched
    assert not any(_same_take(own, clean, i) for i in range(1, takes))  # each other take read its poisoned copy
