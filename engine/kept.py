"""What is made once and used again, kept by key for the few keys used last (the least recently used is dropped
first): an ICL reference's prompt embeddings, the codec state after a reference, a saved voice read from its file."""
from __future__ import annotations

from collections import OrderedDict


class Kept:
    """At most `size` values by key. `get` counts its finds in `hits`; `put` replaces the key's own entry."""

    def __init__(self, size: int):
        self.size = size
        self.hits = 0
        self._values: OrderedDict = OrderedDict()

    def get(self, key, default=None):
        if key not in self._values:
            return default
        self._values.move_to_end(key)
        self.hits += 1
        return self._values[key]

    def put(self, key, value):
        """Keep `value` under `key` (returned), dropping the least recently used past `size`."""
        self._values.pop(key, None)
        self._values[key] = value
        if len(self._values) > self.size:
            self._values.popitem(last=False)
        return value

    def clear(self) -> None:
        self._values.clear()

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, key) -> bool:
        return key in self._values
