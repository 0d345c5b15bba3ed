"""A load with warm_takes captures that many rows' graphs (skipped without CUDA): a request of up to that many
takes then captures nothing (frame graphs and codec pieces alike), whatever path it takes, and in fp32 each of
its takes equals the same take run in its own, smaller bucket by a load that captured only one take's graphs."""
import pytest
import torch

from engine import BatchItem, Engine, Request

pytestmark = pytest.mark.gpu

REQ = Request(mode="custom", text="Two takes ride in the four-row graphs the load captured.", language="English",
              speaker="ryan")


def _load(path, warm_takes):
    return Engine.load(path, device="cuda", dtype="fp32", cuda_graphs="on", triton="on", max_takes=4,
                       warm_takes=warm_takes, max_seq_len=512)


@pytest.fixture(scope="module")
def engines(tiny_checkpoints):
    from engine import kernels

    ok, why = kernels.available("cuda")
    if not ok:
        pytest.skip(why)
    return _load(tiny_checkpoints["custom_voice"], 4), _load(tiny_checkpoints["custom_voice"], 1)


def _captured(e) -> tuple:
    return (sorted(e.runner.graphs), sorted(e.codec_graphs.graphs), e.runner.late_captures,
            e.codec_graphs.late_captures)


def test_the_load_captures_the_warm_buckets(engines):
    warm, cold = engines
    assert {b for b, _ in warm.runner.graphs} == {1, 4}
    assert {b for b, _ in warm.codec_graphs.graphs} == {1, 4}
    assert {b for b, _ in cold.runner.graphs} == {1}
    assert any("of 1 and 4 rows" in note for note in warm.info.notes), warm.info.notes
    pools = warm.codec_graphs.pools  # captured side by side, each row count in a pool of its own
    assert set(pools) == {1, 4} and pools[1] != pools[4]


@pytest.mark.parametrize("takes", [2, 3, 4])
def test_takes_up_to_warm_takes_capture_nothing_and_equal_their_own_bucket(engines, takes):
    warm, cold = engines
    params = warm.defaults.replace(max_new_tokens=40)
    before = _captured(warm)
    got = warm.generate(REQ, takes=takes, seed=3, params=params)
    batch = warm.generate([BatchItem(REQ, takes=takes, seed=3)], params=params)[0]
    chunks = list(warm.stream([BatchItem(REQ, takes=takes, seed=3)], params=params, chunk_frames=4))
    assert _captured(warm) == before  # no frame window, no codec piece, nothing late
    assert warm.runner.s.batch == 4  # the last run rode in the load's 4-row graphs

    ref = cold.generate(REQ, takes=takes, seed=3, params=params)  # 2 takes: their own 2-row bucket
    assert cold.runner.s.batch == (2 if takes == 2 else 4)
    assert got.lengths == ref.lengths == batch.lengths
    for i in range(takes):
        assert torch.equal(got.codes[i], ref.codes[i]), f"take {i}"
        assert torch.equal(batch.codes[i], ref.codes[i]), f"take {i} (generate of a list)"
    torch.testing.assert_close(got.audio, ref.audio, atol=1e-4, rtol=0)
    for i in range(takes):  # each take's chunks, joined, equal its take of the whole request
        mine = [c for c in chunks if c.take == i]
        assert torch.equal(torch.cat([c.codes for c in mine]), got.codes[i]), f"take {i} (stream of a list)"
        audio = torch.cat([c.audio for c in mine])
        assert audio.shape[0] == got.lengths[i]
        assert float((audio - got.audio[i, : got.lengths[i]]).abs().max()) <= 1e-4, f"take {i} (stream of a list)"

