"""The one audio path: codes from the decode loop become audio while the frames are still being made.

A session follows the loop's chunks and decodes each row's new frames with the codec's chunked, stateful
decode (engine/codec/decoder.py: exact for any split). Streaming calls take each chunk's audio at once;
whole-utterance calls let the codes gather and decode them in 16-frame pieces, so only the last, short
piece is left after the last frame. With CUDA graphs the decode runs as piece-graph replays
(engine/gpu/codec_graph.py) on a side stream, beside the frames: a frame is a chain of small, latency-bound
kernels, the codec a few large convolutions, and the two overlap.

Rows share one decode state when they can: every row in a slot from the first frame to its end, with one ICL
reference (or none), decodes as one batch ("together": takes of a line, the nodes' usual case). Rows that join later
or have several voices stream "slotted": the rows of a state belong to different utterances, each at its own
position (a row starts fresh, or from the one-row state after its reference, when the loop admits it: the copy runs
beside its prefill and first frames, not before its first audio), and each chunk decodes every slot up to the
highest one held as one batch, on the smallest view of the state's first rows that holds them (a loop fills its
lowest free slots: a lone row decodes alone). A batch invariant engine's slotted streams decode every slot, one
frame at a time, instead: the codec's kernels choose their sum order by the batch and piece shape, so only one shape
for every chunk gives a row the same samples whatever rows run beside it and wherever the loop's chunk boundaries
fall. Whole-utterance calls with such rows give each row a state of its own; with graphs the rows take turns on the
one-row bucket's captured state.
"""
from __future__ import annotations

import contextlib

import torch

from .config import SAMPLES_PER_FRAME
from .gpu.buckets import batch_bucket

# Frames a whole-utterance decode gathers per piece: the piece left after the last frame is then at most
# this long, and the frames lose no time to pieces this size (docs/PERFORMANCE_NOTES.md, codec overlap).
WHOLE_PIECE_FRAMES = 16


class _Group:
    """Rows decoded on one state: every row (together), or one."""

    def __init__(self, state, shared: bool):
        self.state = state  # a DecodeState, or a parked snapshot of the one-row bucket's (a list of tensors)
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
    side: the CUDA stream the codec runs on (None: the current one). slots: the loop's slots (streams of rows
    that are not together; default len(refs)). invariant: a slotted stream decodes every slot one frame at a
    time (EngineConfig.batch_invariant), so each row's samples never depend on the other rows or the chunks."""

    def __init__(self, decoder, graphs, refs: list, *, together: bool, stream: bool, side=None,
                 slots: int | None = None, invariant: bool = False):
        self.decoder, self.graphs, self.refs, self.invariant = decoder, graphs, refs, invariant
        self.stream, self.side, self.together = stream, side, together
        self.groups: dict[int, _Group] = {}  # row (-1: the together group) -> its group
        self.current = None  # per-row with graphs: the row whose state sits in the one-row bucket's buffers
        self.bucket_state = None  # per-row with graphs: the one-row bucket's state, while this session holds it
        self.slotted = stream and not together
        self.closed = False
        # The graph states are taken here, on the caller's stream, before the loop's first frame: a row count
        # whose pieces are not captured yet is captured now, never while frames run.
        if self.slotted:
            self._open_slots(slots or max(1, len(refs)))
            return
        shared = graphs.acquire(len(refs) if together else 1, self) if graphs is not None and refs else None
        if not together:
            self.bucket_state = shared
            return
        if side is not None:  # a reference's decode must not hold up the first frames on the main stream
            side.wait_stream(torch.cuda.current_stream(side.device))
            with torch.cuda.stream(side):
                self._open_together(shared, refs[0])
        else:
            self._open_together(shared, refs[0] if refs else None)

    # -- states ------------------------------------------------------------------------------------

    def _fresh(self, state, ref, batch: int) -> None:
        """Start a new utterance on `state` after the ICL reference `ref` (left context, never emitted)."""
        if ref is None:
            state.zero_()
            return
        ref = ref.to(self._device())
        if self.graphs is not None:
            self.graphs.prime(state, ref, batch)
        else:
            state.zero_()
            self.decoder(ref.t()[None].expand(batch, -1, -1), state, check=False)

    def _open_together(self, shared, ref) -> None:
        """One state for every slot: the bucket's (None: held by another call, or no graphs) or a private one."""
        from .codec.decoder import DecodeState

        if ref is not None:
            self.decoder.check_codes(ref.t()[None])
        group = _Group(shared if shared is not None else DecodeState(), shared is not None)
        self._fresh(group.state, ref, len(self.refs))
        self.groups[-1] = group

    def _open(self, row: int, ref) -> None:
        """Row `row` starts: its own state, in the one-row bucket's buffers when this session holds them."""
        from .codec.decoder import DecodeState

        if ref is not None:
            self.decoder.check_codes(ref.t()[None])
        if self.bucket_state is None:  # a private state for this row
            group = _Group(DecodeState(), False)
            self._fresh(group.state, ref, 1)
            self.groups[row] = group
            return
        self._park()
        self._fresh(self.bucket_state, ref, 1)
        self.groups[row] = _Group(None, True)  # its state lives in the bucket's buffers for now
        self.current = row

    def _park(self) -> None:
        """Copy the state of the row now in the one-row bucket out to that row's own buffers."""
        if self.current is None:
            return
        group = self.groups[self.current]
        if group.state is None:
            group.state = self.bucket_state.snapshot()
        else:
            for dst, src in zip(group.state, self.bucket_state.buffers()):
                dst.copy_(src)
        self.current = None

    def _state_of(self, row: int):
        group = self.groups[row]
        if not group.shared or row == -1:
            return group.state
        if self.current != row:
            self._park()
            self.bucket_state.restore(group.state)
            self.current = row
        return self.bucket_state

    def _retire(self, row: int) -> None:
        """Row `row` has ended: drop its state (whole mode keeps its audio for finish)."""
        if self.current == row:
            self.current = None
        if self.stream:
            del self.groups[row]
        else:
            self.groups[row].state = None
            self.groups[row].shared = False

    # -- slotted states ------------------------------------------------------------------------------

    def _open_slots(self, slots: int) -> None:
        """The state every slot lives in, from its first frame to its end: the graphs' shared state of the slots'
        bucket where this session can hold it (with piece graphs for the views of its first 1, 2, 4, ... rows),
        else a private one, made at the first chunk."""
        self.root = self.graphs.acquire(slots, self, views=True) if self.graphs is not None else None
        self.root_shared = self.root is not None  # the graphs' state, whose views have graphs
        self.root_rows = self.graphs.bucket_holding(self.root) if self.root_shared else slots
        self.started: set = set()  # rows whose utterance has begun in a slot
        self.opened = None  # on the caller's stream, after the states were taken: where `admit` may start
        if self.side is not None:
            self.opened = torch.cuda.Event()
            self.opened.record()

    def admit(self, pairs: list) -> None:
        """The loop admitted these rows ((slot, row) pairs; decode_rows' on_admit): a slotted stream starts each
        one's utterance in its slot now, on the side stream, so its reference state is copied in while its prefill
        and first frames run. The loop calls it after pushing every chunk made before the rows joined."""
        if not self.slotted or not pairs:
            return
        with self._beside():
            root = self._root_state()
            for slot, r in pairs:
                root.start_row(slot, self._one_row_start(self.refs[r]))
                self.started.add(r)

    @contextlib.contextmanager
    def _beside(self):
        """Run the block on the side stream (if any), after what the caller's stream did before the session opened."""
        if self.side is None:
            yield
            return
        self.side.wait_event(self.opened)
        with torch.cuda.stream(self.side):
            yield

    def _root_state(self):
        """The slots' state: the graphs' shared one, or a private fresh one (CodecDecoder.fresh_state)."""
        if self.root is None:
            self.root = self.decoder.fresh_state(self.root_rows)
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
        """The view a chunk whose held slots end at `span` decodes on: with graphs, the smallest captured view
        that holds them; else exactly `span` rows. Invariant: every slot."""
        root = self._root_state()
        if self.invariant:
            span = self.root_rows
        if self.root_shared:
            rows = batch_bucket(span)
            return rows, self.graphs.view(self.root_rows, rows)
        return span, root if span == self.root_rows else root.first_rows(span)

    def _push_slots(self, chunk) -> list:
        held = [(slot, r) for slot, r in enumerate(chunk.rows) if r >= 0]
        if not held:
            return []
        missing = [r for _, r in held if r not in self.started]
        if missing:
            raise RuntimeError(f"rows {missing} reached the codec session without being admitted to it; the decode "
                               "loop must be given on_admit=session.admit")
        rows, state = self._rows_state(held[-1][0] + 1)
        codes = chunk.codes[:rows].masked_fill(~chunk.valid[:rows, :, None], 0).transpose(1, 2)
        if codes.shape[0] < rows:  # a view wider than the loop's slots: zero rows
            codes = torch.cat([codes, codes.new_zeros(rows - codes.shape[0], *codes.shape[1:])])
        if self.invariant:  # one shape for every chunk: [every slot, one frame]
            wav = torch.cat([self._decode(codes[..., f: f + 1], state) for f in range(codes.shape[-1])], 1)
        else:
            wav = self._decode(codes, state)
        wav = wav.float().cpu()  # one copy for every row; it waits for this stream only
        real, codes_host = chunk.valid.sum(1).tolist(), chunk.codes.cpu()
        out = []
        for slot, r in held:
            n, final = real[slot], r in chunk.ended
            out.append((r, wav[slot, : n * SAMPLES_PER_FRAME], codes_host[slot, :n], final))
            if final:
                self.started.discard(r)
        return out

    # -- decoding ----------------------------------------------------------------------------------

    def _decode(self, codes: torch.Tensor, state) -> torch.Tensor:
        if self.graphs is not None:
            return self.graphs.decode(codes, state)
        return self.decoder(codes, state, check=False)

    def _flush(self, row: int, final: bool) -> torch.Tensor | None:
        """Decode what group `row` has pending (whole mode: whole pieces only, until its end)."""
        group = self.groups[row]
        frames = group.pending_frames()
        if not final and not self.stream:
            frames -= frames % WHOLE_PIECE_FRAMES
        if frames == 0:
            return None
        codes = torch.cat(group.pending, -1) if len(group.pending) > 1 else group.pending[0]
        now, rest = codes[..., :frames], codes[..., frames:]
        group.pending = [rest] if rest.shape[-1] else []
        state = self._state_of(row)
        if self.graphs is not None:  # the last piece of a whole utterance runs as one padded piece
            wav = self.graphs.decode(now, state, final=final and not self.stream)
        else:
            wav = self.decoder(now, state, check=False)
        if not self.stream:
            group.parts.append(wav)
        return wav

    def push(self, chunk) -> list:
        """Take one FrameChunk of the loop. Streaming: [(row, audio [k * 1920] float32 on the host, codes
        [k, Q] on the host, final)] for every row held in the chunk; whole mode: []."""
        with chunk.on(self.side):
            if self.slotted:
                return self._push_slots(chunk)
            return self._push_together(chunk) if self.together else self._push_rows(chunk)

    def _push_together(self, chunk) -> list:
        codes = chunk.codes.masked_fill(~chunk.valid[..., None], 0)  # frames past a row's end: zeros
        self.groups[-1].pending.append(codes.transpose(1, 2))
        wav = self._flush(-1, final=chunk.done)
        if not self.stream:
            return []
        real = chunk.valid.sum(1)
        keep = torch.arange(wav.shape[1], device=wav.device)[None] < (real * SAMPLES_PER_FRAME)[:, None]
        wav = wav.float().masked_fill(~keep, 0.0).cpu()  # one copy; it waits for this stream only
        real, codes_host = real.tolist(), chunk.codes.cpu()
        return [(r, wav[s, : real[s] * SAMPLES_PER_FRAME], codes_host[s, : real[s]], r in chunk.ended)
                for s, r in enumerate(chunk.rows) if r >= 0]

    def _push_rows(self, chunk) -> list:
        real = chunk.valid.sum(1).tolist()  # a row's real frames are a prefix of its chunk
        codes_host = chunk.codes.cpu() if self.stream else None
        out = []
        for slot, r in enumerate(chunk.rows):
            if r < 0:
                continue
            if r not in self.groups:
                self._open(r, self.refs[r])
            n, final = real[slot], r in chunk.ended
            if n:
                self.groups[r].pending.append(chunk.codes[slot, :n].t()[None])
            wav = self._flush(r, final)
            if self.stream:
                audio = wav[0].float().cpu() if wav is not None else torch.zeros(0)
                out.append((r, audio, codes_host[slot, :n], final))
            if final:
                self._retire(r)
        return out

    # -- the end -----------------------------------------------------------------------------------

    def finish(self) -> torch.Tensor | list:
        """Whole mode, after the loop's last chunk. Together: the batch's audio [slots, frames * 1920] in slot
        order; else each row's audio [frames_r * 1920]. On the device, ready on the current stream."""
        main = None
        if self.side is not None:
            main = torch.cuda.current_stream(self.side.device)
            main.wait_stream(self.side)
        out = []
        for row in ([-1] if self.together else range(len(self.refs))):
            group = self.groups.get(row)
            parts = group.parts if group is not None else []
            if main is not None:
                for p in parts:
                    p.record_stream(main)  # made on the side stream, read (and freed) on the main one
            rows = len(self.refs) if row == -1 else 1
            if not parts:
                wav = torch.zeros(rows, 0, device=self._device())
            else:
                wav = torch.cat(parts, 1) if len(parts) > 1 else parts[0]
            out.append(wav if row == -1 else wav[0])
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
        self.current = self.bucket_state = self.root = None

    def _device(self):
        return next(self.decoder.parameters()).device
