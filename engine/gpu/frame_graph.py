"""A whole frame as one CUDA graph: talker sampling, the 15 code-predictor steps with their sampling,
the next input's embedding sum and the talker step.

Graphs are keyed by (batch bucket, attention window) and share one memory pool. With the Triton attention
the window is None: the kernel reads each row's length from its position on the device, so one graph per
bucket serves every position up to the cache's room, and no request ever waits for a window's capture.
The torch attention (Triton off) attends over a window of WINDOW_STEP positions a bucket, masked per row,
one graph per window. Everything a frame reads or writes lives in static buffers owned by `FrameState` (one
per batch bucket): the talker hidden state, each row's position, frame counter and frame budget, the per-row
stream keys, the repetition-penalty mask, the finished flags, each row's sampling settings and trailing
text. Rows may hold different prompts: the talker attention masks each row at its own length (inside one
window, the bucket of the longest row, on the torch path), RoPE and the cache write use each row's position.
A finished row stops advancing, so it never writes past its own cache room. Replaying never syncs the host;
the decode loop reads the finished flags once per chunk and admits new rows between replays.

Nested buckets (Triton attention): a bucket's graphs come with graphs over the first 1, 2, 4, ... rows of the same
state (views of its buffers). The decode loop fills the lowest free slots, so a loop opened with many slots that
holds few rows (a server's scheduler between bursts) replays the graph of the rows it holds, at that batch's cost.
"""
from __future__ import annotations

import copy
import logging
import time

import torch

from .. import sampling
from ..kernels.attention import position_bias
from ..model.kv_cache import runs
from ..slots import prefill_into, trailing_table
from ..transfer import device_longs
from .buckets import BATCH_BUCKETS, batch_bucket, bucket_for
from .capture import capture
from .fused_layers import FusedStack
from .row_settings import RowSettings

log = logging.getLogger(__name__)

WINDOW_STEP = 256  # attention windows are multiples of this many positions (the torch attention's graphs)



class FrameState:
    """Static buffers of one batch bucket; a captured graph reads and writes exactly these."""

    def __init__(self, talker, batch: int, max_len: int, trailing_rows: int):
        w = talker.codec_head.weight
        dev, dt = w.device, w.dtype
        vocab, hidden = w.shape
        self.batch, self.max_len = batch, max_len
        self.cache = talker.new_cache(batch, max_len)
        self.pred_cache = talker.code_predictor.new_cache(batch)
        self.hidden = torch.zeros(batch, hidden, device=dev, dtype=dt)
        long = {"dtype": torch.long, "device": dev}
        self.pos = torch.zeros(batch, **long)  # cache position each row writes next
        self.rows = torch.arange(batch, **long)  # each row's own index (read only)
        # [source row, shared length] a row: the talker attention reads positions below the length from the
        # source row's cache (identical K/V: one prompt's takes), so HBM serves a prompt's K/V once a frame.
        self.share = torch.stack([self.rows, torch.zeros(batch, **long)])
        self.t = torch.zeros(batch, **long)  # frames each row has produced
        self.limit = torch.zeros(batch, **long)  # each row's frame budget
        self.keys = torch.zeros(batch, **long)
        self.seen = torch.zeros(batch, vocab, dtype=torch.bool, device=dev)
        self.finished = torch.ones(batch, dtype=torch.bool, device=dev)  # empty rows count as finished
        self.valid = torch.zeros(batch, dtype=torch.bool, device=dev)  # the last frame is real speech
        groups = talker.cfg.num_code_groups  # codebooks per frame; predictor positions 0..groups-1
        self.frame = torch.zeros(batch, groups, dtype=torch.long, device=dev)  # the samplers write their columns
        self.embeds = torch.zeros(batch, groups, hidden, device=dev, dtype=dt)  # and their codes' embedding rows
        self.trailing_rows = trailing_rows
        self.trailing = torch.zeros(batch * trailing_rows, hidden, device=dev, dtype=dt)  # row b from b * rows
        self.trailing_start = self.rows * trailing_rows
        self.trailing_last = torch.zeros(batch, **long)
        self.pred_pos = [torch.tensor([j], device=dev) for j in range(groups)]
        self.pred_bias = [torch.where(torch.arange(groups, device=dev) <= j, 0.0, float("-inf")).to(dt)
                          for j in range(groups)]
        self.pred_rope = None  # filled by GraphedFrames (needs the predictor's rotary tables)
        self.rope_table = None  # filled by GraphedFrames: the talker's (cos, sin_signed) of every cache position
        self.banned = torch.zeros(vocab, dtype=torch.bool, device=dev)
        self.eos_mask = torch.zeros(vocab, dtype=torch.bool, device=dev)
        self.settings = RowSettings(batch, dev, vocab, talker.code_predictor.cfg.predictor.vocab_size)
        self.p = self.settings.p  # each row's sampling settings, [batch] device tensors
        self.eos_key = None  # the EOS id set_eos last wrote
        self.first = {}  # bool [B, V], column 0 set: top-p always keeps the most likely id
        self.sub_vocab = talker.code_predictor.cfg.predictor.vocab_size
        for width in (vocab, self.sub_vocab):
            self.first[width] = torch.zeros(batch, width, dtype=torch.bool, device=dev)
            self.first[width][:, 0] = True

    def head(self, rows: int) -> FrameState:
        """The first `rows` rows as a state of their own: views of this state's buffers, so a graph captured
        over it steps those rows in place and leaves the rest as they are. Shared with this state: the
        settings tables (written through this state), the masks and the RoPE tables."""
        view = copy.copy(self)
        view.batch = rows
        view.cache, view.pred_cache = self.cache.head(rows), self.pred_cache.head(rows)
        for name in ("hidden", "pos", "rows", "t", "limit", "keys", "seen", "finished", "valid", "frame", "embeds",
                     "trailing_start", "trailing_last"):
            setattr(view, name, getattr(self, name)[:rows])
        view.share = self.share[:, :rows]
        view.trailing = self.trailing[: rows * self.trailing_rows]
        view.p = {name: t[:rows] for name, t in self.p.items()}
        view.first = {width: t[:rows] for width, t in self.first.items()}
        return view

    def index(self, slots: list) -> torch.Tensor:
        """Rows `slots` as a device index, made without a blocking copy: a view of `rows` when they are
        consecutive (a takes group always is), else a pinned copy queued on the stream."""
        spans = runs(slots)
        if len(spans) == 1:
            return self.rows[spans[0][0]: spans[0][1]]
        return device_longs(slots, self.rows.device)

    def small_state(self) -> list:
        """What one frame advances (the caches are rewritten at the same positions by a replay)."""
        return [self.hidden, self.pos, self.t, self.seen, self.finished, self.valid, self.frame]

    def snapshot(self) -> list:
        return [x.clone() for x in self.small_state()]

    @torch.inference_mode()  # the buffers are inference tensors (decoding runs in inference mode)
    def restore(self, saved: list) -> None:
        for dst, src in zip(self.small_state(), saved):
            dst.copy_(src)

    def set_eos(self, eos_id: int) -> None:
        """The suppression and EOS masks of codebook 0; skipped when they already hold these."""
        if self.eos_key == eos_id:
            return
        self.banned.copy_(sampling.control_mask(self.banned.shape[0], eos_id, self.banned.device))
        self.eos_mask.zero_()
        self.eos_mask[eos_id] = True
        self.eos_key = eos_id


def projected_tables(talker) -> list | None:
    """small_to_mtp_projection (the 1.7B's talker-width -> predictor-width linear with bias) applied once, at
    load, to every embedding table whose rows feed the predictor: the talker's codec table (c0) and codebooks
    1..14. It is linear in the row, so the sampler hands back a row of these instead of each pass projecting
    its input: 15 launches of a 2048 x 1024 linear fewer a frame, for 65 MB (bf16). Rounded as the linear
    rounds (fp32 products and bias, one rounding to the model dtype). None where the widths are equal."""
    proj = talker.code_predictor.small_to_mtp_projection
    if not isinstance(proj, torch.nn.Linear):
        return None
    w, b = proj.weight.float().t(), proj.bias.float()
    tables = [talker.model.codec_embedding.weight]
    tables += [e.weight for e in talker.code_predictor.model.codec_embedding[:-1]]  # the last feeds no pass
    with torch.no_grad():
        return [torch.addmm(b, t.float(), w).to(t.dtype) for t in tables]


def predict_residuals(talker, fused: FusedStack, s: FrameState, c0_in, choose) -> None:
    """Codebooks 1..15 as 16 fused single-token steps: positions 0 and 1 take [h, E(c0)] (the eager
    predictor's two-token prefill), then each new code feeds the next position. The final norm runs
    inside each head's matmul; position 0 only fills the cache, so it skips norm and head.
    `c0_in` is E(c0) as the predictor takes it (projected, on the 1.7B). `choose(logits, j)` puts the code
    into s.frame[:, j] and its row of codebook j's embedding (a term of the talker's next input) into
    s.embeds[:, j], and returns the next pass's input (that row, projected on the 1.7B)."""
    pred = talker.code_predictor
    proj = pred.small_to_mtp_projection
    h = s.hidden[:, None]
    if isinstance(proj, torch.nn.Linear):  # the one input with no projected table: the talker's hidden state
        h = fused.ks.linear(h, proj.weight, bias=proj.bias)
    fused.whole_pass(h, s.pred_cache, s.pred_pos[0], s.pred_bias[0], s.pred_rope[0],
                         pred.lm_head[0].weight, fill_only=True)
    x = c0_in
    for j in range(1, pred.num_groups + 1):
        logits = fused.whole_pass(x[:, None], s.pred_cache, s.pred_pos[j], s.pred_bias[j], s.pred_rope[j],
                                      pred.lm_head[j - 1].weight)  # in the model dtype
        x = choose(logits, j)


def frame_body(talker, fused: dict, s: FrameState, window: int | None) -> None:
    """One frame over the static buffers of `s` (the graph captures exactly this). window None: the talker's
    attention kernel reads each row's length from s.pos (GraphedFrames.device_length)."""
    p = s.p
    pred = talker.code_predictor
    ks = fused["talker"].ks
    codec_logits = ks.linear(s.hidden, talker.codec_head.weight)
    if "sample" in ks.active:  # the kernel draws its uniforms itself, from (key, step, slot)
        def draws(j, width):
            return {"keys": s.keys, "step": s.t, "slot": j}
    else:  # the torch reference: every draw of this frame at once
        u = sampling.frame_uniforms(s.keys, s.t, s.frame.shape[1], codec_logits.shape[-1])

        def draws(j, width):
            return {"u": u[:, j, :width], "first": s.first[width]}

    # The sampling launches write the code into its column of s.frame and its embedding row into s.embeds (no
    # separate lookups, no stacking), and on the 1.7B also hand back the row of the projected copy
    # (projected_tables), the predictor's input.
    projected = fused.get("projected") or []

    def sample_code(logits, j, *settings, embed, **kw):
        """Codebook j's code and embedding row into their slots; returns the predictor's input: that row, or
        its projected row where there is one (codebook 15 feeds no pass)."""
        _, row, *fed = ks.sample(logits, *settings, **draws(j, logits.shape[-1]), embed=embed,
                                 embed2=projected[j] if j < len(projected) else None, out_ids=s.frame[:, j],
                                 out_rows=s.embeds[:, j], **kw)
        return fed[0] if fed else row

    # Codebook 0 in one op: penalty, suppression, sampling and the bookkeeping (seen, finished).
    c0_in = sample_code(codec_logits, 0, p["do_sample"], p["temperature"], p["top_k"], p["top_p"],
                        embed=talker.model.codec_embedding.weight, penalty=p["penalty"], seen=s.seen, banned=s.banned,
                        eos_mask=s.eos_mask, t=s.t, min_new=p["min_new"], finished=s.finished, update=True)

    def choose_residual(lg, j):
        return sample_code(lg, j, p["sub_do_sample"], p["sub_temperature"], p["sub_top_k"], p["sub_top_p"],
                           embed=pred.model.codec_embedding[j - 1].weight)

    predict_residuals(talker, fused["predictor"], s, c0_in, choose_residual)
    # The sum of the 16 rows is residual_embedding_sum's; the angles of RoPE are looked up, not computed (the
    # table is the same elementwise ops over every position, so the values are the same bits).
    x, cos, sin = ks.talker_input(s.embeds, s.trailing, s.trailing_start, s.t, s.trailing_last, s.rope_table, s.pos)
    # Each row sees its own positions 0..pos: [B, 1, 1, window] broadcasts over heads and the query.
    bias = None if window is None else position_bias(s.pos, s.batch, window, x.dtype)
    out = fused["talker"].step(x[:, None], s.cache, s.pos, bias, (cos, sin), final_norm=False, share=s.share)
    norm = fused["talker"].stack.norm
    ks.frame_tail(out[:, 0], norm.weight, norm.eps, s.hidden, s.finished, s.valid, s.t, s.limit, s.pos)


class GraphedFrames:
    """Frame runner (see engine.decode) that replays captured whole-frame graphs."""

    def __init__(self, talker, max_seq_len: int, capture: bool = True, kernels=None):
        self.talker = talker
        self.kernels = kernels
        self.fused = {"talker": FusedStack(talker.model, self.kernels),
                      "predictor": FusedStack(talker.code_predictor.model, self.kernels),
                      "projected": projected_tables(talker)}
        # The talker's attention kernel reads each row's length on the device: one frame graph a bucket for
        # every position, instead of one a WINDOW_STEP window (engine/kernels/attention.plan's device_length).
        self.device_length = "attention" in self.fused["talker"].ks.active
        self.max_seq_len = max_seq_len
        # trailing_table holds at most max_frames + 1 <= max_seq_len + 1 rows per row
        self.trailing_rows = max_seq_len + 1
        self.capture_enabled = capture
        self.states: dict[int, FrameState] = {}
        self.graphs: dict[tuple[int, int | None], torch.cuda.CUDAGraph] = {}  # (bucket, window; None: any)
        # (bucket, rows) -> the first `rows` rows of that bucket's state (FrameState.head), and the graph over them
        # (captured with the Triton attention only: the torch attention's windows would multiply the graphs)
        self.views: dict[tuple[int, int], FrameState] = {}
        self.nested: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.stepped = 0  # rows the last frame stepped (a view's, or the whole bucket's)
        self.pool = None
        self.capture_seconds = 0.0  # frame graphs, whenever captured
        self.precapture_seconds = 0.0  # everything precapture() captured at load
        self.late_captures = 0  # frame graphs captured while a request ran (windows: the torch attention only)
        self.prefill_graphs = None  # PrefillGraphs once precapture() ran
        self.precapture_window = 0  # windows captured per bucket up front (set by precapture())
        self.warm_buckets = ()  # the buckets precapture() captured: smaller runs use them (buckets.bucket_for)
        self.share_prompts = False  # set by open(): takes of one prompt read its K/V from one row's copy
        self.rope_table = None  # the talker's (cos, sin_signed) of every cache position, made with the first state

    @property
    def active_kernels(self) -> list:
        return list(self.kernels.active) if self.kernels else []

    @property
    def finished(self) -> torch.Tensor:
        return self.s.finished[: self.slots]

    def release(self) -> None:
        self.graphs.clear()
        self.nested.clear()
        self.views.clear()
        self.states.clear()
        self.rope_table = None
        self.pool = None
        if self.prefill_graphs is not None:
            self.prefill_graphs.release()
            self.prefill_graphs = None
        if self.kernels is not None:
            self.kernels.counters.release()  # after the graphs that baked their addresses

    @property
    def reach(self) -> str:
        """The positions each bucket's graphs captured at its first use serve (notes and logs)."""
        if self.device_length:
            return f"each for every position up to {self.max_seq_len}"
        return f"windows up to {self.precapture_window} positions"

    def _window(self, position: int) -> int | None:
        """The attention window a frame at `position` runs in (its graph's key); None: every position."""
        if self.device_length:
            return None
        return min(self.max_seq_len, (position // WINDOW_STEP + 1) * WINDOW_STEP)

    def _state(self, bucket: int) -> FrameState:
        if bucket not in self.states:
            state = FrameState(self.talker, bucket, self.max_seq_len, self.trailing_rows)
            dtype = state.hidden.dtype
            state.pred_rope = [self.fused["predictor"].rope(p, dtype) for p in state.pred_pos]
            if self.rope_table is None:  # one table for every bucket (read only)
                self.rope_table = self.fused["talker"].rope(torch.arange(self.max_seq_len, device=state.pos.device),
                                                            dtype)
            state.rope_table = self.rope_table
            self.states[bucket] = state
        return self.states[bucket]

    def precapture(self, buckets, max_window: int) -> None:
        """Capture, before any request, the prefill graphs (engine/gpu/prefill_graph.py) and the frame graphs
        of `buckets` for every attention window up to `max_window` positions, so requests that fit replay
        only. A frame graph captured over a state no row was admitted to runs on zeros: harmless, every
        buffer it touches is rewritten by open() and admit()."""
        from .prefill_graph import PrefillGraphs

        if not self.capture_enabled:
            return
        t0 = time.perf_counter()
        if self.prefill_graphs is None:  # written straight into the one-take cache (no copy for 1 take)
            self.prefill_graphs = PrefillGraphs(self.talker, cache=self._state(1).cache, fused=self.fused["talker"])
        self.prefill_graphs.capture_all()
        self.precapture_window = max_window
        self.warm_buckets = tuple(buckets)
        for bucket in buckets:
            self._capture_windows(bucket)
        self.precapture_seconds = time.perf_counter() - t0

    def _capture_windows(self, bucket: int) -> None:
        """The frame graphs of `bucket` rows for every window up to the precapture window (one graph where the
        attention reads the lengths on the device)."""
        self.s = self._state(bucket)
        last = min(self.precapture_window, self.max_seq_len)
        for window in [None] if self.device_length else range(WINDOW_STEP, last + 1, WINDOW_STEP):
            self._graph(window)
        if self.device_length:
            self._capture_nested(bucket)

    def _capture_nested(self, bucket: int) -> None:
        """The graphs over the first 1, 2, 4, ... rows of `bucket`'s state."""
        root = self.states[bucket]
        for rows in (b for b in BATCH_BUCKETS if b < bucket and (bucket, b) not in self.nested):
            t0 = time.perf_counter()
            view, saved = self._view(bucket, rows), root.snapshot()
            self.nested[(bucket, rows)], _ = capture(lambda v=view: frame_body(self.talker, self.fused, v, None),
                                                     self.pool)
            root.restore(saved)
            self.capture_seconds += time.perf_counter() - t0

    def open(self, *, slots: int, params, eos_id: int, max_len: int, refills: bool = True) -> None:
        """refills: a slot may be prefilled again during this run (more rows than slots). Then no row reads
        another's prompt K/V, since that copy could be overwritten while the row still reads it."""
        bucket = bucket_for(slots, {b for b, _ in self.graphs}, self.warm_buckets)
        if max_len > self.max_seq_len:
            raise ValueError("prompt + frames exceed the static cache")  # Engine.prepare caps this first
        if self.prefill_graphs is not None and (bucket, self._window(0)) not in self.graphs:
            # The first request of a new takes count captures all its windows here, before its prefill,
            # instead of one window at a time between its frames (a stall in the middle of its audio). With
            # the torch attention, windows past the precapture window are still captured when first reached.
            t0 = time.perf_counter()
            self._capture_windows(bucket)
            log.info("frame graphs: captured the %d-row graphs (%s) in %.2f s", bucket, self.reach,
                     time.perf_counter() - t0)
        s = self.s = self._state(bucket)
        self.slots = slots
        s.finished.fill_(True)  # every slot is empty until a row is admitted (padding rows stay so)
        s.valid.zero_()
        s.limit.zero_()
        s.t.zero_()
        s.pos.zero_()
        s.share[0].copy_(s.rows)
        s.share[1].zero_()
        self.stepped = s.batch
        self.share_prompts = not refills
        s.set_eos(eos_id)
        self.params = params

    def admit(self, slots: list, prompt, keys: torch.Tensor, max_frames: int, params=None) -> None:
        """Prefill `prompt` into rows `slots` (its takes) and reset their per-row state; `params` (default: the
        loop's) are these rows' sampling settings. Nothing here waits for the GPU: the host goes on to queue
        the first frames while the prefill runs."""
        s = self.s
        idx = s.index(slots)
        hidden = self.prefill_graphs.run(prompt, s.cache, slots) if self.prefill_graphs is not None else None
        if hidden is None:  # no prefill graph holds this prompt length (or capture is off)
            hidden = prefill_into(self.talker, prompt, s.cache, slots)
        n = len(slots)
        length = prompt.prefill.shape[1]
        s.hidden.index_copy_(0, idx, hidden.expand(n, -1))
        s.pos.index_fill_(0, idx, length)
        if self.share_prompts and n > 1:  # every take reads the prompt's K/V from the first's copy
            s.share[0].index_fill_(0, idx, slots[0])
            s.share[1].index_fill_(0, idx, length)
        # else each row keeps reading its own copy, as open() left it: without refills no slot is admitted twice
        s.t.index_fill_(0, idx, 0)
        s.limit.index_fill_(0, idx, max_frames)
        s.keys.index_copy_(0, idx, keys.to(s.keys.device))
        s.seen.index_fill_(0, idx, False)
        s.finished.index_fill_(0, idx, False)
        s.settings.write(slots, params or self.params)
        table = trailing_table(prompt, max_frames)
        for slot in slots:
            s.trailing[slot * s.trailing_rows: slot * s.trailing_rows + table.shape[0]] = table
        s.trailing_last.index_fill_(0, idx, table.shape[0] - 1)

    def retire(self, slots: list) -> None:
        """Rows `slots` were given up by their caller: they stop as finished rows do (no more valid frames, their
        positions no longer advance) until the slots are admitted again."""
        self.s.finished.index_fill_(0, self.s.index(slots), True)

    def _graph(self, window: int | None) -> torch.cuda.CUDAGraph:
        key = (self.s.batch, window)
        if key not in self.graphs:
            t0 = time.perf_counter()
            s = self.s
            saved = s.snapshot()
            self.graphs[key], _ = capture(lambda: frame_body(self.talker, self.fused, s, window), self.pool)
            if self.pool is None:
                self.pool = self.graphs[key].pool()
            s.restore(saved)  # warm-up steps must not advance the real state
            self.capture_seconds += time.perf_counter() - t0
        return self.graphs[key]

    def next_frame(self, host):
        window = self._window(max(host.positions()))  # the longest row's next position
        view = self._held(host)
        if view is not None and not self.capture_enabled:
            frame_body(self.talker, self.fused, view, window)
        elif view is not None and (self.s.batch, view.batch) in self.nested:
            self.nested[(self.s.batch, view.batch)].replay()
        elif self.capture_enabled:
            if self.prefill_graphs is not None and (self.s.batch, window) not in self.graphs:
                self.late_captures += 1  # after load: this request pays a capture
                log.info("frame graphs: capturing %d rows x %s-position window during a request",
                         self.s.batch, window)
            self._graph(window).replay()
        else:
            frame_body(self.talker, self.fused, self.s, window)
        return self.s.frame[: self.slots].clone(), self.s.valid[: self.slots].clone()

    def _view(self, bucket: int, rows: int) -> FrameState:
        if (bucket, rows) not in self.views:
            self.views[(bucket, rows)] = self.states[bucket].head(rows)
        return self.views[(bucket, rows)]

    def _held(self, host) -> FrameState | None:
        """The view of the rows held (held rows sit in the lowest slots), or None when they need the whole bucket.
        Slots it leaves out are empty; their valid flags are cleared as they drop out, so a frame there never
        reads as speech."""
        s = self.s
        rows = min(batch_bucket(host.held_span()), s.batch)
        if rows < self.stepped:
            s.valid[rows: self.stepped].zero_()
        self.stepped = rows
        return self._view(s.batch, rows) if rows < s.batch else None
