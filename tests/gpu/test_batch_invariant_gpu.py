"""Batch invariance in bf16 (EngineConfig.batch_invariant, skipped without CUDA): requests of other lengths, takes,
speakers and sampling settings, served together in a 64-row loop, each equal the same request generated alone,
codes identical, and the same request served alone by the scheduler afterwards, samples identical too. Without
it, bf16 sums taken in other orders at other row counts move the codes, and the codec's batch and piece shapes
the samples."""
import pytest
import torch

from engine import Engine, Request, Scheduler, kernels

pytestmark = pytest.mark.gpu


def _req(i):
    return Request(mode="custom", text=f"Line {i} of the crowd, {'short' if i % 3 else 'a little longer than the rest'}.",
                   language="English", speaker=("ryan", "vivian")[i % 2])


def test_bf16_requests_under_load_equal_each_alone(eos_checkpoint):
    ok, why = kernels.available("cuda")
    if not ok:
        pytest.skip(why)
    e = Engine.load(eos_checkpoint, device="cuda", dtype="bf16", cuda_graphs="on", triton="on", max_seq_len=256,
                    max_takes=64, warm_takes=64, batch_invariant=True)
    assert any("as for 64 rows (batch invariant)" in note for note in e.info.notes)
    assert any("cuDNN: deterministic" in note for note in e.info.notes) and torch.backends.cudnn.deterministic
    p = e.defaults.replace(max_new_tokens=60)
    jobs = [(_req(i), 1 + i % 4, 200 + i, p if i % 5 else p.greedy()) for i in range(26)]
    with Scheduler(e, max_rows=64, chunk_frames=2, max_queue=64) as s:
        got = _served([s.submit(req, takes=n, seed=seed, params=params, first_chunk_frames=1)
                       for req, n, seed, params in jobs])
        served_alone = [_served([s.submit(req, takes=n, seed=seed, params=params, first_chunk_frames=1)])[0]
                        for req, n, seed, params in jobs]
    for (req, n, seed, params), takes, lone in zip(jobs, got, served_alone):
        alone = e.generate(req, takes=n, seed=seed, params=params)
        for i in range(n):
            codes, audio = takes[i]
            assert codes.equal(alone.codes[i]), f"{req.text!r} take {i}"
            assert codes.equal(lone[i][0]) and audio.equal(lone[i][1]), f"{req.text!r} take {i}"
            assert audio.shape[0] == codes.shape[0] * 1920


def _served(tickets) -> list:
    """Each ticket's takes, read to their ends in order: [{take: (codes [T, 16], audio [T * 1920])}]."""
    out = []
    for t in tickets:
        takes = {}
        for c in t:
            takes.setdefault(c.take, []).append((c.codes, c.audio))
        out.append({i: (torch.cat([c for c, _ in parts]), torch.cat([a for _, a in parts]))
                    for i, parts in takes.items()})
    return out
