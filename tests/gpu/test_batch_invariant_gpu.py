"""Batch invariance in bf16 (EngineConfig.batch_invariant, skipped without CUDA): requests of other lengths, takes,
speakers and sampling settings, served together in a 64-row loop, each equal the same request generated alone,
codes identical. Without it, bf16 sums taken in other orders at other row counts move the codes."""
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
    p = e.defaults.replace(max_new_tokens=60)
    jobs = [(_req(i), 1 + i % 4, 200 + i, p if i % 5 else p.greedy()) for i in range(26)]
    with Scheduler(e, max_rows=64, chunk_frames=2, max_queue=64) as s:
        tickets = [s.submit(req, takes=n, seed=seed, params=params) for req, n, seed, params in jobs]
        got = [{} for _ in tickets]
        for k, t in enumerate(tickets):
            for c in t:
                got[k].setdefault(c.take, []).append(c.codes)
    for (req, n, seed, params), takes in zip(jobs, got):
        alone = e.generate(req, takes=n, seed=seed, params=params)
        for i in range(n):
            codes = torch.cat(takes[i])
            assert codes.equal(alone.codes[i]), f"{req.text!r} take {i}"
