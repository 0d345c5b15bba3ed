"""The one audio path: codes from the decode loop become audio while the frames are still being made.

A session follows the loop's chunks and decodes each row's new frames with the codec's chunked, stateful
decode (engine/codec/decoder.py: exact for any split). Streaming calls take each chunk's audio at once;
whole-utterance calls let the codes gather and decode them in pieces of at least 16 frames, so only the last,
short piece is left after the last frame. With CUDA graphs the decode runs as piece-graph replays
(engine/gpu/codec_graph.py) on a side stream, beside the frames: a frame is a chain of small, latency-bound
kernels, the codec a few large convolutions, and the two overlap.

Rows share one decode state in one of two ways:
* "together": every row holds its slot from the first frame to its end, with one ICL reference (or none), and
  the rows decode as one batch from one start (takes of a line, the nodes' usual case);
* "slotted": rows join later or have several voices, so the rows of the state belong to different utterances,
  each at its own position (a row starts fresh, or from the one-row state after its reference). Each decode
  covers every slot up to the highest one held, as one batch; a stream decodes on the smallest view of the
  state's first rows that holds them (a loop fills its lowest free slots: a lone row decodes alone).
"""
from __future__ import annotations

import torch

from .config import SAMPLES_PER_FRAME
from .gpu.buckets import batch_bucket

# Frames a whole-utterance decode gathers per piece: the piece left after the last frame is then at most
# this long, and the frames lose no time to pieces this size (docs/PERFORMANCE_NOTES.md, codec overlap).
WHOLE_PIECE_FRAMES = 16


class _Group:
    """The together rows' state and what they have not decoded yet."""

    def __init__(self, state, shared: bool):
        self.state = state  # a DecodeState
        self.shared = shared  # the state is a graph bucket's, handed over by CodecGraphs.acquire
        self.pending: list[torch.Tensor] = []  # codes [B, Q, k] not decoded yet
        self.parts: list[torch.Tensor] = []  # whole mode: decoded audio [B, k * 1920], in order

    def pending_frames(self) -> int:
        return sum(c.shape[-1] for c in self.pending)


class CodecSession:
    """Audio for the rows of one decode loop.

    refs[r]: row r's ICL reference codes [R, Q] or None. together: the loop admits every row at once, each
    holding its slot from the first frame to its end, and all refs are one. stream: `push` returns each
    row's new audio (on the host); otherwise `finish` returns every row's whole audio (on the device).
    side: the CUDA stream the codec runs on (None: the current one). slots: the loop's slots (for rows that are
    not together; default len(refs))."""

    def __init__(self, decoder, graphs, refs: list, *, together: bool, stream: bool, side=None,
                 slots: int | None = None):
        self.decoder, self.graphs, self.refs = decoder, graphs, refs
        self.stream, self.side, self.together = stream, side, together
        self.groups: dict[int, _Group] = {}  # together: -1 -> the rows' group
        self.closed = False
        # The graph states are taken here, on the caller's stream, before the loop's first frame: a row count
        # whose pieces are not captured yet is captured now, never while frames run.
        if not together:
            self._open_slots(slots or max(1, len(refs)))
            return
        shared = graphs.acquire(len(refs), self) if graphs is not None and refs else None
        if side is not None:  # a reference's decode must not hold up the first frames on the main stream
            side.wait_stream(torch.cuda.current_stream(side.device))
            with torch.cuda.stream(side):
                self._open_together(shared, refs[0])
        else:
            self._open_together(shared, refs[0] if refs else None)

    # -- together --------------------------------------------------------------------------------

    def _open_together(self, shared, ref) -> None:
        """One state for every slot: the bucket's (None: held by another call, or no graphs) or a private one,
        after the ICL reference `ref` (left context, never emitted)."""
        from .codec.decoder import DecodeState

        state = shared if shared is not None else DecodeState()
        if ref is None:
            state.zero_()
        else:
            self.decoder.check_codes(ref.t()[None])
            ref = ref.to(self._device())
            if self.graphs is not None:
                self.graphs.prime(state, ref, len(self.refs))
            else:
                state.zero_()
                self.decoder(ref.t()[None].expand(len(self.refs), -1, -1), state, check=False)
        self.groups[-1] = _Group(state, shared is not None)

    def _flush(self, final: bool) -> torch.Tensor | None:
        """Decode what the together rows have pending (whole mode: whole pieces only, until their end)."""
        group = self.groups[-1]
        frames = group.pending_frames()
        if not final and not self.stream:
            frames -= frames % WHOLE_PIECE_FRAMES
        if frames == 0:
            return None
        codes = torch.cat(group.pending, -1) if len(group.pending) > 1 else group.pending[0]
        now, rest = codes[..., :frames], codes[..., frames:]
        group.pending = [rest] if rest.shape[-1] else []
        if self.graphs is not None:  # the last piece of a whole utterance runs as one padded piece
            wav = self.graphs.decode(now, group.state, final=final and not self.stream)
        else:
            wav = self.decoder(now, group.state, check=False)
        if not self.stream:
            group.parts.append(wav)
        return wav

    def _push_together(self, chunk) -> list:
        codes = chunk.codes.masked_fill(~chunk.valid[..., None], 0)  # frames past a row's end: zeros
        self.groups[-1].pending.append(codes.transpose(1, 2))
        wav = self._flush(final=chunk.done)
        if not self.stream:
            return []
        real = chunk.valid.sum(1)
        keep = torch.arange(wav.shape[1], device=wav.device)[None] < (real * SAMPLES_PER_FRAME)[:, None]
        wav = wav.float().masked_fill(~keep, 0.0).cpu()  # one copy; it waits for this stream only
        real, codes_host = real.tolist(), chunk.codes.cpu()
        return [(r, wav[s, : real[s] * SAMPLES_PER_FRAME], codes_host[s, : real[s]], r in chunk.ended)
                for s, r in enumerate(chunk.rows) if r >= 0]

    # -- slotted ---------------------------------------------------------------------------------

    def _open_slots(self, slots: int) -> None:
        """The state every slot lives in, from its first frame to its end: the graphs' shared state of the slots'
        bucket where this session can hold it (a stream's with piece graphs for the views of its first 1, 2, 4,
        ... rows), else a private one, made at the first chunk."""
        self.root = self.graphs.acquire(slots, self, views=self.stream) if self.graphs is not None else None
        self.root_shared = self.root is not None  # the graphs' state, whose views have graphs
        self.root_rows = self.graphs.bucket_holding(self.root) if self.root_shared else slots
        self.started: set = set()  # rows whose utterance has begun in a slot
        self.pending: list = []  # whole mode: chunks not decoded yet, as (codes [slots, Q, k], [(slot, row, n)])
        self.parts: dict[int, list] = {}  # whole mode: row -> its decoded audio [n * 1920], in order

    def _root_state(self):
        """The slots' state; a private one is zeros shaped like a one-row state that decoded a frame (one row's
        decode allocates every buffer, a whole-width one would cost a frame of every slot)."""
        if self.root is None:
            from .codec.decoder import DecodeState

            one = DecodeState()
            codes = torch.zeros(1, self.decoder.cfg.num_quantizers, 1, dtype=torch.long, device=self._device())
            self.decoder(codes, one, check=False)
            self.root = one.widened(self.root_rows)
        return self.root

    def _one_row_start(self, ref):
        """The one-row state after ICL reference codes `ref` [R, Q] (None: a fresh start)."""
        if ref is None:
            return None
        self.decoder.check_codes(ref.t()[None])
        if self.graphs is not None:
            return self.graphs.one_row_prefix(ref)
        return self.decoder.state_after(ref).buffers()

    def _rows_state(self, span: int):
        """The rows a decode whose held slots end at `span` runs on: with graphs, a stream's smallest captured view
        that holds them, or the whole bucket (whole mode captures no views); else exactly `span` rows."""
        root = self._root_state()
        if self.root_shared:
            rows = batch_bucket(span) if self.stream else self.root_rows
            return rows, self.graphs.view(self.root_rows, rows)
        return span, root if span == self.root_rows else root.first_rows(span)

    def _push_slots(self, chunk) -> list:
        held = [(slot, r) for slot, r in enumerate(chunk.rows) if r >= 0]
        new = [(slot, r) for slot, r in held if r not in self.started]
        if new and self.pending:  # a slot's last utterance is decoded before the slot starts the next
            self._decode_slots(final=False)
        for slot, r in new:
            self._root_state().start_row(slot, self._one_row_start(self.refs[r]))
            self.started.add(r)
        real = chunk.valid.sum(1).tolist()
        if held:
            codes = chunk.codes.masked_fill(~chunk.valid[..., None], 0).transpose(1, 2)
            self.pending.append((codes, [(slot, r, real[slot]) for slot, r in held]))
        self.started.difference_update(chunk.ended)
        if not self.stream:
            gathered = sum(c.shape[-1] for c, _ in self.pending)
            if self.pending and (chunk.done or gathered >= WHOLE_PIECE_FRAMES):
                self._decode_slots(final=chunk.done)
            return []
        if not held:
            return []
        wav = self._decode_slots(final=False).float().cpu()  # one copy for every row; it waits for this stream only
        codes_host = chunk.codes.cpu()
        return [(r, wav[slot, : real[slot] * SAMPLES_PER_FRAME], codes_host[slot, : real[slot]], r in chunk.ended)
                for slot, r in held]

    def _decode_slots(self, final: bool) -> torch.Tensor:
        """Decode the pending chunks on one view, as one batch: audio [rows, frames * 1920] (whole mode also
        files each row's part). final: nothing follows (the last piece may run padded past the end)."""
        pending, self.pending = self.pending, []
        codes = torch.cat([c for c, _ in pending], -1) if len(pending) > 1 else pending[0][0]
        span = 1 + max(slot for _, held in pending for slot, _, _ in held)
        rows, state = self._rows_state(span)
        codes = codes[:rows]
        if codes.shape[0] < rows:  # a view wider than the loop's slots: zero rows
            codes = torch.cat([codes, codes.new_zeros(rows - codes.shape[0], *codes.shape[1:])])
        if self.graphs is not None:
            wav = self.graphs.decode(codes, state, final=final)
        else:
            wav = self.decoder(codes, state, check=False)
        if not self.stream:
            spans: dict[int, list] = {}  # row -> [slot, first frame, end frame] in this decode
            start = 0
            for c, held in pending:
                for slot, r, n in held:
                    got = spans.setdefault(r, [slot, start, start])
                    if n:
                        got[1:] = [got[1] if got[2] > got[1] else start, start + n]
                start += c.shape[-1]
            for r, (slot, a, b) in spans.items():
                if b > a:
                    self.parts.setdefault(r, []).append(wav[slot, a * SAMPLES_PER_FRAME: b * SAMPLES_PER_FRAME])
        return wav

    # -- the loop's chunks and the end -----------------------------------------------------------

    def push(self, chunk) -> list:
        """Take one FrameChunk of the loop. Streaming: [(row, audio [k * 1920] float32 on the host, codes
        [k, Q] on the host, final)] for every row held in the chunk; whole mode: []."""
        with chunk.on(self.side):
            return self._push_together(chunk) if self.together else self._push_slots(chunk)

    def finish(self) -> torch.Tensor | list:
        """Whole mode, after the loop's last chunk. Together: the batch's audio [slots, frames * 1920] in slot
        order; else each row's audio [frames_r * 1920]. On the device, ready on the current stream."""
        main = None
        if self.side is not None:
            main = torch.cuda.current_stream(self.side.device)
            main.wait_stream(self.side)
        if self.together:
            parts = [self.groups[-1].parts] if -1 in self.groups else [[]]
            rows = [len(self.refs)]
        else:
            parts = [self.parts.get(r, []) for r in range(len(self.refs))]
            rows = [None] * len(self.refs)
        out = []
        for mine, batch in zip(parts, rows):
            if main is not None:
                for p in mine:
                    p.record_stream(main)  # made on the side stream, read (and freed) on the main one
            if not mine:
                wav = torch.zeros(*([batch] if batch else []), 0, device=self._device())
            else:
                wav = torch.cat(mine, -1) if len(mine) > 1 else mine[0]
            out.append(wav)
        self.release()
        return out[0] if self.together else out

    def release(self) -> None:
        """Hand back the graph state this session holds (also on an interrupted or closed call)."""
        if self.closed:
            return
        self.closed = True
        if self.side is not None:  # the codec's queued work ends before anyone reuses the state
            torch.cuda.current_stream(self.side.device).wait_stream(self.side)
        if self.graphs is not None:
            self.graphs.release_owner(self)
        self.groups.clear()
        self.root = None
        if not self.together:
            self.pending, self.parts = [], {}

    def _device(self):
        return next(self.decoder.parameters()).device
