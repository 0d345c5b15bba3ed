"""The decode loop: one generator of codec frames for streaming, whole-utterance, multi-take and
mixed-prompt batch runs.

Per frame t (QWEN3_TTS_FACTS.md §2):
  1. c0 is chosen from the talker logits (penalty, suppression, min-tokens EOS mask, sampling);
  2. the code predictor turns (talker hidden, E(c0)) into codebooks 1..15;
  3. the next talker input is the sum of the 16 codebook embeddings plus the trailing text of step t
     (or the pad embedding once the text is used up), and one talker step gives the next hidden state.

Every run is a list of `Row`s (a prompt, a random-stream key, a frame budget) decoded in a fixed number
of batch *slots*. N takes of one request are N rows sharing one prompt (one prefill); a mixed batch
holds rows of different prompts, each at its own position, frame index and trailing text. A row that
emits EOS or spends its budget is finished: it keeps stepping (so shapes stay fixed) but contributes no
more frames. Finished flags are read on the host once per chunk, never per frame; at that boundary a
finished row frees its slot and the next queued row is prefilled into it (continuous batching).

The per-frame work is done by a *frame runner*: `EagerFrames` here (any device), or the CUDA-graph
runner in engine/gpu, which replays the same three steps as one captured graph. Both expose
`open(slots, params, eos_id, max_len, refills)`, `admit(slots, prompt, keys, max_frames, params)`,
`retire(slots)`, `next_frame(host) -> (codes [slots, 16], valid [slots])` and `finished`. Sampling settings are
per row: rows of one loop may sample differently, each exactly as it would alone.

Rows come from a source (engine/row_source.py): a call's fixed list, or a queue that grows while the loop runs
(engine/scheduler.py), read at each chunk boundary.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from . import sampling
from .errors import GenerationInterrupted
from .finished_flags import FinishedFlags
from .prompt import Prompt
from .row_source import FixedRows
from .sampling import SamplingParams
from .slots import prefill_into, trailing_table
from .transfer import device_longs


@dataclass
class Row:
    """One batch row: what it says (prompt), its random stream key and its frame budget. `expected` is a
    guess of its real length, used only for the progress total and the admission order. `params`: its own
    sampling settings (None: the loop's). `first_chunk` (> 0): the chunk after its admission ends after that
    many frames, for early first audio."""

    prompt: Prompt
    key: int
    max_frames: int
    expected: int = 0
    params: SamplingParams | None = None
    first_chunk: int = 0


@dataclass
class FrameChunk:
    codes: torch.Tensor  # [slots, k, 16] long, on the model device
    valid: torch.Tensor  # [slots, k] bool: frame is real speech of the slot's row
    start: int  # index of the chunk's first frame (frames since the run started)
    done: bool  # no further chunk follows
    rows: tuple = ()  # the row each slot held during this chunk (-1: none)
    ended: tuple = ()  # rows whose last frames are in this chunk (their slots are free afterwards)
    # CUDA, prelaunch: an event recorded after this chunk's tensors and before the next frame, for a side
    # stream that must wait for the chunk but not for the frame launched ahead (the codec's side streams).
    ready: object = None

    @contextlib.contextmanager
    def on(self, side):
        """Run the block on CUDA stream `side` (None: where it is) after this chunk's frames, not after a frame
        launched ahead of them (`ready`); the chunk's tensors, made on the main stream, are marked as used there."""
        if side is None:
            yield
            return
        if self.ready is not None:
            side.wait_event(self.ready)
        else:  # nothing was launched ahead
            side.wait_stream(torch.cuda.current_stream(side.device))
        self.codes.record_stream(side)
        self.valid.record_stream(side)
        with torch.cuda.stream(side):
            yield


class SlotTable:
    """Host-side view of the slots: which row each holds, its prompt length, frames stepped since it was
    admitted and its budget. Positions are exact for a live row (it advances every frame) and an upper
    bound for a finished one (the graphs stop advancing it)."""

    def __init__(self, slots: int):
        self.row = [-1] * slots
        self.length = [0] * slots
        self.frames = [0] * slots
        self.limit = [0] * slots

    def put(self, slot: int, row: int, length: int, limit: int) -> None:
        self.row[slot], self.length[slot], self.frames[slot], self.limit[slot] = row, length, 0, limit

    def positions(self) -> list:
        """Cache position each slot writes at in its next step."""
        return [n + min(f, max(lim - 1, 0)) for n, f, lim in zip(self.length, self.frames, self.limit)]

    def held_span(self) -> int:
        """Slots up to the highest one held (at least one): a loop fills its lowest free slots, so a frame of
        these slots steps every row held."""
        return max((s for s, r in enumerate(self.row) if r >= 0), default=0) + 1

    def alive(self) -> list:
        return [r >= 0 and f < lim for r, f, lim in zip(self.row, self.frames, self.limit)]

    def frames_left(self) -> int:
        """Frames until every held row has spent its budget."""
        return max((lim - f for r, f, lim in zip(self.row, self.frames, self.limit) if r >= 0), default=0)

    def advance(self) -> None:
        self.frames = [f + (r >= 0) for r, f in zip(self.row, self.frames)]


class EagerFrames:
    """Runs each frame as ordinary PyTorch calls over the talker and its code predictor. Rows at different
    positions attend one by one (engine/model/layers.Attention), so each row equals itself run alone. A frame
    steps only the slots up to the highest one held (a loop fills its lowest free slots), so a lone request in a
    server's 64-slot loop costs one row's frame, not 64."""

    active_kernels = ()  # plain torch: no Triton kernels run here

    def __init__(self, talker):
        self.talker = talker
        self.predictor = talker.code_predictor

    def open(self, *, slots: int, params: SamplingParams, eos_id: int, max_len: int, refills: bool = True) -> None:
        t = self.talker
        w = t.codec_head.weight
        vocab, hidden = w.shape
        self.params, self.eos_id = params, eos_id
        self.slot_params = [params] * slots  # each slot's sampling settings (empty slots: the loop's)
        self.groups = {}  # stepped slots -> those slots by settings, made when first needed after an admission
        self.cache = t.new_cache(slots, max_len)
        self.hidden = torch.zeros(slots, hidden, dtype=w.dtype, device=w.device)
        self.keys = torch.zeros(slots, dtype=torch.long, device=w.device)
        self.trailing = [torch.zeros(1, hidden, dtype=w.dtype, device=w.device)] * slots
        self.banned = sampling.control_mask(vocab, eos_id, w.device)
        self.banned_early = self.banned.clone()
        self.banned_early[eos_id] = True  # EOS is masked until min_new_tokens frames exist
        self.seen = torch.zeros(slots, vocab, dtype=torch.bool, device=w.device)
        self.finished = torch.ones(slots, dtype=torch.bool, device=w.device)  # an empty slot counts as finished
        self.pred_cache = self.predictor.new_cache(slots)

    def admit(self, slots: list, prompt: Prompt, keys: torch.Tensor, max_frames: int,
              params: SamplingParams | None = None) -> None:
        idx = device_longs(slots, self.hidden.device)
        self.hidden[idx] = prefill_into(self.talker, prompt, self.cache, slots)
        self.keys[idx] = keys
        self.seen[idx] = False
        self.finished[idx] = False
        table = trailing_table(prompt, max_frames)
        for s in slots:
            self.trailing[s] = table
            self.slot_params[s] = params or self.params
        self.groups = {}

    def retire(self, slots: list) -> None:
        self.finished[device_longs(slots, self.hidden.device)] = True

    def _by_settings(self, pick, stepped: int) -> torch.Tensor:
        """pick(params, slots, index) -> ids [len(slots)] for the slots sampling with `params` (slots and index
        None: every stepped slot, the usual case of one setting, run as one batch); the ids of the first `stepped`
        slots. Each row's sampling reads only its own row, so a group's rows pick as they would alone."""
        if stepped not in self.groups:
            by = {}
            for s, p in enumerate(self.slot_params[:stepped]):
                by.setdefault(p, []).append(s)
            self.groups[stepped] = [(p, None, None) for p in by] if len(by) == 1 else \
                [(p, slots, device_longs(slots, self.hidden.device)) for p, slots in by.items()]
        out = None
        for p, slots, index in self.groups[stepped]:
            if slots is None:
                return pick(p, None, None)
            ids = pick(p, slots, index)
            if out is None:
                out = torch.empty(stepped, dtype=ids.dtype, device=ids.device)
            out[index] = ids
        return out

    def _choose_c0(self, steps: list, t: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        n = len(steps)
        logits = self.talker.codec_logits(self.hidden[:n]).float()
        seen = self.seen[:n]

        def pick(p, slots, rows):
            mine = steps if slots is None else [steps[s] for s in slots]
            lg = sampling.penalize_repeats(_rows(logits, rows), _rows(seen, rows), p.repetition_penalty)
            early = torch.tensor([s < p.min_new_tokens for s in mine], device=lg.device)
            lg = lg.masked_fill(torch.where(early[:, None], self.banned_early, self.banned), float("-inf"))
            u = sampling.uniforms(_rows(keys, rows), _rows(t, rows), 0, lg.shape[-1]) if p.do_sample else None
            return sampling.choose(lg, p.do_sample, p.temperature, p.top_k, p.top_p, u)

        return self._by_settings(pick, n)

    def next_frame(self, host: SlotTable) -> tuple[torch.Tensor, torch.Tensor]:
        width, n = len(host.row), host.held_span()  # n: the slots this frame steps
        steps, keys = host.frames[:n], self.keys[:n]
        t = torch.tensor(steps, device=self.hidden.device)
        c0 = self._choose_c0(steps, t, keys)
        self.seen[:n].scatter_(1, c0[:, None], True)
        self.finished[:n] |= c0 == self.eos_id

        def choose_residual(logits, j):  # codebook j of frame t
            def pick(p, slots, rows):
                lg = _rows(logits, rows)
                u = sampling.uniforms(_rows(keys, rows), _rows(t, rows), j, lg.shape[-1]) \
                    if p.subtalker_dosample else None
                return sampling.choose(lg, p.subtalker_dosample, p.subtalker_temperature, p.subtalker_top_k,
                                       p.subtalker_top_p, u)

            return self._by_settings(pick, n)

        c0_embed = self.talker.embed_codec(c0)
        hidden = self.hidden[:n]
        whole = n == width
        cache, pred_cache = (self.cache, self.pred_cache) if whole else (self.cache.head(n), self.pred_cache.head(n))
        rest = self.predictor.predict(hidden, c0_embed, choose_residual, pred_cache)
        frame = torch.cat([c0[:, None], rest], 1)
        valid = ~self.finished[:n] & torch.tensor(host.alive()[:n], device=c0.device)

        # Next talker input: one 16-term reduction as upstream forms it, plus each row's trailing text.
        x = self.predictor.residual_embedding_sum(rest, c0_embed)
        x = x + torch.stack([tab[min(s, tab.shape[0] - 1)] for tab, s in zip(self.trailing, steps)])
        positions = host.positions()[:n]
        start = positions[0] if len(set(positions)) == 1 else positions  # one shared position: one batched step
        hidden.copy_(self.talker.forward_hidden(x[:, None], cache, start)[:, 0])
        if not whole:  # the slots past the held ones made no frame
            frame = torch.cat([frame, frame.new_zeros(width - n, frame.shape[1])])
            valid = torch.cat([valid, valid.new_zeros(width - n)])
        return frame, valid


def _rows(x: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    """Rows `index` of x (None: x itself, the usual case of one sampling setting for every slot)."""
    return x if index is None else x[index]


def _mark(device):
    """An event recorded on the current CUDA stream now (None elsewhere): where a side stream may start reading."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record()
    return event


def _admit(runner, host: SlotTable, source, device, limit: int = 0) -> list:
    """Fill free slots (at most `limit`, 0 = all) from the source, one prefill for each group it hands out (a
    prompt's takes); returns the (slot, row) pairs admitted."""
    free = [s for s, r in enumerate(host.row) if r < 0]
    free = free[:limit] if limit > 0 else free
    admitted = []
    while free:
        group = source.take(len(free))
        if not group:
            break
        first = source.rows[group[0]]
        mine, free = free[: len(group)], free[len(group):]
        for slot, k in zip(mine, group):
            host.put(slot, k, first.prompt.prefill.shape[1], first.max_frames)
        keys = device_longs([source.rows[k].key for k in group], device)
        runner.admit(mine, first.prompt, keys, first.max_frames, first.params)
        admitted += zip(mine, group)
    return admitted


def decode_rows(
    runner,
    rows,
    *,
    slots: int,
    params: SamplingParams,
    eos_id: int,
    chunk_frames: int = 0,
    order=None,
    should_stop: Callable[[], bool] | None = None,
    on_frames: Callable[[int, int], None] | None = None,
    timings: dict | None = None,
    first_chunk_frames: int = 0,
    lead_rows: int = 0,
    prelaunch: bool = False,
    ahead: int = 0,
    on_admit: Callable[[list], None] | None = None,
) -> Iterator[FrameChunk]:
    """The one decode loop. Rows (a list, admitted in `order`, default their order; or a row source, see
    engine/row_source.py, read at every chunk boundary) run in `slots` batch slots;
    yields chunks of `chunk_frames` frames (0 = one chunk per admission wave: until every held row is
    done; the first chunk has `first_chunk_frames` when that is set, for earlier first audio) until every
    row has finished. `lead_rows` (0 = as many as fit) admits only that many rows before the first chunk,
    the rest at its end: with a short first chunk, the first row's first audio waits for one prefill, not
    for every slot's. `prelaunch` launches each next chunk's first frame before the chunk is yielded, for
    consumers whose work on a chunk need not come first on the stream (generate()'s side-stream codec; a
    stream's codec would wait a frame for its audio). `ahead` (with prelaunch) goes further: the next
    chunk's first `ahead` frames (at most a chunk) are launched before the host reads the chunk's finished
    flags, so the GPU has frames queued while the host waits, wakes up, does the chunk's bookkeeping
    (FinishedFlags) and the consumer's work. It is done only while no row waits for a slot and some row has
    budget left; when every row turns out to have ended by EOS inside the chunk, those frames are dropped
    (at most `ahead` frames of wasted GPU work, once a run). `on_admit([(slot, row), ...])` is told of the rows
    admitted, once every chunk before their first has been handed on and before that one is (the codec session
    starts their states then, beside their prefill and first frames).
    `on_frames(done, total)` counts frames over all rows (total is an estimate until the rows end);
    `timings`, if given, receives the first prefill's seconds and the slot occupancy."""
    params.validate()
    if isinstance(rows, (list, tuple)):
        if not rows:
            return
        rows = FixedRows(list(rows), order)
    source = rows
    device = source.device
    host = SlotTable(slots)
    t0 = time.perf_counter()
    # On CUDA the start is timed with events read after the first chunk's sync: no host sync of its own.
    events = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if timings is not None \
        and device.type == "cuda" else None
    if events is not None:
        events[0].record()
    runner.open(slots=slots, params=params, eos_id=eos_id, refills=source.refills(slots), max_len=source.max_len)
    tell = on_admit if on_admit is not None else (lambda pairs: None)
    admitted = _admit(runner, host, source, device, lead_rows)
    tell(admitted)
    if events is not None:
        events[1].record()
    elif timings is not None:
        timings["prefill_s"] = time.perf_counter() - t0
    ended = {}  # row -> frames stepped when it ended (an upper bound of its real frames)
    start = steps = busy = 0
    flags = FinishedFlags(runner, device) if ahead else None

    def chunk_size(at: int, queued: int = 0, admitted=()) -> int:
        """Frames of the chunk starting at frame `at`, `queued` of them already launched; rows just admitted
        (`admitted`: (slot, row) pairs) that ask for a short first chunk shorten it."""
        size = first_chunk_frames if at == 0 and first_chunk_frames > 0 else chunk_frames
        short = [source.rows[r].first_chunk for _, r in admitted if source.rows[r].first_chunk > 0]
        size = min([size] + short) if size > 0 else size
        left = host.frames_left() + queued
        return left if size <= 0 else min(size, left)

    def step():
        nonlocal busy
        if should_stop is not None and should_stop():
            raise GenerationInterrupted("generation was stopped on request")
        frame, valid = runner.next_frame(host)
        busy += sum(host.alive())
        host.advance()
        return frame, valid

    n, launched = chunk_size(0, admitted=admitted), []
    while True:
        if n == 0:  # nothing was admitted (the rows that waited were given up)
            return
        while len(launched) < n:
            launched.append(step())
        steps += n
        held, at_end = tuple(host.row), list(host.frames)
        # The chunk's tensors are made before anything else is queued: a side stream reads them after `ready`.
        codes, valid = torch.stack([f for f, _ in launched], 1), torch.stack([v for _, v in launched], 1)
        # A request that waits while slots are free already joins now, before this chunk's flags are read: its
        # prefill is queued behind the chunk's frames, and the next chunk's first frames (launched ahead) carry it.
        now_ended, dropped, retired = [], source.dropped(), []
        early, ready, joined = [], None, []  # the next chunk's first frames, launched before the flags are read
        joining = source.waiting() and any(r < 0 for r in host.row)
        snapped = flags is not None and (joining or (not source.waiting() and host.frames_left() > 0))
        if snapped:
            ready = flags.snapshot()
        if joining:
            ready = ready or _mark(device)
            joined = _admit(runner, host, source, device)
        if snapped and not source.waiting() and host.frames_left() > 0:
            while len(early) < min(ahead, chunk_size(start + n, queued=len(early), admitted=joined)):
                early.append(step())
        finished = flags.read() if snapped else runner.finished.tolist()  # the one host sync per chunk
        if events is not None:  # complete now: the sync above waited for them
            timings["prefill_s"] = events[0].elapsed_time(events[1]) / 1000
            events = None
        for s, r in enumerate(held):
            over = r >= 0 and (finished[s] or at_end[s] >= host.limit[s])
            if r >= 0 and (over or r in dropped):
                if not over:
                    retired.append(s)  # given up: it stops now, as a finished row
                ended[r] = min(at_end[s], host.limit[s])
                host.row[s] = -1
                now_ended.append(r)
        if retired:
            runner.retire(retired)
        done = not source.waiting() and all(r < 0 for r in host.row)
        chunk = FrameChunk(codes, valid, start, done, held, tuple(now_ended))
        start += n
        if on_frames is not None:
            running = {r: min(at_end[s], host.limit[s]) if held[s] == r else 0 for s, r in enumerate(host.row)
                       if r >= 0}
            rows = source.rows
            total = sum(ended.values()) + sum(max(f, rows[r].expected or rows[r].max_frames)
                                              for r, f in running.items())
            total += sum(rows[r].expected or rows[r].max_frames for r in source.queued())
            on_frames(sum(ended.values()) + sum(running.values()), total)
        if timings is not None:
            timings["batch"] = {"slots": slots, "rows": len(source.rows), "steps": steps,
                                "occupancy": busy / max(1, steps * slots)}
        launched = []
        chunk.ready = ready
        if early:
            # The rows that ended in this chunk step on in the early frames as finished rows (no valid
            # frame, their slots -1 from now on); if none is left, the frames are dropped.
            if not done:
                n = chunk_size(start, queued=len(early), admitted=joined)
                launched = early
        elif prelaunch and not done and not (source.waiting() and any(r < 0 for r in host.row)):
            # The next chunk's first frame goes to the GPU before this chunk is handed on, so the GPU
            # works through the consumer's host time instead of waiting for it. Nothing is guessed: the
            # rows that ended are known, and no row is admitted before it.
            chunk.ready = chunk.ready or _mark(device)
            n = chunk_size(start, admitted=joined)
            launched.append(step())
        yield chunk
        if done:
            return
        tell(joined)  # only now: the chunk just handed on was made before they joined
        if not launched:
            more = _admit(runner, host, source, device)
            tell(more)
            n = chunk_size(start, admitted=joined + more)
