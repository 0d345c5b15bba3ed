"""One engine replica of `serve --ray`: a Ray Serve deployment class holding one Engine and its Scheduler.

The class is plain Python (engine/serve/ray_backend.py wraps it with `serve.deployment`), so this module
imports no Ray. What crosses between the front and a replica is small and picklable: a Request (its voice as
CPU tensors), the model card, and each chunk as a `Piece` of float32 numpy audio and int codes.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

from ..errors import Qwen3TTSError


class Piece(NamedTuple):
    """One engine Chunk, as it travels from a replica to the front."""

    take: int
    audio: object  # numpy float32 [k * 1920]
    codes: object  # numpy int [k, 16]
    index: int
    final: bool
    elapsed_s: float


def _replica_name() -> str:
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # noqa: BLE001 - outside a Serve replica (a direct test): no name to give
        return "local"


class EngineReplica:
    """Load the checkpoint with the server's load options and serve it through one Scheduler of `max_rows`
    rows, whose loop lets waiting requests join every `boundary_frames` frames. A load error is kept, not raised: Ray Serve would retry a failing constructor, while the front asks
    every replica's card() first and shows the load error once."""

    def __init__(self, model_dir: str, load: dict, max_rows: int, max_queue: int, boundary_frames: int,
                 board: str | None = None):
        from ..engine import Engine
        from ..scheduler import Scheduler

        self.name = _replica_name()
        self.load_error: Qwen3TTSError | None = None
        self.engine = self.scheduler = None
        self.served = 0  # requests that reached the scheduler
        try:
            self.engine = Engine.load(model_dir, max_takes=max_rows, warm_takes=max_rows, **load)
        except Qwen3TTSError as exc:
            self.load_error = exc
            return
        self.scheduler = Scheduler(self.engine, max_rows=max_rows, max_queue=max_queue, chunk_frames=boundary_frames)
        self.poster = None
        if board is not None:  # /health's per-replica stats (engine/serve/ray_board.py)
            from .ray_board import Poster

            self.poster = Poster(board, self.name, self.current_stats)

    def _loaded(self):
        if self.load_error is not None:
            raise self.load_error
        return self.engine

    async def card(self) -> dict:
        """What the front's ServedModel needs, with the model config that checks a voice's fit."""
        from pathlib import Path

        from ..prompt import MODE_OF_MODEL

        engine = self._loaded()
        return {"id": Path(engine.config.model_dir).name, "model_type": engine.model_type,
                "mode": MODE_OF_MODEL[engine.model_type], "speakers": list(engine.speakers or []),
                "languages": list(engine.languages or []), "defaults": engine.defaults, "cfg": engine.cfg,
                "random_weights": engine.info.random_weights, "summary": engine.info.summary(),
                "info": engine.info, "max_seq_len": engine.config.max_seq_len}

    def current_stats(self) -> dict:
        """This replica's scheduler: waiting and running requests, rows in use, slots; requests served."""
        if self.scheduler is None:
            return {"replica": self.name, "error": str(self.load_error)}
        stats = self.scheduler.stats()
        return {"replica": self.name, **{k: stats[k] for k in ("waiting", "running", "rows", "slots")},
                "served": self.served}

    async def stream(self, request, options: dict):
        """The request's chunks as Pieces. A caller that cancels (the front's client left) ends this
        generator with CancelledError, whose `finally` cancels the engine ticket: its rows leave the decode
        loop at the next chunk boundary."""
        self._loaded()
        ticket = await self.scheduler.submit_async(request, **options)
        self.served += 1
        try:
            async for chunk in ticket:
                yield Piece(chunk.take, chunk.audio.numpy(), chunk.codes.numpy(), chunk.index, chunk.final,
                            chunk.elapsed_s)
        finally:
            ticket.cancel()

    async def extract_voice(self, waveform, sample_rate: int, ref_text: str | None):
        """A voice from uploaded audio, made beside the decode loop (speaker and codec encoders only) in a worker
        thread, returned with CPU tensors so that it unpickles on a front without a GPU."""
        engine = self._loaded()
        voice = await self.scheduler.run_beside(engine.extract_voice_beside_decode, waveform, sample_rate, ref_text)
        cpu = {f.name: getattr(voice, f.name).cpu() for f in dataclasses.fields(voice)
               if hasattr(getattr(voice, f.name), "cpu")}
        return dataclasses.replace(voice, **cpu)

    async def stats(self) -> dict:
        return self.current_stats()

    def __del__(self):
        if getattr(self, "poster", None) is not None:
            self.poster.stop()
        if self.scheduler is not None:
            self.scheduler.close(timeout=5)
