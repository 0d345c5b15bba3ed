"""Script node helpers: parsing (nodes/script_parse.py), the voice table (script_cast.py), track layout
(script_track.py) and SRT (srt.py)."""
import re

import pytest
import torch

from tests.support._q3support import load_pure

sp = load_pure("script_parse")
cast_mod = load_pure("script_cast")
track_mod = load_pure("script_track")
srt = load_pure("srt")

SR = 24000
SCRIPT = """
# a comment
Alice: Good morning, Bob.
Bob [sleepy]: Is it morning already?

[pause 0.8s]
alice: It is. Time: ten o'clock.
[pause 250ms]
[pause 0.25s]
Carol: Hello both.
"""


def test_parse_events_in_order():
    ev = sp.parse_script(SCRIPT)
    assert [type(e).__name__ for e in ev] == ["Utterance", "Utterance", "Pause", "Utterance", "Pause", "Pause",
                                              "Utterance"]
    assert ev[0] == sp.Utterance(3, "Alice", "Good morning, Bob.", "")
    assert ev[1] == sp.Utterance(4, "Bob", "Is it morning already?", "sleepy")
    assert ev[2] == sp.Pause(6, 800)
    assert ev[3].key == "alice" and ev[3].text == "It is. Time: ten o'clock."
    assert [e.ms for e in ev if isinstance(e, sp.Pause)] == [800, 250, 250]


@pytest.mark.parametrize("script, line, words", [
    ("Alice: hi\nBob:   \n", 2, "no text"),
    ("Alice: hi\njust some words\n", 2, "expected 'Name: text'"),
    ("Alice: hi\n[pause]\n", 2, "malformed tag"),
    ("Alice: hi\n[pause 1 sec]\n", 2, "malformed tag"),
    ("Alice: hi\n[pause 1s\n", 2, "malformed tag"),
    ("Alice: hi\n[laughs]\n", 2, "malformed tag"),
    ("Alice: hi\n\n[pause 0s]\n", 3, "longer than 0"),
    ("Alice: hi [pause 1s] there\n", 1, "tag inside the text"),
    ("Alice []: hi\n", 1, "empty instruction"),
    ("Alice [a] [b]: hi\n", 1, "expected 'Name: text'"),
    ("Ali/ce: hi\n", 1, "not a usable name"),
])
def test_parse_errors_name_the_line(script, line, words):
    with pytest.raises(sp.ScriptError) as e:
        sp.parse_script(script)
    assert f"script line {line}:" in str(e.value) and words in str(e.value)


def test_script_without_lines_is_an_error():
    with pytest.raises(sp.ScriptError, match="no lines to speak"):
        sp.parse_script("\n# only a comment\n[pause 1s]\n")


def test_cast_table_and_unknown_names():
    cast = sp.parse_cast("Alice = Vivian\n\nbob = ryan\nCarol=Serena")
    assert list(cast) == ["alice", "bob", "carol"] and cast["bob"].line == 3
    sp.check_names(sp.parse_script(SCRIPT), cast)
    with pytest.raises(sp.ScriptError, match=r"script line 2: unknown name 'Dave'.*Alice, bob, Carol"):
        sp.check_names(sp.parse_script("Alice: hi\nDave: hey"), cast)
    for bad, no in (("Alice = Vivian\nBob Ryan", 2), ("Alice =", 1), ("Alice = a\nALICE = b", 2)):
        with pytest.raises(sp.ScriptError, match=f"voices line {no}:"):
            sp.parse_cast(bad)
    with pytest.raises(sp.ScriptError, match="voices table is empty"):
        sp.parse_cast("  \n")


SPEAKERS = ["Vivian", "Ryan", "Serena"]


def test_cast_per_model_type():
    u = [sp.Utterance(1, "Alice", "Hi.", ""), sp.Utterance(2, "Bob", "Yo.", "loudly")]
    custom = cast_mod.line_requests(u, sp.parse_cast("Alice = vivian\nBob = Ryan"), "custom_voice", SPEAKERS, {})
    assert custom == [{"mode": "custom", "speaker": "Vivian", "text": "Hi."},
                      {"mode": "custom", "speaker": "Ryan", "text": "Yo.", "instruct": "loudly"}]
    design = cast_mod.line_requests(u, sp.parse_cast("Alice = A calm voice.\nBob = A deep voice."), "voice_design",
                                    SPEAKERS, {})
    assert design[1] == {"mode": "design", "instruct": "A deep voice. loudly", "text": "Yo."}
    v1, v2 = object(), object()
    base = cast_mod.line_requests(u[:1], sp.parse_cast("Alice = voice_2\nBob = Voice 1"), "base", SPEAKERS,
                                  {"voice_1": v1, "voice_2": v2})
    assert base == [{"mode": "clone", "voice": v2, "text": "Hi."}]


@pytest.mark.parametrize("table, mtype, voices, words", [
    ("Alice = Nobody\nBob = Ryan", "custom_voice", {}, "voices line 1 (Alice = Nobody): 'Nobody' is not a preset"),
    ("Alice = Vivian\nBob = voice_1", "custom_voice", {"voice_1": 1}, "voices line 2 (Bob = voice_1): VOICE inputs"),
    ("Alice = voice_1\nBob = Ryan", "base", {"voice_1": 1}, "voices line 2 (Bob = Ryan): on a Base model"),
    ("Alice = voice_1\nBob = voice_3", "base", {"voice_1": 1}, "voice_3 is not connected"),
    ("Alice = voice_1\nBob = voice_9", "base", {"voice_1": 1}, "voice_1 .. voice_4"),
])
def test_cast_errors_name_the_table_line(table, mtype, voices, words):
    u = [sp.Utterance(1, "Alice", "Hi.", "")]
    with pytest.raises(sp.ScriptError) as e:
        cast_mod.line_requests(u, sp.parse_cast(table), mtype, SPEAKERS, voices)
    assert words in str(e.value)


def test_instruction_on_a_base_model_names_the_script_line():
    u = [sp.Utterance(7, "Alice", "Hi.", "softly")]
    with pytest.raises(sp.ScriptError, match=r"script line 7: Base models take no instruction"):
        cast_mod.line_requests(u, sp.parse_cast("Alice = voice_1"), "base", SPEAKERS, {"voice_1": 1})


def _clips(n, frames=(3, 5, 2, 4)):
    g = torch.Generator().manual_seed(0)
    return [torch.rand(frames[i % len(frames)] * 1920, generator=g) + 0.1 for i in range(n)]


def test_track_layout_gaps_and_pauses():
    ev = sp.parse_script("[pause 0.5s]\nA: one\nB: two\n[pause 0.8s]\nA: three\n[pause 100ms]\n[pause 0.2s]\n"
                         "B: four\n[pause 1s]")
    clips = _clips(4)
    t = track_mod.assemble(ev, clips, SR, gap_ms=300)
    silences = [ms * SR // 1000 for ms in (500, 300, 800, 300)]
    pos = 0
    for (start, end), clip, sil in zip(t.spans, clips, silences):
        assert start == pos + sil and end == start + clip.numel()
        assert torch.equal(t.waveform[start:end], clip)
        assert torch.all(t.waveform[pos:start] == 0)
        pos = end
    assert t.waveform.numel() == pos + SR and torch.all(t.waveform[pos:] == 0)


TIMES = re.compile(r"(\d\d):(\d\d):(\d\d),(\d{3}) --> (\d\d):(\d\d):(\d\d),(\d{3})")


def _parse_srt(text):
    """[(index, start ms, end ms, text)] of an SRT file."""
    cues = []
    for block in text.strip().split("\n\n"):
        idx, times, *body = block.split("\n")
        g = [int(x) for x in TIMES.fullmatch(times).groups()]
        start, end = (((h * 60 + m) * 60 + s) * 1000 + ms for h, m, s, ms in (g[:4], g[4:]))
        cues.append((int(idx), start, end, "\n".join(body)))
    return cues


def test_srt_times_equal_the_sample_offsets_of_the_track():
    ev = sp.parse_script("A: one\n[pause 1.234s]\nB: two\nA: three\n[pause 61s]\nB: four")
    t = track_mod.assemble(ev, _clips(4, (7, 1, 13, 2)), SR, gap_ms=370)
    texts = [f"{e.name}: {e.text}" for e in ev if isinstance(e, sp.Utterance)]
    cues = _parse_srt(srt.to_srt([(s, e, x) for (s, e), x in zip(t.spans, texts)], SR))
    assert [c[0] for c in cues] == [1, 2, 3, 4] and [c[3] for c in cues] == texts
    for (start, end), (_, a_ms, b_ms, _) in zip(t.spans, cues):
        assert a_ms * SR == start * 1000 and b_ms * SR == end * 1000  # exact, not rounded
    assert cues[3][1] > 60_000


def test_srt_timestamp_format_and_rounding():
    assert srt.timestamp(0, SR) == "00:00:00,000"
    assert srt.timestamp(SR * 3723 + 24 * 45, SR) == "01:02:03,045"
    assert srt.timestamp(12, SR) == "00:00:00,001" and srt.timestamp(11, SR) == "00:00:00,000"
    assert srt.to_srt([(0, 24, "a\n\nb")], SR) == "1\n00:00:00,000 --> 00:00:00,001\na\nb\n"


def test_total_silence_counts_pauses_and_the_gaps_where_no_pause_stands():
    ev = sp.parse_script("[pause 1s]\nA: one\nA: two\n[pause 2s]\n[pause 500ms]\nA: three\n[pause 4s]")
    assert track_mod.total_silence_ms(ev, 300) == 1000 + 300 + 2500 + 4000
    wave = track_mod.assemble(ev, [torch.ones(10)] * 3, 1000, 300).waveform
    assert wave.numel() - 30 == track_mod.total_silence_ms(ev, 300)  # 1 kHz: one sample a millisecond


def test_total_silence_is_capped_with_an_error_naming_pauses_and_line_gap():
    cap = track_mod.MAX_TOTAL_SILENCE_MS
    many = "\n".join(["A: hi", "[pause 600s]"] * (cap // 600_000) + ["A: bye"])
    track_mod.check_silence(sp.parse_script(many), 0)  # exactly the cap
    with pytest.raises(sp.ScriptError, match=r"pause.*line_gap.*at most 20 minutes"):
        track_mod.check_silence(sp.parse_script(many + "\n[pause 1ms]"), 0)
    lines = sp.parse_script("\n".join(["A: hi"] * 200))  # 199 gaps of 10 s: over the cap, no pause at all
    with pytest.raises(sp.ScriptError, match=r"line_gap \(10 s\).*1990 s"):
        track_mod.check_silence(lines, 10_000)


@pytest.mark.parametrize("line, parsed", [
    ("Bob [tone: sleepy]: Is it: morning?", ("Bob", "tone: sleepy", "Is it: morning?")),
    ("Bob   [x]   :  hi", ("Bob", "x", "hi")),
    ("Dr. Who:hi", ("Dr. Who", "", "hi")),
])
def test_utterance_parts(line, parsed):
    u = sp.parse_script(line)[0]
    assert (u.name, u.instruct, u.text) == parsed


@pytest.mark.parametrize("line", ["A" + " " * 50_000 + "b", "A [" + " " * 50_000, "A [x] " + " " * 50_000 + "y",
                                  "[x]: y", "A [x] [y]: z", "A [x: y"])
def test_lines_that_are_not_utterances_are_refused_quickly(line):
    with pytest.raises(sp.ScriptError, match="script line 1"):
        sp.parse_script(line)
