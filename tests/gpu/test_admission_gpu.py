"""A request's admission never waits for the GPU (skipped without CUDA).

Opening the frame runner and admitting rows (the prefill graph, the K/V copy into each take's row, the per-row
state) runs with PyTorch's sync debug mode set to "error": any blocking copy or synchronisation in it fails the
test. Such a wait after the prefill kept the host from queueing the first frame until the prefill ended
(1.7-1.9 ms a request on an H100). Covered: one take, four takes (one prompt's K/V
copied into four rows), and a batch with more rows than slots, whose later rows are admitted mid-run while
frames are queued (slots not in order: the index goes through pinned memory)."""
import contextlib

import pytest
import torch

from engine import BatchItem, Engine, Request

pytestmark = pytest.mark.gpu

REQ = Request(mode="custom", text="The admission queues its work and returns at once.", language="English",
              speaker="ryan")
OTHER = Request(mode="custom", text="A second line, admitted when a slot frees up.", language="English",
                speaker="vivian")


@pytest.fixture(scope="module")
def engine(tiny_checkpoints):
    from engine import kernels

    ok, why = kernels.available("cuda")
    if not ok:
        pytest.skip(why)
    return Engine.load(tiny_checkpoints["custom_voice"], device="cuda", dtype="fp32", cuda_graphs="on",
                       triton="on", max_takes=4, warm_takes=4, max_seq_len=512)


@contextlib.contextmanager
def admissions_must_not_sync(engine):
    """Run every runner.open and decode._admit of the block in sync debug mode "error"; count them."""
    import engine.decode as D

    runner, admit, open_ = engine.runner, D._admit, engine.runner.open
    calls = {"open": 0, "admit": 0}

    def strict(name, fn):
        def run(*a, **k):
            calls[name] += 1
            torch.cuda.set_sync_debug_mode("error")
            try:
                return fn(*a, **k)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return run

    D._admit, runner.open = strict("admit", admit), strict("open", open_)
    try:
        yield calls
    finally:
        D._admit = admit
        del runner.open  # back to the class's method


@pytest.mark.parametrize("takes", [1, 4])
def test_one_prompt_is_admitted_without_a_wait(engine, takes):
    params = engine.defaults.replace(max_new_tokens=24)
    want = engine.generate([BatchItem(REQ, takes=takes, seed=5)], params=params)[0]
    with admissions_must_not_sync(engine) as calls:
        got = engine.generate([BatchItem(REQ, takes=takes, seed=5)], params=params)[0]
        streamed = list(engine.stream(REQ, takes=takes, seed=5, params=params, chunk_frames=4))
    assert calls == {"open": 2, "admit": 2}
    assert got.lengths == want.lengths
    for a, b in zip(got.codes, want.codes):
        assert torch.equal(a, b)
    assert [sum(c.codes.shape[0] for c in streamed if c.take == i) for i in range(takes)] == \
        want.stats["frames_per_take"]


def test_rows_admitted_mid_run_without_a_wait(engine):
    params = engine.defaults.replace(max_new_tokens=16)
    items = [BatchItem(REQ, takes=3, seed=1), BatchItem(OTHER, takes=2, seed=2), BatchItem(REQ, takes=2, seed=9)]
    want = [engine.generate([item], params=params)[0] for item in items]
    with admissions_must_not_sync(engine) as calls:
        got = engine.generate(items, params=params, max_rows=4, chunk_frames=4)
    assert calls["open"] == 1 and calls["admit"] >= 2  # the later rows waited for slots
    for g, w in zip(got, want):
        assert g.lengths == w.lengths
        for a, b in zip(g.codes, w.codes):
            assert torch.equal(a, b)
