"""engine/host_audio.py: a request's audio lands in memory reserved for its budget and made resident as the
frames come; the result is contiguous, exact, and no larger than its length once the request ends."""
import pytest
import torch

from engine.config import SAMPLES_PER_FRAME
from engine.host_audio import PAGE, HostAudio, touching


def _resident_pages(t: torch.Tensor, nbytes: int) -> int:
    """Pages of the mapping under t that are in memory (mincore)."""
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    pages = -(-nbytes // PAGE)
    vec = (ctypes.c_ubyte * pages)()
    assert libc.mincore(ctypes.c_void_p(t.data_ptr()), ctypes.c_size_t(nbytes), vec) == 0
    return sum(v & 1 for v in vec)


def test_take_is_contiguous_exact_and_any_length_up_to_the_budget():
    host = HostAudio(rows=3, max_frames=10)
    wav = torch.randn(3, 7 * SAMPLES_PER_FRAME)
    host.touch(4)
    out = host.take(wav)
    assert out.is_contiguous() and out.shape == wav.shape and torch.equal(out, wav)
    assert out.data_ptr() == host.flat.data_ptr()
    with pytest.raises(ValueError):
        host.take(torch.zeros(3, 11 * SAMPLES_PER_FRAME))  # past the budget
    with pytest.raises(ValueError):
        host.take(torch.zeros(2, SAMPLES_PER_FRAME))  # another row count
    assert HostAudio(rows=2, max_frames=0).take(torch.zeros(2, 0)).shape == (2, 0)


@pytest.mark.skipif(not hasattr(__import__("os"), "sysconf"), reason="mincore is a POSIX call")
def test_only_the_frames_touched_so_far_are_resident():
    rows, budget = 4, 400  # 12 MB reserved
    host = HostAudio(rows, budget)
    assert _resident_pages(host.flat, host.size) == 0  # reserving costs no memory
    host.touch(50)
    want = -(-4 * rows * 50 * SAMPLES_PER_FRAME // PAGE)
    assert _resident_pages(host.flat, host.size) == want
    host.touch(30)  # never shrinks, never touches twice
    assert host.touched == want * PAGE
    host.touch(10_000)  # capped at the budget
    assert host.touched == host.size


def test_touching_follows_the_chunks():
    class Chunk:
        def __init__(self, start, k):
            self.start, self.codes, self.ended = start, torch.zeros(1, k, 16), ()

    host = HostAudio(rows=2, max_frames=64)
    seen = []
    for chunk in touching(iter([Chunk(0, 2), Chunk(2, 4), Chunk(6, 4)]), [(range(2), host)]):
        seen.append(host.touched)
    assert seen == [-(-4 * 2 * f * SAMPLES_PER_FRAME // PAGE) * PAGE for f in (2, 6, 10)]


def test_touching_stops_growing_an_item_once_its_takes_have_ended():
    class Chunk:
        def __init__(self, start, k, ended):
            self.start, self.codes, self.ended = start, torch.zeros(1, k, 16), ended

    short, long_ = HostAudio(rows=1, max_frames=64), HostAudio(rows=2, max_frames=64)
    chunks = [Chunk(0, 4, ()), Chunk(4, 4, (0,)), Chunk(8, 4, ()), Chunk(12, 4, (1, 2))]
    for _ in touching(iter(chunks), [([0], short), ([1, 2], long_)]):
        pass
    page = -(-4 * SAMPLES_PER_FRAME * 8 // PAGE) * PAGE  # 8 frames of one row: the chunk row 0 ended in
    assert short.touched == page
    assert long_.touched == -(-4 * 2 * SAMPLES_PER_FRAME * 16 // PAGE) * PAGE
