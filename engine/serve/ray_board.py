"""The replicas' stats board for /health under `serve --ray`: a small Ray actor that each replica posts its
scheduler's stats to, and the front reads.

A call to a replica cannot carry them: a replica that holds its max_ongoing_requests takes no other call until
one ends, and that is exactly when /health should show it. Posting costs one small message per change (at most
every POST_EVERY_S) and a heartbeat; a replica not heard from for STALE_S is left out (it stopped or is stuck).
"""
from __future__ import annotations

import threading
import time

NAMESPACE = "qwen3tts"
POST_EVERY_S = 0.2
HEARTBEAT_S = 2.0
STALE_S = 3 * HEARTBEAT_S


class ReplicaBoard:
    """The actor's class (made remote by the front, which owns it: it ends with the front)."""

    def __init__(self):
        self._stats: dict = {}  # replica name -> (monotonic time of its last post, its stats)

    def post(self, name: str, stats: dict) -> None:
        self._stats[name] = (time.monotonic(), stats)

    def read(self) -> list:
        now = time.monotonic()
        return sorted((stats for at, stats in self._stats.values() if now - at < STALE_S),
                      key=lambda s: s["replica"])


def create(name: str):
    """The board actor `name`, started by the front (no CPU of its own: it only holds a dict)."""
    import ray

    return ray.remote(num_cpus=0)(ReplicaBoard).options(name=name, namespace=NAMESPACE).remote()


class Poster:
    """A replica's thread that posts `stats()` to the board `board_name` on each change and as a heartbeat."""

    def __init__(self, board_name: str, name: str, stats):
        self._board_name, self._name, self._stats = board_name, name, stats
        self._stop = threading.Event()
        threading.Thread(target=self._run, name="qwen3tts-stats-poster", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        import ray

        try:
            board = ray.get_actor(self._board_name, namespace=NAMESPACE)
        except ValueError:  # no board: a front that shows no per-replica stats
            return
        last, sent_at = None, 0.0
        while not self._stop.wait(POST_EVERY_S):
            stats = self._stats()
            if stats != last or time.monotonic() - sent_at >= HEARTBEAT_S:
                board.post.remote(self._name, stats)
                last, sent_at = stats, time.monotonic()
