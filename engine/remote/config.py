"""RemoteConfig: where a speech server is and the limits it reported. Light to import (no torch), so the nodes'
engine cache can tell a remote configuration from a local one without loading the engine."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RemoteConfig:
    """How to reach a server, and the limits it reported: hashable, the key of the nodes' engine cache."""

    url: str
    api_key: str | None = field(default=None, repr=False)
    max_takes: int = 4
    max_seq_len: int = 4096

    @property
    def model_dir(self) -> str:  # where local configurations name their checkpoint
        return self.url
