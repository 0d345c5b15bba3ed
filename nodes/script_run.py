"""Generate every line of a script through Engine.generate and lay them out on one track.

Each line is split at sentence boundaries like the generator nodes' text; all pieces of all lines go to
the engine as one list of batch items, so they can run as batch rows together. The pieces of a line are
joined as the generators join long text; the lines are then placed by script_track.
"""
from __future__ import annotations

from dataclasses import dataclass

import comfy.model_management as mm
import comfy.utils

from . import engine_cache
from .audio_utils import join_segments, make_audio
from .common import MAX_SEGMENT_CHARS, MIN_SEGMENT_CHARS, SEED_MAX
from .runner import engine_errors
from .sampling import sampling_changes, with_changes
from .script_parse import Pause, Utterance
from .script_track import assemble
from .srt import to_srt
from .text_split import DEFAULT_MAX_UNITS, PROMPT_OVERHEAD, segment_budget, split_text


@dataclass
class ScriptResult:
    track: dict  # AUDIO [1, 1, samples]
    lines: dict  # AUDIO [lines, 1, longest], with each line's length
    subtitles: str  # SRT


def _overhead(fields: dict) -> int:
    """Prompt positions besides the text: template, instruction, ICL reference (<= 1 per character/frame)."""
    voice = fields.get("voice")
    icl = int(voice.ref_codes.shape[0]) + len(voice.ref_text or "") if voice is not None and voice.is_icl else 0
    return PROMPT_OVERHEAD + len(fields.get("instruct") or "") + icl


def run_script(node: str, ref, events: list[Utterance | Pause], fields: list[dict], language: str, seed: int,
               gap_ms: int, names_in_subtitles: bool, max_segment_chars: int = DEFAULT_MAX_UNITS,
               **widgets) -> ScriptResult:
    """`fields[i]` holds the request fields (script_cast.line_requests) of the i-th utterance of `events`."""
    from ..engine import BatchItem, Request, checks
    from ..engine.errors import InvalidInputError

    try:  # checks that need no weights run before the engine is (re)loaded, as the generator nodes' (runner.Job)
        changes = sampling_changes(**widgets)
        checks.whole_number("seed", seed, 0, SEED_MAX)
        checks.whole_number("max_segment_chars", max_segment_chars, MIN_SEGMENT_CHARS, MAX_SEGMENT_CHARS)
    except ValueError as exc:
        raise InvalidInputError(f"{node}: {exc}") from exc
    pieces = [split_text(f["text"], segment_budget(max_segment_chars, ref.key.max_seq_len, _overhead(f)),
                         check=mm.throw_exception_if_processing_interrupted)
              for f in fields]
    engine = engine_cache.acquire(ref.key)
    params = with_changes(engine.defaults, changes)
    items, owner = [], []
    for line, (f, texts) in enumerate(zip(fields, pieces)):
        for text in texts:
            req = Request(language=language, **{**f, "text": text})
            items.append(BatchItem(request=req, takes=1, seed=(int(seed) + len(items)) % (1 << 64)))
            owner.append(line)
    pbar = comfy.utils.ProgressBar(1)

    def report(done: int, total: int) -> None:  # frames over all rows
        pbar.update_absolute(done, total)
        mm.throw_exception_if_processing_interrupted()

    mm.throw_exception_if_processing_interrupted()
    with engine_errors(node):
        results = engine.generate(items, params=params, on_progress=report,
                                        should_stop=mm.processing_interrupted)
    sr = engine.sample_rate
    clips = []
    for line in range(len(fields)):
        parts = [(r.audio, list(r.lengths)) for r, o in zip(results, owner) if o == line]
        wav, lengths = join_segments(parts, sr)
        clips.append(wav[0, : lengths[0]])
    track = assemble(events, clips, sr, gap_ms)
    lines = [e for e in events if isinstance(e, Utterance)]
    cues = [(s, e, f"{u.name}: {u.text}" if names_in_subtitles else u.text) for (s, e), u in zip(track.spans, lines)]
    padded = clips[0].new_zeros(len(clips), max(c.numel() for c in clips))
    for i, c in enumerate(clips):
        padded[i, : c.numel()] = c
    return ScriptResult(track=make_audio(track.waveform, [track.waveform.numel()], sr),
                        lines=make_audio(padded, [c.numel() for c in clips], sr),
                        subtitles=to_srt(cues, sr))
