"""Long-text splitting (nodes/text_split.py)."""
import pytest

from tests.support._q3support import load_pure

ts = load_pure("text_split")


def test_short_text_is_one_segment_unchanged():
    assert ts.split_text("  Hello there. How are you?  ") == ["Hello there. How are you?"]


def test_empty_text_gives_no_segments():
    assert ts.split_text("   \n ") == []


def test_splits_at_sentence_boundaries_and_keeps_every_word():
    text = " ".join(f"Sentence number {i} ends here." for i in range(40))
    segs = ts.split_text(text, 120)
    assert len(segs) > 1
    assert all(ts.text_units(s) <= 120 for s in segs)
    assert all(s.endswith(".") for s in segs)  # never cut mid-sentence when sentences fit
    assert " ".join(segs).split() == text.split()


def test_cjk_counts_more_and_joins_without_spaces():
    text = "你好。今天天气很好！我们去公园吧，好不好？" * 6
    segs = ts.split_text(text, 30)
    assert all(ts.text_units(s) <= 30 for s in segs)
    assert "".join(segs) == text
    assert ts.text_units("你好") == 2 * ts.CJK_WEIGHT


def test_overlong_sentence_is_cut_at_clauses_then_words():
    text = ", ".join(["alpha beta gamma"] * 30) + "."
    segs = ts.split_text(text, 50)
    assert all(ts.text_units(s) <= 50 for s in segs)
    assert " ".join(segs).split() == text.split()
    word = "x" * 130
    assert ts.split_text(word, 50) == ["x" * 50, "x" * 50, "x" * 30]


def test_newlines_are_boundaries():
    assert ts.split_text("Line one\nLine two\n\nLine three", 12) == ["Line one", "Line two", "Line three"]


def test_segment_budget_respects_the_cache():
    assert ts.segment_budget(400, 4096) == 400
    assert ts.segment_budget(400, 200) == int((200 - 64) / 2.2)
    assert ts.segment_budget(400, 4096, prompt_overhead=4000) == int(96 / 2.2)
    assert ts.segment_budget(400, 10) == 1


def test_invalid_budget():
    with pytest.raises(ValueError):
        ts.split_text("abc", 0)


@pytest.mark.parametrize("char", ["x", "語"])
def test_splitting_a_run_with_no_break_is_linear(char):
    """A run of text with no space or punctuation is cut by index: 10x the text takes about 10x the time (it
    was quadratic, 400,000 characters took tens of seconds). The ratio of the fastest of 3 at n and 10n is
    compared, never an absolute time, with room for a busy machine."""
    import time

    def fastest(n):
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            segs = ts.split_text(char * n, 400)
            best = min(best, time.perf_counter() - t)
        assert "".join(segs) == char * n and max(ts.text_units(s) for s in segs) <= 400
        return best

    small, large = fastest(50_000), fastest(500_000)
    assert large / small < 25, (small, large)


class _Stop(Exception):
    pass


@pytest.mark.parametrize("text", ["x" * 400_000, "Word after word, clause. " * 16_000, "語" * 150_000],
                         ids=["no break", "sentences", "cjk"])
def test_a_long_split_checks_for_an_interrupt_every_few_pieces(text):
    """The check (ComfyUI's interrupt in the nodes) is called every CHECK_EVERY pieces all through the split,
    and what it raises ends the split there."""
    calls = []
    segments = ts.split_text(text, 400, check=lambda: calls.append(1))
    assert len(calls) >= len(segments) // ts.CHECK_EVERY >= 2

    def stop_at_second():
        calls.append(1)
        if len(calls) == 2:
            raise _Stop
    calls.clear()
    with pytest.raises(_Stop):
        ts.split_text(text, 400, check=stop_at_second)
    assert len(calls) == 2


def test_short_text_never_calls_the_check():
    assert ts.split_text("Hello there. How are you?", 400, check=lambda: pytest.fail("checked")) == [
        "Hello there. How are you?"]
